//go:build windows

package winsys

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/windows"
	"golang.org/x/sys/windows/svc"
	"golang.org/x/sys/windows/svc/eventlog"
	"golang.org/x/sys/windows/svc/mgr"
)

// AgentService is the agent's own service name (and its Event Log source).
const AgentService = "licensectl-agent"

// InstallService registers exe as an automatic service running `service` with args. It stores no
// machine identity, so an image generalised with Sysprep after `install` keeps working.
func InstallService(exe string, args []string) error {
	m, err := mgr.Connect()
	if err != nil {
		return err
	}
	defer m.Disconnect()
	if s, err := m.OpenService(AgentService); err == nil {
		s.Close()
		return fmt.Errorf("service %s already exists (uninstall it first)", AgentService)
	}
	s, err := m.CreateService(AgentService, exe, mgr.Config{
		DisplayName:      "licensectl NVIDIA vGPU license agent",
		Description:      "Installs the NVIDIA vGPU license from the licensectl license volume and reports the license state.",
		StartType:        mgr.StartAutomatic,
		DelayedAutoStart: false,
	}, append([]string{"service"}, args...)...)
	if err != nil {
		return err
	}
	defer s.Close()
	_ = s.SetRecoveryActions([]mgr.RecoveryAction{
		{Type: mgr.ServiceRestart, Delay: 10 * time.Second},
		{Type: mgr.ServiceRestart, Delay: 60 * time.Second},
	}, 86400)
	// The Event Log source is optional: a failure leaves logging to stderr / the service status.
	_ = eventlog.InstallAsEventCreate(AgentService, eventlog.Error|eventlog.Warning|eventlog.Info)
	return nil
}

// RemoveService stops and deletes the agent's service and its Event Log source.
func RemoveService() error {
	m, err := mgr.Connect()
	if err != nil {
		return err
	}
	defer m.Disconnect()
	s, err := m.OpenService(AgentService)
	if err != nil {
		if errors.Is(err, windows.ERROR_SERVICE_DOES_NOT_EXIST) {
			return nil
		}
		return err
	}
	defer s.Close()
	if st, err := s.Query(); err == nil && st.State != svc.Stopped {
		_, _ = s.Control(svc.Stop)
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			if st, err := s.Query(); err != nil || st.State == svc.Stopped {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	_ = eventlog.Remove(AgentService)
	return s.Delete()
}

// EventLogger writes to the Windows Event Log, falling back to a second logger.
type EventLogger struct {
	Log      *eventlog.Log
	Fallback interface {
		Info(string)
		Warn(string)
		Error(string)
	}
}

func (l *EventLogger) Info(msg string) {
	if l.Log == nil || l.Log.Info(1, msg) != nil {
		l.Fallback.Info(msg)
	}
}
func (l *EventLogger) Warn(msg string) {
	if l.Log == nil || l.Log.Warning(2, msg) != nil {
		l.Fallback.Warn(msg)
	}
}
func (l *EventLogger) Error(msg string) {
	if l.Log == nil || l.Log.Error(3, msg) != nil {
		l.Fallback.Error(msg)
	}
}
