// Command licensectl-agent is licensectl's Windows guest agent: it installs the NVIDIA vGPU license
// from the licensectl license volume and reports the license state (docs/guest.md, "Windows guests").
//
//	licensectl-agent install [flags]   register as a Windows service (runs `service` with the same flags)
//	licensectl-agent uninstall [flags] remove the service, the tokens it placed, restore the registry
//	licensectl-agent service [flags]   what the service runs: one pass at start, then every --interval
//	licensectl-agent run [flags]       the same loop in the foreground, until Ctrl-C
//	licensectl-agent once [flags]      one install pass and one report, then exit (exit codes below)
//	licensectl-agent version
//
// Exit codes of `once`: 0 done; 1 usage or unexpected error; 2 license volume not found; 3 report
// not configured; 4 bad volume content; 5 installing failed; 6 restarting the display container
// failed (files installed); 7 report refused; 8 gave up after the retry budget.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"licensectl.dev/guest/windows/internal/agent"
)

type stderrLogger struct{}

func (stderrLogger) Info(msg string)  { fmt.Fprintln(os.Stderr, "licensectl-agent: "+msg) }
func (stderrLogger) Warn(msg string)  { fmt.Fprintln(os.Stderr, "licensectl-agent: warning: "+msg) }
func (stderrLogger) Error(msg string) { fmt.Fprintln(os.Stderr, "licensectl-agent: error: "+msg) }

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// flags binds the settings; the defaults are the Windows locations (docs/guest.md).
func flags(fs *flag.FlagSet) *agent.Config {
	systemDrive := envOr("SystemDrive", `C:`)
	programFiles := envOr("ProgramFiles", systemDrive+`\Program Files`)
	programData := envOr("ProgramData", systemDrive+`\ProgramData`)
	public := envOr("PUBLIC", systemDrive+`\Users\Public`)
	cfg := &agent.Config{Retry: agent.DefaultRetry}
	fs.StringVar(&cfg.Label, "label", agent.DefaultLabel, "volume label of the license volume")
	fs.StringVar(&cfg.Disk, "disk", "", "read the license volume from this image file, device or folder instead of searching by label")
	fs.DurationVar(&cfg.DiskWait, "disk-wait", 30*time.Second, "how long to wait for the license volume")
	fs.StringVar(&cfg.TokenDir, "token-dir", filepath.Join(programFiles, `NVIDIA Corporation\vGPU Licensing\ClientConfigToken`), "client configuration token folder")
	fs.StringVar(&cfg.StateDir, "state-dir", filepath.Join(programData, "licensectl"), "the agent's record of registry values it replaced")
	fs.StringVar(&cfg.LogFile, "log-file", filepath.Join(public, `Documents\NvidiaLogging\Log.NVDisplay.Container.exe.log`), "NVIDIA licensing log")
	fs.IntVar(&cfg.LogLines, "log-lines", agent.DefaultLogTail, "licensing log lines to report")
	fs.StringVar(&smiPath, "nvidia-smi", "", "nvidia-smi.exe to run (default: System32, then NVSMI, then PATH)")
	fs.StringVar(&cfg.Service, "service", agent.DisplayService, "NVIDIA display container service to restart")
	fs.DurationVar(&cfg.Interval, "interval", 60*time.Second, "time between passes of `run`")
	fs.IntVar(&cfg.Retry.Attempts, "attempts", cfg.Retry.Attempts, "report attempts")
	fs.DurationVar(&cfg.Retry.Backoff, "backoff", cfg.Retry.Backoff, "first retry delay, doubled per retry")
	fs.DurationVar(&cfg.Retry.Deadline, "deadline", cfg.Retry.Deadline, "time for all attempts")
	fs.StringVar(&cfg.UUID, "uuid", "", "report this SMBIOS UUID instead of the firmware's (tests)")
	cfg.SMI = agent.SMICandidates(envOr("SystemRoot", systemDrive+`\Windows`), programFiles)
	cfg.Hostname = os.Hostname
	cfg.Candidates = candidates
	cfg.UUIDSource = firmwareUUID
	return cfg
}

// smiPath is --nvidia-smi: when set, the only nvidia-smi candidate.
var smiPath string

// exitCode maps a pass's error to the documented exit code.
func exitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, agent.ErrNoVolume):
		return 2
	case errors.Is(err, agent.ErrNotConfigured):
		return 3
	case errors.Is(err, agent.ErrBadContent):
		return 4
	case errors.Is(err, agent.ErrRestart):
		return 6
	case errors.Is(err, agent.ErrRefused):
		return 7
	case errors.Is(err, agent.ErrGaveUp):
		return 8
	default:
		return 5
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: licensectl-agent install|uninstall|service|run|once|version [flags]")
	os.Exit(1)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	cmd := os.Args[1]
	if cmd == "version" {
		fmt.Println(agent.Version)
		return
	}
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	cfg := flags(fs)
	if err := fs.Parse(os.Args[2:]); err != nil || fs.NArg() != 0 {
		usage()
	}
	if smiPath != "" {
		cfg.SMI = []string{smiPath}
	}
	os.Exit(dispatch(cmd, cfg, os.Args[2:]))
}
