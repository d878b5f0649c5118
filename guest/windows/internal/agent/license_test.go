package agent

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestFeatureType(t *testing.T) {
	for conf, want := range map[string]string{
		"FeatureType=1\n":                        "1",
		"# FeatureType=4\nFeatureType = 2\r\n":   "2",
		"FeatureType=0\nFeatureType=4\n":         "4",
		"ServerAddress=x\n":                      "nil",
		"":                                       "nil",
		"FeatureType=3\n":                        "error",
		"FeatureType=one\n":                      "error",
		"FeatureType=-1\n":                       "error",
		"EnableUI=FALSE\nFeatureType=4\n# end\n": "4",
	} {
		v, err := FeatureType([]byte(conf))
		got := "nil"
		switch {
		case err != nil:
			got = "error"
		case v != nil:
			got = fmt.Sprint(*v)
		}
		if got != want {
			t.Errorf("%q: got %s want %s", conf, got, want)
		}
	}
	if o := OtherSettings([]byte("# c\nFeatureType=1\nEnableUI=FALSE\n ServerPort = 7070\n")); strings.Join(o, ",") != "EnableUI,ServerPort" {
		t.Errorf("other settings %v", o)
	}
}

func TestParseLicense(t *testing.T) {
	files := volumeFiles()
	l, err := ParseLicense(files)
	if err != nil || l.FeatureType == nil || *l.FeatureType != 1 || l.Report == nil {
		t.Fatalf("%v %v", l, err)
	}
	if l.Report.URL != "http://127.0.0.1:9/v1/reports" || l.Report.Namespace != "tenant-foo" || l.Report.CA != nil {
		t.Fatalf("report %v", l.Report)
	}
	for _, s := range []string{l.String(), l.Report.String(), fmt.Sprintf("%v %+v", l, l.Report)} {
		if strings.Contains(s, "eyJ") || strings.Contains(s, "abcdef") {
			t.Errorf("secret in %q", s)
		}
	}
	for _, k := range []string{KeyToken, KeyGriddConf} {
		bad := volumeFiles()
		delete(bad, k)
		if _, err := ParseLicense(bad); !errors.Is(err, ErrBadContent) {
			t.Errorf("without %s: %v", k, err)
		}
		bad = volumeFiles()
		bad[k] = []byte(" \n")
		if _, err := ParseLicense(bad); !errors.Is(err, ErrBadContent) {
			t.Errorf("empty %s: %v", k, err)
		}
	}
	bad := volumeFiles()
	bad[KeyGriddConf] = []byte("FeatureType=5\n")
	if _, err := ParseLicense(bad); !errors.Is(err, ErrBadContent) {
		t.Errorf("FeatureType 5: %v", err)
	}
}

func TestParseReportTarget(t *testing.T) {
	for name, change := range map[string][2]string{
		"no url":        {KeyReportURL, ""},
		"ftp url":       {KeyReportURL, "ftp://x/"},
		"bare scheme":   {KeyReportURL, "https://"},
		"namespace":     {KeyNamespace, "Tenant_Foo"},
		"credential":    {KeyCredential, "abc def=="},
		"no credential": {KeyCredential, ""},
	} {
		files := volumeFiles()
		files[change[0]] = []byte(change[1])
		if _, err := ParseReportTarget(files); !errors.Is(err, ErrNotConfigured) {
			t.Errorf("%s: %v", name, err)
		} else if strings.Contains(err.Error(), "abcdef") {
			t.Errorf("%s: credential in %q", name, err)
		}
		// A license without usable report settings is still installed.
		if l, err := ParseLicense(files); err != nil || l.Report != nil {
			t.Errorf("%s: license %v %v", name, l, err)
		}
	}
	files := volumeFiles()
	files[KeyReportURL] = []byte(" https://licensectl.example/v1/reports\r\n")
	files[KeyReportCA] = []byte("-----BEGIN CERTIFICATE-----\n")
	tg, err := ParseReportTarget(files)
	if err != nil || tg.URL != "https://licensectl.example/v1/reports" || tg.CA == nil {
		t.Fatalf("%v %v", tg, err)
	}
}
