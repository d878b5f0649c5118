package agent

// The token in ClientConfigToken, installed transactionally: written under a temporary name in the
// same folder, then renamed into place (a rename within a folder replaces atomically on NTFS too),
// then the agent's older tokens removed. Tokens the agent did not place are never touched.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// TokenPrefix marks the token files this agent placed (the Linux install script's names too).
const TokenPrefix = "licensectl_"

// TokenName is the file name of a token: licensectl_<first 16 hex of its SHA-256>.tok.
func TokenName(token []byte) string {
	sum := sha256.Sum256(token)
	return TokenPrefix + hex.EncodeToString(sum[:])[:16] + ".tok"
}

// SHA256Hex is the hash the report carries.
func SHA256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TokenResult says what InstallToken did; Foreign lists *.tok files it left alone.
type TokenResult struct {
	Changed bool
	Removed []string
	Foreign []string
}

func ownToken(name string) bool {
	return strings.HasPrefix(name, TokenPrefix) && strings.HasSuffix(strings.ToLower(name), ".tok")
}

// InstallToken puts `token` into dir (created if missing) unless the same bytes are already there.
func InstallToken(dir string, token []byte) (TokenResult, error) {
	var res TokenResult
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return res, fmt.Errorf("creating the token folder: %w", err)
	}
	name := TokenName(token)
	target := filepath.Join(dir, name)
	if cur, err := os.ReadFile(target); err != nil || !bytes.Equal(cur, token) {
		tmp, err := os.CreateTemp(dir, ".licensectl-*.tmp")
		if err != nil {
			return res, fmt.Errorf("writing the token: %w", err)
		}
		_, werr := tmp.Write(token)
		serr := tmp.Sync()
		cerr := tmp.Close()
		if werr != nil || serr != nil || cerr != nil {
			_ = os.Remove(tmp.Name())
			return res, fmt.Errorf("writing the token failed")
		}
		if err := os.Rename(tmp.Name(), target); err != nil {
			_ = os.Remove(tmp.Name())
			return res, fmt.Errorf("renaming the token into place: %w", err)
		}
		res.Changed = true
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return res, fmt.Errorf("listing the token folder: %w", err)
	}
	for _, e := range entries {
		n := e.Name()
		switch {
		case n == name || e.IsDir():
		case ownToken(n):
			if err := os.Remove(filepath.Join(dir, n)); err != nil {
				return res, fmt.Errorf("removing the stale token %s: %w", n, err)
			}
			res.Removed = append(res.Removed, n)
			res.Changed = true
		case strings.HasSuffix(strings.ToLower(n), ".tok"):
			res.Foreign = append(res.Foreign, n)
		}
	}
	sort.Strings(res.Foreign)
	return res, nil
}

// RemoveOwnTokens deletes every token this agent placed (uninstall); others stay.
func RemoveOwnTokens(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range entries {
		if !e.IsDir() && ownToken(e.Name()) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return removed, err
			}
			removed = append(removed, e.Name())
		}
	}
	return removed, nil
}

// InstalledTokenSHA is the hash of the one token this agent placed, or "none" (also when there are
// several: the probe cannot tell which one the driver uses).
func InstalledTokenSHA(dir string) string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "none"
	}
	var own []string
	for _, e := range entries {
		if !e.IsDir() && ownToken(e.Name()) {
			own = append(own, e.Name())
		}
	}
	if len(own) != 1 {
		return "none"
	}
	data, err := os.ReadFile(filepath.Join(dir, own[0]))
	if err != nil || len(data) > MaxVolumeFile {
		return "none"
	}
	return SHA256Hex(data)
}
