//go:build windows

package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"time"

	"golang.org/x/sys/windows/svc"
	"golang.org/x/sys/windows/svc/eventlog"

	"licensectl.dev/guest/windows/internal/agent"
	"licensectl.dev/guest/windows/internal/winsys"
)

func candidates() []string { return winsys.Candidates() }

func firmwareUUID() (string, error) {
	raw, err := winsys.SMBIOSTable()
	if err != nil {
		return "", err
	}
	return agent.SMBIOSUUID(raw)
}

func dispatch(cmd string, cfg *agent.Config, args []string) int {
	log := stderrLogger{}
	switch cmd {
	case "once":
		err := agent.Pass(context.Background(), cfg, winsys.System{}, log)
		if err != nil {
			log.Error(err.Error())
		}
		return exitCode(err)
	case "install":
		exe, err := os.Executable()
		if err == nil {
			err = winsys.InstallService(exe, args)
		}
		if err != nil {
			log.Error("install: " + err.Error())
			return 1
		}
		log.Info("installed the " + winsys.AgentService + " service")
		return 0
	case "uninstall":
		err := winsys.RemoveService()
		if err == nil {
			err = agent.Uninstall(context.Background(), cfg, winsys.System{}, log)
		}
		if err != nil {
			log.Error("uninstall: " + err.Error())
			return 1
		}
		log.Info("uninstalled")
		return 0
	case "run":
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		defer stop()
		loop(ctx, cfg, log)
		return 0
	case "service":
		// What `install` registers: always the service protocol (no guessing whether the SCM started
		// us, a guess Wine's service manager does not pass).
		var l agent.Logger = log
		if el, err := eventlog.Open(winsys.AgentService); err == nil {
			defer el.Close()
			l = &winsys.EventLogger{Log: el, Fallback: log}
		}
		if err := svc.Run(winsys.AgentService, &handler{cfg: cfg, log: l}); err != nil {
			log.Error(err.Error())
			return 1
		}
		return 0
	default:
		usage()
		return 1
	}
}

// loop runs a pass now and then every interval until ctx ends; only the first pass waits for the
// license volume the full --disk-wait.
func loop(ctx context.Context, cfg *agent.Config, log agent.Logger) {
	wait := cfg.DiskWait
	for {
		if err := agent.Pass(ctx, cfg, winsys.System{}, log); err != nil && ctx.Err() == nil {
			log.Error(fmt.Sprintf("pass failed (exit %d): %v", exitCode(err), err))
		}
		cfg.DiskWait = 0
		select {
		case <-ctx.Done():
			cfg.DiskWait = wait
			return
		case <-time.After(cfg.Interval):
		}
	}
}

type handler struct {
	cfg *agent.Config
	log agent.Logger
}

func (h *handler) Execute(_ []string, req <-chan svc.ChangeRequest, status chan<- svc.Status) (bool, uint32) {
	status <- svc.Status{State: svc.StartPending}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		loop(ctx, h.cfg, h.log)
	}()
	status <- svc.Status{State: svc.Running, Accepts: svc.AcceptStop | svc.AcceptShutdown}
	for c := range req {
		switch c.Cmd {
		case svc.Interrogate:
			status <- c.CurrentStatus
		case svc.Stop, svc.Shutdown:
			status <- svc.Status{State: svc.StopPending}
			cancel()
			<-done
			return false, 0
		}
	}
	cancel()
	<-done
	return false, 0
}
