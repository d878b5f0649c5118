package agent

// The report body: the same envelope as the Linux probe (docs/guest.md, "Wire format", version 2),
// plus `os: windows` and the guest's UTC offset, since the Windows licensing log writes local times
// without a zone.

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"
	"unicode/utf16"
)

// Version is the agent's probe-version.
const Version = "1.0.0"

// Bounds, as the Linux probe's.
const (
	SMIMaxBytes    = 400000
	smiLineChars   = 4096
	logLineChars   = 1024
	DefaultLogTail = 50
	logReadBytes   = 256 * 1024
)

// SMI statuses of the report's nvidia-smi header.
const (
	SMIOK      = "ok"
	SMIMissing = "missing"
	SMIFailed  = "failed"
)

// Report is what one probe pass collected.
type Report struct {
	UUID        string
	Hostname    string
	Clock       time.Time
	TokenSHA256 string // "none" when no agent token is installed
	SMIStatus   string
	SMIXML      []byte // with SMIStatus ok: `nvidia-smi -q -x`
	SMIText     []byte // with SMIStatus ok when the XML form failed: `nvidia-smi -q`
	LogLines    []string
}

var hostnameDrop = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// CleanHostname keeps what the report accepts (as the Linux probe does).
func CleanHostname(h string) string {
	h = hostnameDrop.ReplaceAllString(h, "")
	if len(h) > 253 {
		h = h[:253]
	}
	return h
}

// UTCOffset formats the zone offset of t as +HH:MM / -HH:MM.
func UTCOffset(t time.Time) string {
	_, secs := t.Zone()
	sign := '+'
	if secs < 0 {
		sign, secs = '-', -secs
	}
	return fmt.Sprintf("%c%02d:%02d", sign, secs/3600, secs%3600/60)
}

// sanitize keeps printable ASCII and tabs, bounds each line and shifts lines that would read as
// section markers: the body must be UTF-8 and no content line may end a section.
func sanitize(w *bytes.Buffer, text []byte, maxLine int) {
	for _, line := range strings.Split(strings.TrimRight(string(text), "\r\n"), "\n") {
		var b strings.Builder
		for i := 0; i < len(line); i++ {
			c := line[i]
			if c == '\t' || c >= 0x20 && c <= 0x7e {
				b.WriteByte(c)
			}
		}
		s := b.String()
		if strings.HasPrefix(s, "---") {
			s = " " + s
		}
		if len(s) > maxLine {
			s = s[:maxLine]
		}
		w.WriteString(s)
		w.WriteByte('\n')
	}
}

// Body renders the report.
func (r *Report) Body() []byte {
	var w bytes.Buffer
	fmt.Fprintf(&w, "licensectl-report: 2\nuuid: %s\nhostname: %s\nclock: %d\ntoken-sha256: %s\n",
		r.UUID, CleanHostname(r.Hostname), r.Clock.Unix(), r.TokenSHA256)
	fmt.Fprintf(&w, "probe-version: %s\nnvidia-smi: %s\nos: windows\nutc-offset: %s\n",
		Version, r.SMIStatus, UTCOffset(r.Clock))
	switch {
	case r.SMIStatus == SMIOK && len(r.SMIXML) > 0:
		w.WriteString("--- nvidia-smi-xml\n")
		sanitize(&w, r.SMIXML, smiLineChars)
	case r.SMIStatus == SMIOK && len(r.SMIText) > 0:
		w.WriteString("--- nvidia-smi-text\n")
		sanitize(&w, r.SMIText, smiLineChars)
	}
	if len(r.LogLines) > 0 {
		w.WriteString("--- gridd-log\n")
		sanitize(&w, []byte(strings.Join(r.LogLines, "\n")), logLineChars)
	}
	w.WriteString("--- end\n")
	return w.Bytes()
}

// DecodeLog turns the log's bytes into text: UTF-16 with a byte-order mark, else UTF-8/ASCII
// (which encoding the driver writes is not documented; both are handled).
func DecodeLog(b []byte) string {
	le := bytes.HasPrefix(b, []byte{0xff, 0xfe})
	be := bytes.HasPrefix(b, []byte{0xfe, 0xff})
	if !le && !be {
		return string(bytes.TrimPrefix(b, []byte{0xef, 0xbb, 0xbf}))
	}
	b = b[2:]
	u := make([]uint16, 0, len(b)/2)
	for i := 0; i+1 < len(b); i += 2 {
		if le {
			u = append(u, uint16(b[i])|uint16(b[i+1])<<8)
		} else {
			u = append(u, uint16(b[i])<<8|uint16(b[i+1]))
		}
	}
	return string(utf16.Decode(u))
}

// TailLog returns the last n non-empty lines of the log file (reading at most its last 256 KiB).
func TailLog(path string, n int) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	start := int64(0)
	if st.Size() > logReadBytes {
		start = st.Size() - logReadBytes
	}
	head := make([]byte, 2)
	_, _ = f.ReadAt(head, 0)
	buf, err := io.ReadAll(io.NewSectionReader(f, start, st.Size()-start))
	if err != nil {
		return nil, err
	}
	if start > 0 && (bytes.Equal(head, []byte{0xff, 0xfe}) || bytes.Equal(head, []byte{0xfe, 0xff})) {
		buf = append(head, buf[start%2:]...) // keep UTF-16 code units aligned
	}
	text := DecodeLog(buf)
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	if start > 0 && len(lines) > 0 {
		lines = lines[1:] // the first line is cut
	}
	var out []string
	for _, l := range lines {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return out, nil
}
