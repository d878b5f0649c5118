// Command fake-nvidia-smi is test scaffolding (never shipped): it prints nvidia-smi.xml (for -q -x)
// or nvidia-smi.txt (for -q) from its own folder, so the agent's probe runs a real .exe under Wine.
package main

import (
	"os"
	"path/filepath"
	"strings"
)

func main() {
	exe, err := os.Executable()
	if err != nil {
		os.Exit(3)
	}
	name := "nvidia-smi.txt"
	switch strings.Join(os.Args[1:], " ") {
	case "-q -x":
		name = "nvidia-smi.xml"
	case "-q":
	default:
		os.Exit(2)
	}
	data, err := os.ReadFile(filepath.Join(filepath.Dir(exe), name))
	if err != nil {
		os.Exit(9)
	}
	_, _ = os.Stdout.Write(data)
}
