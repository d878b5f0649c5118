package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// fixtures is the repository's recorded NVIDIA output (tests/fixtures/nvidia, provenance in its README).
func fixtures(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "tests", "fixtures", "nvidia")
}

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(fixtures(t), name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// buildISO makes an image the way KubeVirt builds a Secret volume: xorrisofs with a volume label,
// Joliet and Rock Ridge, one file per key. A missing xorrisofs fails the test (never skips).
func buildISO(t *testing.T, label string, files map[string][]byte, extra ...string) string {
	t.Helper()
	xorrisofs, err := exec.LookPath("xorrisofs")
	if err != nil {
		t.Fatal("xorrisofs is needed (Debian package xorriso; scripts/install-system-deps installs it)")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(src, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "volume.iso")
	args := append([]string{"-quiet", "-output", out, "-volid", label}, extra...)
	cmd := exec.Command(xorrisofs, append(args, src)...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("xorrisofs: %v: %s", err, msg)
	}
	return out
}
