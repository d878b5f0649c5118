package agent

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"
)

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

func TestInstallTokenTransactionally(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ClientConfigToken")
	old, cur := []byte("old-token"), []byte("new-token")
	res, err := InstallToken(dir, old)
	if err != nil || !res.Changed {
		t.Fatalf("%+v %v", res, err)
	}
	foreign := filepath.Join(dir, "client_configuration_token_01-02-2026-10-00-00.tok")
	if err := os.WriteFile(foreign, []byte("portal"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err = InstallToken(dir, old)
	if err != nil || res.Changed || len(res.Removed) != 0 {
		t.Fatalf("same token again: %+v %v", res, err)
	}
	if !reflect.DeepEqual(res.Foreign, []string{filepath.Base(foreign)}) {
		t.Fatalf("foreign %v", res.Foreign)
	}
	res, err = InstallToken(dir, cur)
	if err != nil || !res.Changed || !reflect.DeepEqual(res.Removed, []string{TokenName(old)}) {
		t.Fatalf("rotation: %+v %v", res, err)
	}
	want := []string{filepath.Base(foreign), TokenName(cur)}
	sort.Strings(want)
	if got := listDir(t, dir); !reflect.DeepEqual(got, want) {
		t.Fatalf("folder %v want %v (no temporary file left)", got, want)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, TokenName(cur))); string(data) != "new-token" {
		t.Fatalf("content %q", data)
	}
	if InstalledTokenSHA(dir) != SHA256Hex(cur) {
		t.Fatal("installed hash")
	}
	// A damaged copy under the right name is rewritten.
	if err := os.WriteFile(filepath.Join(dir, TokenName(cur)), []byte("damaged"), 0o644); err != nil {
		t.Fatal(err)
	}
	if res, err := InstallToken(dir, cur); err != nil || !res.Changed {
		t.Fatalf("repair: %+v %v", res, err)
	}
	removed, err := RemoveOwnTokens(dir)
	if err != nil || !reflect.DeepEqual(removed, []string{TokenName(cur)}) {
		t.Fatalf("uninstall: %v %v", removed, err)
	}
	if got := listDir(t, dir); !reflect.DeepEqual(got, []string{filepath.Base(foreign)}) {
		t.Fatalf("after uninstall %v", got)
	}
	if InstalledTokenSHA(dir) != "none" {
		t.Fatal("no own token: none")
	}
}

func TestInstalledTokenSHAWithSeveralIsNone(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"licensectl_a.tok", "licensectl_b.tok"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if InstalledTokenSHA(dir) != "none" || InstalledTokenSHA(filepath.Join(dir, "missing")) != "none" {
		t.Fatal("several or no folder: none")
	}
	if TokenName([]byte("x")) != "licensectl_2d711642b726b044.tok" {
		t.Fatal(TokenName([]byte("x")))
	}
}
