//go:build windows

// Command fake-display-container is test scaffolding (never shipped): a Windows service standing in
// for NVDisplay.ContainerLocalSystem. Each start appends a line to starts.log next to the .exe and,
// like the real container after reading its token, a Windows-format licensing log line to the file
// named by its first argument.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/windows/svc"
)

type service struct{ log string }

func appendLine(path, line string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.WriteString(line + "\r\n")
}

func (s *service) Execute(_ []string, req <-chan svc.ChangeRequest, status chan<- svc.Status) (bool, uint32) {
	status <- svc.Status{State: svc.StartPending}
	now := time.Now()
	if exe, err := os.Executable(); err == nil {
		appendLine(filepath.Join(filepath.Dir(exe), "starts.log"), now.UTC().Format(time.RFC3339Nano))
	}
	if s.log != "" {
		exp := now.UTC().Add(24 * time.Hour)
		appendLine(s.log, fmt.Sprintf("%s:<1>:License acquired successfully. (Info: 127.0.0.1, NVIDIA RTX Virtual "+
			"Workstation; Expiry: %d-%d-%d %d:%d:%d GMT)", now.Format("Mon Jan _2 15:04:05 2006"),
			exp.Year(), exp.Month(), exp.Day(), exp.Hour(), exp.Minute(), exp.Second()))
	}
	status <- svc.Status{State: svc.Running, Accepts: svc.AcceptStop | svc.AcceptShutdown}
	for c := range req {
		switch c.Cmd {
		case svc.Interrogate:
			status <- c.CurrentStatus
		case svc.Stop, svc.Shutdown:
			status <- svc.Status{State: svc.StopPending}
			return false, 0
		}
	}
	return false, 0
}

func main() {
	s := &service{}
	if len(os.Args) > 1 {
		s.log = os.Args[1]
	}
	if err := svc.Run("NVDisplay.ContainerLocalSystem", s); err != nil {
		os.Exit(1)
	}
}
