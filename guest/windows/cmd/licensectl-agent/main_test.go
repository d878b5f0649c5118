package main

import (
	"errors"
	"flag"
	"fmt"
	"testing"

	"licensectl.dev/guest/windows/internal/agent"
)

func TestExitCodes(t *testing.T) {
	for err, want := range map[error]int{
		nil: 0, agent.ErrNoVolume: 2, agent.ErrNotConfigured: 3, agent.ErrBadContent: 4,
		errors.New("disk full"): 5, agent.ErrRestart: 6, agent.ErrRefused: 7, agent.ErrGaveUp: 8,
	} {
		if err != nil {
			err = fmt.Errorf("wrapped: %w", err)
		}
		if got := exitCode(err); got != want {
			t.Errorf("%v: %d want %d", err, got, want)
		}
	}
}

func TestDefaultsAreTheWindowsLocations(t *testing.T) {
	t.Setenv("ProgramFiles", `C:\Program Files`)
	t.Setenv("PUBLIC", `C:\Users\Public`)
	cfg := flags(flag.NewFlagSet("once", flag.ContinueOnError))
	if cfg.Label != "LICENSECTL" || cfg.Service != "NVDisplay.ContainerLocalSystem" || cfg.Retry != agent.DefaultRetry {
		t.Fatalf("%+v", cfg)
	}
	if cfg.TokenDir != `C:\Program Files/NVIDIA Corporation\vGPU Licensing\ClientConfigToken` &&
		cfg.TokenDir != `C:\Program Files\NVIDIA Corporation\vGPU Licensing\ClientConfigToken` {
		t.Fatalf("token dir %q", cfg.TokenDir)
	}
}
