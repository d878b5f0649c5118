package agent

// nvidia-smi: found in System32 (current DCH drivers), then the NVSMI folder (older drivers), then
// on PATH; run with a time limit and an output bound, XML first and the text form as fallback.

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// SMITimeout bounds each nvidia-smi run.
const SMITimeout = 30 * time.Second

// SMICandidates lists where nvidia-smi.exe is looked for, in order; an empty entry means PATH.
func SMICandidates(systemRoot, programFiles string) []string {
	var out []string
	if systemRoot != "" {
		out = append(out, filepath.Join(systemRoot, "System32", "nvidia-smi.exe"))
	}
	if programFiles != "" {
		out = append(out, filepath.Join(programFiles, "NVIDIA Corporation", "NVSMI", "nvidia-smi.exe"))
	}
	return append(out, "")
}

// FindSMI returns the first candidate that exists (PATH looked up with exec.LookPath), or "".
func FindSMI(candidates []string) string {
	for _, c := range candidates {
		if c == "" {
			if p, err := exec.LookPath("nvidia-smi"); err == nil {
				return p
			}
			continue
		}
		if st, err := os.Stat(c); err == nil && !st.IsDir() {
			return c
		}
	}
	return ""
}

// limitedBuffer keeps at most max bytes. The buffer is a field, not embedded: an embedded
// bytes.Buffer's ReadFrom would let io.Copy bypass the bound.
type limitedBuffer struct {
	buf      bytes.Buffer
	max      int
	overflow bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.buf.Len()+len(p) > b.max {
		b.overflow = true
		return 0, errors.New("output too large")
	}
	return b.buf.Write(p)
}

func runBounded(ctx context.Context, exe string, args ...string) ([]byte, bool) {
	ctx, cancel := context.WithTimeout(ctx, SMITimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, args...)
	out := &limitedBuffer{max: SMIMaxBytes}
	cmd.Stdout = out
	hideWindow(cmd)
	if err := cmd.Run(); err != nil || out.overflow || out.buf.Len() == 0 {
		return nil, false
	}
	return out.buf.Bytes(), true
}

// CollectSMI fills the report's nvidia-smi status and section.
func CollectSMI(ctx context.Context, exe string, r *Report) {
	if exe == "" {
		r.SMIStatus = SMIMissing
		return
	}
	r.SMIStatus = SMIFailed
	if out, ok := runBounded(ctx, exe, "-q", "-x"); ok {
		r.SMIStatus, r.SMIXML = SMIOK, out
	} else if out, ok := runBounded(ctx, exe, "-q"); ok {
		r.SMIStatus, r.SMIText = SMIOK, out
	}
}
