//go:build windows

// Package winsys is the agent's Windows side: registry, service control, devices, SMBIOS, Event Log.
package winsys

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/windows"
	"golang.org/x/sys/windows/registry"
	"golang.org/x/sys/windows/svc"
	"golang.org/x/sys/windows/svc/mgr"
)

// ServiceWait bounds each wait for the display container to stop or to run.
const ServiceWait = 30 * time.Second

// System implements agent.System with the registry and the service control manager.
type System struct{}

func (System) GetDWORD(key, name string) (uint32, bool, error) {
	k, err := registry.OpenKey(registry.LOCAL_MACHINE, key, registry.QUERY_VALUE)
	if errors.Is(err, registry.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	defer k.Close()
	v, typ, err := k.GetIntegerValue(name)
	if errors.Is(err, registry.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		if errors.Is(err, registry.ErrUnexpectedType) {
			return 0, true, nil // present with another type: replaced as a change
		}
		return 0, false, err
	}
	if typ != registry.DWORD {
		return 0, true, nil
	}
	return uint32(v), true, nil
}

func (System) SetDWORD(key, name string, value uint32) error {
	k, _, err := registry.CreateKey(registry.LOCAL_MACHINE, key, registry.SET_VALUE)
	if err != nil {
		return err
	}
	defer k.Close()
	return k.SetDWordValue(name, value)
}

func (System) DeleteValue(key, name string) error {
	k, err := registry.OpenKey(registry.LOCAL_MACHINE, key, registry.SET_VALUE)
	if errors.Is(err, registry.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer k.Close()
	if err := k.DeleteValue(name); err != nil && !errors.Is(err, registry.ErrNotExist) {
		return err
	}
	return nil
}

func (System) KeyExists(key string) bool {
	k, err := registry.OpenKey(registry.LOCAL_MACHINE, key, registry.QUERY_VALUE)
	if err != nil {
		return false
	}
	k.Close()
	return true
}

func waitState(ctx context.Context, s *mgr.Service, want svc.State, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		st, err := s.Query()
		if err != nil {
			return err
		}
		if st.State == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still in state %d after %s", st.State, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// RestartService stops the service (a stop request: the driver returns its lease; nothing is
// killed), waits until it stopped, starts it and waits until it runs, each wait bounded.
func (System) RestartService(ctx context.Context, name string) error {
	m, err := mgr.Connect()
	if err != nil {
		return err
	}
	defer m.Disconnect()
	s, err := m.OpenService(name)
	if err != nil {
		return err
	}
	defer s.Close()
	st, err := s.Query()
	if err != nil {
		return err
	}
	if st.State != svc.Stopped {
		if _, err := s.Control(svc.Stop); err != nil && !errors.Is(err, windows.ERROR_SERVICE_NOT_ACTIVE) {
			return fmt.Errorf("stop: %w", err)
		}
		if err := waitState(ctx, s, svc.Stopped, ServiceWait); err != nil {
			return fmt.Errorf("stop: %w", err)
		}
	}
	if err := s.Start(); err != nil && !errors.Is(err, windows.ERROR_SERVICE_ALREADY_RUNNING) {
		return fmt.Errorf("start: %w", err)
	}
	if err := waitState(ctx, s, svc.Running, ServiceWait); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	return nil
}

// Candidates are the raw devices a license volume may be on: optical drives (a `cdrom` on SATA),
// then disks (a `disk` on virtio or SATA).
func Candidates() []string {
	var out []string
	for i := 0; i < 8; i++ {
		out = append(out, fmt.Sprintf(`\\.\CdRom%d`, i))
	}
	for i := 0; i < 16; i++ {
		out = append(out, fmt.Sprintf(`\\.\PhysicalDrive%d`, i))
	}
	return out
}

var procGetSystemFirmwareTable = windows.NewLazySystemDLL("kernel32.dll").NewProc("GetSystemFirmwareTable")

// SMBIOSTable is GetSystemFirmwareTable('RSMB', 0): the raw SMBIOS data.
func SMBIOSTable() ([]byte, error) {
	const rsmb = 'R'<<24 | 'S'<<16 | 'M'<<8 | 'B'
	n, _, err := procGetSystemFirmwareTable.Call(rsmb, 0, 0, 0)
	if n == 0 {
		return nil, fmt.Errorf("GetSystemFirmwareTable: %v", err)
	}
	buf := make([]byte, n)
	m, _, err := procGetSystemFirmwareTable.Call(rsmb, 0, uintptr(unsafe.Pointer(&buf[0])), n)
	if m == 0 || m > n {
		return nil, fmt.Errorf("GetSystemFirmwareTable: %v", err)
	}
	return buf[:m], nil
}
