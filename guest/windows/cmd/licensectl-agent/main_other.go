//go:build !windows

package main

import (
	"errors"

	"licensectl.dev/guest/windows/internal/agent"
)

// The agent runs on Windows only; elsewhere it builds (for `go vet` and the tests) and refuses.

func candidates() []string { return nil }

func firmwareUUID() (string, error) { return "", errors.New("not Windows") }

func dispatch(string, *agent.Config, []string) int {
	stderrLogger{}.Error("licensectl-agent runs on Windows only")
	return 1
}
