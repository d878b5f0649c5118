package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// fakeSystem is an in-memory registry and a service that counts restarts.
type fakeSystem struct {
	values     map[string]uint32 // key\name -> value
	keys       map[string]bool
	restarts   int
	restartErr error
}

func newFakeSystem() *fakeSystem {
	return &fakeSystem{values: map[string]uint32{}, keys: map[string]bool{}}
}

func (f *fakeSystem) GetDWORD(key, name string) (uint32, bool, error) {
	v, ok := f.values[key+`\`+name]
	return v, ok, nil
}
func (f *fakeSystem) SetDWORD(key, name string, v uint32) error {
	f.values[key+`\`+name] = v
	f.keys[key] = true
	return nil
}
func (f *fakeSystem) DeleteValue(key, name string) error {
	delete(f.values, key+`\`+name)
	return nil
}
func (f *fakeSystem) KeyExists(key string) bool { return f.keys[key] }
func (f *fakeSystem) RestartService(context.Context, string) error {
	f.restarts++
	return f.restartErr
}

type memLog struct{ lines []string }

func (l *memLog) Info(m string)  { l.lines = append(l.lines, "info: "+m) }
func (l *memLog) Warn(m string)  { l.lines = append(l.lines, "warn: "+m) }
func (l *memLog) Error(m string) { l.lines = append(l.lines, "error: "+m) }

func testConfig(t *testing.T) *Config {
	dir := t.TempDir()
	return &Config{TokenDir: filepath.Join(dir, "ClientConfigToken"), StateDir: filepath.Join(dir, "state"),
		Service: DisplayService, LogLines: DefaultLogTail, LogFile: filepath.Join(dir, "none.log")}
}

func license(t *testing.T, token, conf string) *License {
	t.Helper()
	files := volumeFiles()
	files[KeyToken], files[KeyGriddConf] = []byte(token), []byte(conf)
	l, err := ParseLicense(files)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestInstallChangesOnlyWhatDiffers(t *testing.T) {
	cfg, sys, log := testConfig(t), newFakeSystem(), &memLog{}
	ctx := context.Background()
	res, err := Install(ctx, cfg, sys, license(t, "token-1", "FeatureType=1\n"), log)
	if err != nil || !res.TokenChanged || !reflect.DeepEqual(res.RegistryChanged, []string{RegGridLicensing}) ||
		!res.Restarted || sys.restarts != 1 {
		t.Fatalf("first: %+v %v", res, err)
	}
	if sys.values[RegGridLicensing+`\FeatureType`] != 1 {
		t.Fatal("FeatureType set")
	}
	res, err = Install(ctx, cfg, sys, license(t, "token-1", "FeatureType=1\n"), log)
	if err != nil || res.Changed() || res.Restarted || sys.restarts != 1 {
		t.Fatalf("nothing changed, nothing restarted: %+v %v", res, err)
	}
	res, err = Install(ctx, cfg, sys, license(t, "token-2", "FeatureType=1\n"), log)
	if err != nil || !res.TokenChanged || len(res.RegistryChanged) != 0 || sys.restarts != 2 {
		t.Fatalf("rotation: %+v %v", res, err)
	}
	res, err = Install(ctx, cfg, sys, license(t, "token-2", "FeatureType=4\n"), log)
	if err != nil || res.TokenChanged || len(res.RegistryChanged) != 1 || sys.restarts != 3 {
		t.Fatalf("FeatureType change: %+v %v", res, err)
	}
	res, err = Install(ctx, cfg, sys, license(t, "token-2", "# no FeatureType\n"), log)
	if err != nil || res.Changed() || sys.values[RegGridLicensing+`\FeatureType`] != 4 {
		t.Fatalf("a gridd.conf without FeatureType leaves the registry: %+v %v", res, err)
	}
	for _, l := range log.lines {
		if strings.Contains(l, "token-1") || strings.Contains(l, "token-2") {
			t.Fatalf("token bytes logged: %q", l)
		}
	}
}

func TestInstallWritesTheDriverKeyWhenTheDriverIsThere(t *testing.T) {
	cfg, sys := testConfig(t), newFakeSystem()
	sys.keys[RegDriverService] = true
	sys.values[RegDriverGridLicensing+`\FeatureType`] = 2
	res, err := Install(context.Background(), cfg, sys, license(t, "t", "FeatureType=1\n"), &memLog{})
	if err != nil || !reflect.DeepEqual(res.RegistryChanged, []string{RegGridLicensing, RegDriverGridLicensing}) {
		t.Fatalf("%+v %v", res, err)
	}
	// Uninstall: the driver key's value goes back to 2, the one the agent created goes away.
	if err := Uninstall(context.Background(), cfg, sys, &memLog{}); err != nil {
		t.Fatal(err)
	}
	want := map[string]uint32{RegDriverGridLicensing + `\FeatureType`: 2}
	if !reflect.DeepEqual(sys.values, want) || sys.restarts != 2 {
		t.Fatalf("after uninstall %v, %d restarts", sys.values, sys.restarts)
	}
	if entries, _ := os.ReadDir(cfg.TokenDir); len(entries) != 0 {
		t.Fatalf("tokens left: %v", entries)
	}
	if _, err := os.Stat(cfg.StateDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("state removed")
	}
	// A second uninstall has nothing to undo and restarts nothing.
	if err := Uninstall(context.Background(), cfg, sys, &memLog{}); err != nil || sys.restarts != 2 {
		t.Fatalf("second uninstall: %v, %d restarts", err, sys.restarts)
	}
}

func TestUninstallRestoresTheFirstValueNotAnIntermediateOne(t *testing.T) {
	cfg, sys := testConfig(t), newFakeSystem()
	sys.SetDWORD(RegGridLicensing, ValueFeatureType, 0)
	for _, conf := range []string{"FeatureType=1\n", "FeatureType=4\n"} {
		if _, err := Install(context.Background(), cfg, sys, license(t, "t", conf), &memLog{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := Uninstall(context.Background(), cfg, sys, &memLog{}); err != nil {
		t.Fatal(err)
	}
	if v, ok, _ := sys.GetDWORD(RegGridLicensing, ValueFeatureType); !ok || v != 0 {
		t.Fatalf("restored %d %v", v, ok)
	}
}

func TestInstallRestartFailureIsItsOwnError(t *testing.T) {
	cfg, sys := testConfig(t), newFakeSystem()
	sys.restartErr = fmt.Errorf("timeout")
	_, err := Install(context.Background(), cfg, sys, license(t, "t", "FeatureType=1\n"), &memLog{})
	if !errors.Is(err, ErrRestart) {
		t.Fatalf("%v", err)
	}
	if InstalledTokenSHA(cfg.TokenDir) != SHA256Hex([]byte("t")) {
		t.Fatal("files stay installed")
	}
}

func TestInstallWarnsAboutForeignTokensAndUnmappedSettings(t *testing.T) {
	cfg, sys, log := testConfig(t), newFakeSystem(), &memLog{}
	if err := os.MkdirAll(cfg.TokenDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.TokenDir, "portal.tok"), []byte("p"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(context.Background(), cfg, sys, license(t, "t", "FeatureType=1\nEnableUI=FALSE\n"), log); err != nil {
		t.Fatal(err)
	}
	all := strings.Join(log.lines, "\n")
	if !strings.Contains(all, "warn: another token portal.tok") || !strings.Contains(all, "not applied on Windows (only FeatureType is): EnableUI") {
		t.Fatal(all)
	}
}

func TestPassFindsInstallsAndReports(t *testing.T) {
	s := &server{statuses: []int{202}}
	ts := newServer(s)
	defer ts.Close()
	files := volumeFiles()
	files[KeyReportURL] = []byte(ts.URL + "/v1/reports")
	cfg, sys, log := testConfig(t), newFakeSystem(), &memLog{}
	cfg.Disk = buildISO(t, DefaultLabel, files, "-joliet", "-rock")
	cfg.UUID = "5D307CA9-B3EF-428D-8BE6-5B4C7E0AC3C2"
	cfg.Hostname = func() (string, error) { return "win-1", nil }
	cfg.Retry = fast
	cfg.LogFile = filepath.Join(fixtures(t), "gridd-log-renew-return-windows-format.txt")
	if err := Pass(context.Background(), cfg, sys, log); err != nil {
		t.Fatal(err, log.lines)
	}
	body := s.bodies[0]
	if !strings.Contains(body, "uuid: 5d307ca9-b3ef-428d-8be6-5b4c7e0ac3c2\nhostname: win-1\n") ||
		!strings.Contains(body, "token-sha256: "+SHA256Hex(files[KeyToken])+"\n") ||
		!strings.Contains(body, "nvidia-smi: missing\nos: windows\n") ||
		!strings.Contains(body, "--- gridd-log\nTue Dec 20 05:55:57 2022:<2>:Mismatch") {
		t.Fatalf("body:\n%s", body)
	}
	// The volume says where to report but not as whom: installed, then "not configured".
	delete(files, KeyCredential)
	cfg.Disk = buildISO(t, DefaultLabel, files, "-joliet", "-rock")
	if err := Pass(context.Background(), cfg, sys, log); !errors.Is(err, ErrNotConfigured) {
		t.Fatalf("%v", err)
	}
	cfg.Disk = filepath.Join(t.TempDir(), "missing.iso")
	if err := Pass(context.Background(), cfg, sys, log); !errors.Is(err, ErrNoVolume) {
		t.Fatalf("%v", err)
	}
}

func TestFindVolumeByLabelAmongDevices(t *testing.T) {
	other := buildISO(t, "cfgdata", volumeFiles(), "-joliet", "-rock")
	ours := buildISO(t, DefaultLabel, volumeFiles(), "-joliet", "-rock")
	cfg := testConfig(t)
	cfg.Label = DefaultLabel
	cfg.Candidates = func() []string { return []string{filepath.Join(t.TempDir(), "nodev"), other, ours} }
	v, err := FindVolume(context.Background(), cfg)
	if err != nil || v.Label != DefaultLabel {
		t.Fatalf("%v %v", v, err)
	}
	cfg.Candidates = func() []string { return []string{other} }
	if _, err := FindVolume(context.Background(), cfg); !errors.Is(err, ErrNoVolume) {
		t.Fatalf("%v", err)
	}
}
