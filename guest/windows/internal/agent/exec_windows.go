//go:build windows

package agent

import (
	"os/exec"
	"syscall"
)

// hideWindow keeps a console from flashing up when the service runs nvidia-smi.
func hideWindow(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{HideWindow: true}
}
