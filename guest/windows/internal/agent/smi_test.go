package agent

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestSMICandidatesOrder(t *testing.T) {
	got := SMICandidates(`C:\Windows`, `C:\Program Files`)
	want := []string{filepath.Join(`C:\Windows`, "System32", "nvidia-smi.exe"),
		filepath.Join(`C:\Program Files`, "NVIDIA Corporation", "NVSMI", "nvidia-smi.exe"), ""}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q", got)
	}
	dir := t.TempDir()
	sys32 := filepath.Join(dir, "System32", "nvidia-smi.exe")
	nvsmi := filepath.Join(dir, "NVSMI", "nvidia-smi.exe")
	t.Setenv("PATH", t.TempDir())
	if FindSMI([]string{sys32, nvsmi, ""}) != "" {
		t.Fatal("none present")
	}
	writeExe(t, nvsmi, "#!/bin/sh\n")
	if FindSMI([]string{sys32, nvsmi, ""}) != nvsmi {
		t.Fatal("NVSMI when System32 has none")
	}
	writeExe(t, sys32, "#!/bin/sh\n")
	if FindSMI([]string{sys32, nvsmi, ""}) != sys32 {
		t.Fatal("System32 first")
	}
	onPath := filepath.Join(dir, "bin", "nvidia-smi")
	writeExe(t, onPath, "#!/bin/sh\n")
	t.Setenv("PATH", filepath.Dir(onPath))
	if FindSMI([]string{filepath.Join(dir, "x"), ""}) != onPath {
		t.Fatal("PATH last")
	}
}

func writeExe(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestCollectSMI(t *testing.T) {
	fx := fixtures(t)
	exe := filepath.Join(t.TempDir(), "nvidia-smi")
	writeExe(t, exe, `#!/bin/sh
case "$*" in
"-q -x") [ -n "$XML_FAIL" ] && exit 9; cat "`+fx+`/smi-qx-licensed-l40s-2q-trimmed.xml" ;;
"-q") [ -n "$TEXT_BIG" ] && head -c 400001 /dev/zero && exit 0; cat "`+fx+`/smi-q-unlicensed-restricted-vcs.txt" ;;
esac
`)
	var r Report
	CollectSMI(context.Background(), exe, &r)
	if r.SMIStatus != SMIOK || string(r.SMIXML) != string(fixture(t, "smi-qx-licensed-l40s-2q-trimmed.xml")) {
		t.Fatalf("xml: %s", r.SMIStatus)
	}
	t.Setenv("XML_FAIL", "1")
	r = Report{}
	CollectSMI(context.Background(), exe, &r)
	if r.SMIStatus != SMIOK || r.SMIXML != nil || string(r.SMIText) != string(fixture(t, "smi-q-unlicensed-restricted-vcs.txt")) {
		t.Fatalf("text fallback: %s", r.SMIStatus)
	}
	t.Setenv("TEXT_BIG", "1")
	r = Report{}
	CollectSMI(context.Background(), exe, &r)
	if r.SMIStatus != SMIFailed || r.SMIText != nil {
		t.Fatalf("oversized output: %s", r.SMIStatus)
	}
	r = Report{}
	CollectSMI(context.Background(), "", &r)
	if r.SMIStatus != SMIMissing {
		t.Fatal("missing")
	}
}
