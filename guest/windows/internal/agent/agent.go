package agent

// One install pass and one probe pass, over a System that abstracts the registry and the service
// manager, so every decision is tested on any OS; the Windows System is in internal/winsys.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Registry locations of FeatureType. The first is the documented one; R5xx drivers are reported to
// read the second, which is only written when the driver's service key exists.
const (
	RegGridLicensing       = `SOFTWARE\NVIDIA Corporation\Global\GridLicensing`
	RegDriverGridLicensing = `SYSTEM\CurrentControlSet\Services\nvlddmkm\Global\GridLicensing`
	RegDriverService       = `SYSTEM\CurrentControlSet\Services\nvlddmkm`
	ValueFeatureType       = "FeatureType"
	DisplayService         = "NVDisplay.ContainerLocalSystem"
	DefaultLabel           = "LICENSECTL"
)

// System is what the agent needs from the OS beyond files. Keys are under HKEY_LOCAL_MACHINE.
type System interface {
	GetDWORD(key, name string) (value uint32, exists bool, err error)
	SetDWORD(key, name string, value uint32) error
	DeleteValue(key, name string) error
	KeyExists(key string) bool
	RestartService(ctx context.Context, name string) error
}

// Logger receives one line per event; never a secret.
type Logger interface {
	Info(msg string)
	Warn(msg string)
	Error(msg string)
}

// Config is the agent's settings (command-line flags; `install` records them in the service).
type Config struct {
	Label      string        // volume label of the license volume
	Disk       string        // an explicit image file, device or folder instead of searching by label
	DiskWait   time.Duration // how long to wait for the volume
	TokenDir   string
	StateDir   string // the agent's own record (registry values it replaced), ProgramData\licensectl
	LogFile    string // the NVIDIA licensing log
	LogLines   int
	SMI        []string // nvidia-smi candidates (SMICandidates)
	Service    string   // the NVIDIA display container service to restart
	Interval   time.Duration
	Retry      Retry
	UUID       string // tests only: the SMBIOS UUID to report
	Candidates func() []string
	Hostname   func() (string, error)
	UUIDSource func() (string, error)
}

// regTargets are the registry keys FeatureType goes to on this system.
func regTargets(sys System) []string {
	keys := []string{RegGridLicensing}
	if sys.KeyExists(RegDriverService) {
		keys = append(keys, RegDriverGridLicensing)
	}
	return keys
}

// prior is what a registry value was before the agent first changed it, so uninstall can restore it.
type prior struct {
	Existed bool   `json:"existed"`
	Value   uint32 `json:"value"`
}

type state struct {
	Registry map[string]prior `json:"registry"`
}

func loadState(dir string) (*state, error) {
	st := &state{Registry: map[string]prior{}}
	data, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, st); err != nil {
		return nil, fmt.Errorf("state.json: %w", err)
	}
	if st.Registry == nil {
		st.Registry = map[string]prior{}
	}
	return st, nil
}

func saveState(dir string, st *state) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	data, _ := json.MarshalIndent(st, "", "  ")
	tmp := filepath.Join(dir, "state.json.tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "state.json"))
}

// InstallResult says what an install pass did.
type InstallResult struct {
	TokenChanged    bool
	RegistryChanged []string
	Restarted       bool
}

// Changed is true when the driver must re-read its settings.
func (r InstallResult) Changed() bool { return r.TokenChanged || len(r.RegistryChanged) > 0 }

// Install puts the license in place and restarts the display container when anything changed.
func Install(ctx context.Context, cfg *Config, sys System, lic *License, log Logger) (InstallResult, error) {
	var res InstallResult
	tok, err := InstallToken(cfg.TokenDir, lic.Token)
	if err != nil {
		return res, err
	}
	res.TokenChanged = tok.Changed
	if tok.Changed {
		log.Info(fmt.Sprintf("installed token %s (removed %d stale)", TokenName(lic.Token), len(tok.Removed)))
	}
	for _, f := range tok.Foreign {
		log.Warn(fmt.Sprintf("another token %s is in the token folder; the driver may use either", f))
	}
	if others := OtherSettings(lic.GriddConf); len(others) > 0 {
		log.Warn(fmt.Sprintf("gridd.conf settings not applied on Windows (only FeatureType is): %s",
			strings.Join(others, ", ")))
	}
	if lic.FeatureType != nil {
		st, err := loadState(cfg.StateDir)
		if err != nil {
			return res, err
		}
		want := *lic.FeatureType
		for _, key := range regTargets(sys) {
			cur, exists, err := sys.GetDWORD(key, ValueFeatureType)
			if err != nil {
				return res, fmt.Errorf("reading %s: %w", key, err)
			}
			if exists && cur == want {
				continue
			}
			if _, recorded := st.Registry[key]; !recorded {
				st.Registry[key] = prior{Existed: exists, Value: cur}
				if err := saveState(cfg.StateDir, st); err != nil {
					return res, fmt.Errorf("recording the previous FeatureType: %w", err)
				}
			}
			if err := sys.SetDWORD(key, ValueFeatureType, want); err != nil {
				return res, fmt.Errorf("setting FeatureType under %s: %w", key, err)
			}
			res.RegistryChanged = append(res.RegistryChanged, key)
			log.Info(fmt.Sprintf("set FeatureType=%d under HKLM\\%s", want, key))
		}
	}
	if res.Changed() {
		if err := sys.RestartService(ctx, cfg.Service); err != nil {
			return res, fmt.Errorf("%w: %s: %v", ErrRestart, cfg.Service, err)
		}
		res.Restarted = true
		log.Info("restarted " + cfg.Service)
	}
	return res, nil
}

// Uninstall removes the tokens the agent placed and restores the registry values it replaced.
func Uninstall(ctx context.Context, cfg *Config, sys System, log Logger) error {
	changed := false
	removed, err := RemoveOwnTokens(cfg.TokenDir)
	if err != nil {
		return fmt.Errorf("removing tokens: %w", err)
	}
	if len(removed) > 0 {
		changed = true
		log.Info(fmt.Sprintf("removed %d token(s) the agent placed", len(removed)))
	}
	st, err := loadState(cfg.StateDir)
	if err != nil {
		return err
	}
	for key, p := range st.Registry {
		if p.Existed {
			err = sys.SetDWORD(key, ValueFeatureType, p.Value)
		} else {
			err = sys.DeleteValue(key, ValueFeatureType)
		}
		if err != nil {
			return fmt.Errorf("restoring FeatureType under %s: %w", key, err)
		}
		changed = true
		log.Info("restored FeatureType under HKLM\\" + key)
	}
	// Only what the agent wrote, file by file (os.RemoveAll's handle-based deletion also fails under Wine).
	for _, p := range []string{filepath.Join(cfg.StateDir, "state.json"), cfg.StateDir} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing %s: %w", p, err)
		}
	}
	if changed {
		if err := sys.RestartService(ctx, cfg.Service); err != nil {
			return fmt.Errorf("restarting %s: %w", cfg.Service, err)
		}
		log.Info("restarted " + cfg.Service)
	}
	return nil
}

// OpenVolume reads a license volume from an image file, a raw device or a folder (a mounted drive).
func OpenVolume(path string) (*Volume, error) {
	st, err := os.Stat(path)
	if err == nil && st.IsDir() {
		return readFolder(path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadVolume(alignedReader{f})
}

func readFolder(dir string) (*Volume, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	v := &Volume{Files: map[string][]byte{}}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(io.LimitReader(f, MaxVolumeFile+1))
		f.Close()
		if err != nil {
			return nil, err
		}
		if len(data) > MaxVolumeFile {
			data = nil
		}
		v.Files[e.Name()] = data
	}
	return v, nil
}

// ErrNoVolume says no license volume was found.
var ErrNoVolume = errors.New("license volume not found")

// FindVolume reads the configured volume, or the first candidate device whose label matches,
// retrying until cfg.DiskWait has passed (devices may appear late at boot).
func FindVolume(ctx context.Context, cfg *Config) (*Volume, error) {
	deadline := time.Now().Add(cfg.DiskWait)
	for {
		if cfg.Disk != "" {
			v, err := OpenVolume(cfg.Disk)
			if err == nil {
				return v, nil
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("%w: %s: %v", ErrNoVolume, cfg.Disk, err)
			}
		} else {
			for _, dev := range cfg.Candidates() {
				if v := volumeWithLabel(dev, cfg.Label); v != nil {
					return v, nil
				}
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("%w: no volume labelled %s", ErrNoVolume, cfg.Label)
			}
		}
		if SleepCtx(ctx, time.Second) != nil {
			return nil, ctx.Err()
		}
	}
}

func volumeWithLabel(dev, label string) *Volume {
	f, err := os.Open(dev)
	if err != nil {
		return nil
	}
	defer f.Close()
	r := alignedReader{f}
	if l, err := LabelOf(r); err != nil || !strings.EqualFold(l, label) {
		return nil
	}
	v, err := ReadVolume(r)
	if err != nil {
		return nil
	}
	return v
}

// Collect gathers one report (everything but sending).
func Collect(ctx context.Context, cfg *Config) (*Report, error) {
	uuid := cfg.UUID
	if uuid == "" {
		u, err := cfg.UUIDSource()
		if err != nil {
			return nil, fmt.Errorf("reading the SMBIOS UUID: %w", err)
		}
		uuid = u
	}
	host, _ := cfg.Hostname()
	r := &Report{UUID: strings.ToLower(uuid), Hostname: host, Clock: time.Now(),
		TokenSHA256: InstalledTokenSHA(cfg.TokenDir)}
	CollectSMI(ctx, FindSMI(cfg.SMI), r)
	if lines, err := TailLog(cfg.LogFile, cfg.LogLines); err == nil {
		r.LogLines = lines
	}
	return r, nil
}

// ErrRefused and ErrGaveUp are the probe's failures after sending; ErrRestart an install whose
// files are in place but whose display container did not restart.
var (
	ErrRestart = errors.New("restarting the display container failed")
	ErrRefused = errors.New("report refused")
	ErrGaveUp  = errors.New("gave up after the retry budget")
)

// Probe collects a report and sends it to the volume's target.
func Probe(ctx context.Context, cfg *Config, target *ReportTarget, log Logger) error {
	r, err := Collect(ctx, cfg)
	if err != nil {
		return err
	}
	if r.SMIStatus == SMIMissing {
		log.Warn("nvidia-smi.exe not found (no vGPU guest driver?); reporting driver missing")
	} else if r.SMIStatus == SMIFailed {
		log.Warn("nvidia-smi failed; reporting without GPU state")
	}
	client, err := Client(target)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotConfigured, err)
	}
	res := Send(ctx, client, target, r.Body(), cfg.Retry, SleepCtx)
	for _, a := range res.Attempts {
		log.Warn(a)
	}
	switch res.Outcome {
	case Accepted:
		log.Info(fmt.Sprintf("report accepted (HTTP %d)", res.Status))
		return nil
	case Refused:
		return ErrRefused
	default:
		return ErrGaveUp
	}
}

// Pass is one install pass then one probe pass, as `once` and each service tick run them.
func Pass(ctx context.Context, cfg *Config, sys System, log Logger) error {
	vol, err := FindVolume(ctx, cfg)
	if err != nil {
		return err
	}
	lic, err := ParseLicense(vol.Files)
	if err != nil {
		return err
	}
	if _, err := Install(ctx, cfg, sys, lic, log); err != nil {
		return err
	}
	if lic.Report == nil {
		_, err := ParseReportTarget(vol.Files)
		return err
	}
	return Probe(ctx, cfg, lic.Report, log)
}
