package agent

// What the license volume delivers, validated as the Linux scripts validate it (docs/guest.md,
// "The license volume"), and the FeatureType that gridd.conf sets.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// File names on the license volume: the replica Secret's keys.
const (
	KeyToken      = "client_configuration_token.tok"
	KeyGriddConf  = "gridd.conf"
	KeyReportURL  = "report-url"
	KeyNamespace  = "report-namespace"
	KeyCredential = "report-credential"
	KeyReportCA   = "report-ca.crt"
)

// ErrBadContent is a volume whose token or gridd.conf is missing, empty or too large.
var ErrBadContent = errors.New("bad license volume content")

// ErrNotConfigured is a volume without a usable report URL, namespace or credential.
var ErrNotConfigured = errors.New("report not configured")

// License is the validated content of a license volume. Token and Credential are secrets: they
// are never formatted into a message (String hides them).
type License struct {
	Token       []byte
	GriddConf   []byte
	FeatureType *uint32 // nil: gridd.conf sets none
	Report      *ReportTarget
}

// ReportTarget is where and as whom the agent reports; nil when the volume does not say.
type ReportTarget struct {
	URL        string
	Namespace  string
	Credential string
	CA         []byte
}

// String never shows a secret.
func (l *License) String() string {
	return fmt.Sprintf("License{token %d bytes, gridd.conf %d bytes}", len(l.Token), len(l.GriddConf))
}

// String never shows the credential.
func (t *ReportTarget) String() string {
	return fmt.Sprintf("ReportTarget{%s, namespace %s}", t.URL, t.Namespace)
}

var (
	namespaceRE  = regexp.MustCompile(`^[a-z0-9-]{1,63}$`)
	credentialRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,512}$`)
)

func trimmed(b []byte) string {
	return strings.Map(func(r rune) rune {
		if r == ' ' || r == '\t' || r == '\r' || r == '\n' {
			return -1
		}
		return r
	}, string(b))
}

// ParseLicense validates a volume's files. A volume without report settings is still a license
// (Report nil); one with malformed report settings is ErrNotConfigured for the probe only.
func ParseLicense(files map[string][]byte) (*License, error) {
	l := &License{}
	for _, k := range []string{KeyToken, KeyGriddConf} {
		data, ok := files[k]
		if !ok {
			return nil, fmt.Errorf("%w: %s missing", ErrBadContent, k)
		}
		if data == nil || len(data) > MaxVolumeFile {
			return nil, fmt.Errorf("%w: %s larger than %d bytes", ErrBadContent, k, MaxVolumeFile)
		}
		if len(bytes.TrimSpace(data)) == 0 {
			return nil, fmt.Errorf("%w: %s empty", ErrBadContent, k)
		}
	}
	l.Token, l.GriddConf = files[KeyToken], files[KeyGriddConf]
	ft, err := FeatureType(l.GriddConf)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadContent, err)
	}
	l.FeatureType = ft
	l.Report, _ = ParseReportTarget(files)
	return l, nil
}

// ParseReportTarget checks the report settings as the Linux probe does.
func ParseReportTarget(files map[string][]byte) (*ReportTarget, error) {
	t := &ReportTarget{
		URL:        trimmed(files[KeyReportURL]),
		Namespace:  trimmed(files[KeyNamespace]),
		Credential: trimmed(files[KeyCredential]),
		CA:         files[KeyReportCA],
	}
	switch {
	case t.URL == "" || t.Namespace == "" || t.Credential == "":
		return nil, fmt.Errorf("%w: report-url, report-namespace or report-credential missing", ErrNotConfigured)
	case !(strings.HasPrefix(t.URL, "http://") && len(t.URL) > 7 || strings.HasPrefix(t.URL, "https://") && len(t.URL) > 8):
		return nil, fmt.Errorf("%w: report URL must be http(s)://...", ErrNotConfigured)
	case !namespaceRE.MatchString(t.Namespace):
		return nil, fmt.Errorf("%w: report namespace is malformed", ErrNotConfigured)
	case !credentialRE.MatchString(t.Credential):
		return nil, fmt.Errorf("%w: report credential is malformed", ErrNotConfigured)
	}
	if len(bytes.TrimSpace(t.CA)) == 0 {
		t.CA = nil
	}
	return t, nil
}

// FeatureType reads `FeatureType=N` from gridd.conf (the last one wins, as in a key=value file;
// comments and other keys ignored). Only NVIDIA's documented values 0, 1, 2 and 4 are accepted.
func FeatureType(conf []byte) (*uint32, error) {
	var out *uint32
	sc := bufio.NewScanner(bytes.NewReader(conf))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(key) != "FeatureType" {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(value), 10, 32)
		if err != nil || (n != 0 && n != 1 && n != 2 && n != 4) {
			return nil, fmt.Errorf("gridd.conf FeatureType must be 0, 1, 2 or 4")
		}
		v := uint32(n)
		out = &v
	}
	return out, sc.Err()
}

// OtherSettings names the gridd.conf keys besides FeatureType: the agent does not map them to the
// registry (their Windows names are not verified) and says so, by name only.
func OtherSettings(conf []byte) []string {
	var keys []string
	sc := bufio.NewScanner(bytes.NewReader(conf))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if key, _, ok := strings.Cut(line, "="); ok && strings.TrimSpace(key) != "FeatureType" {
			keys = append(keys, strings.TrimSpace(key))
		}
	}
	return keys
}
