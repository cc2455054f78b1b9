package httpapi

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// The local token: POST /restart interrupts every worker and runs the
// binary again, what SIGUSR2 does, which only the account kvdock runs as
// (and root) may send. So a restart needs a credential even on loopback:
// the configured token or, when none is set, a random token kvdock writes
// at each start into its state directory (mode 0600 in a 0700 directory),
// which `kvdock ctl restart` reads from there. Another account's process
// that reaches the port reads neither.

// maxLocalToken bounds the file ReadLocalToken reads.
const maxLocalToken = 256

// LocalTokenFile is the local token's file of the HTTP API on port, in
// the state directory dir (one file per port: kvdocks may share dir).
func LocalTokenFile(dir string, port int) string {
	return filepath.Join(dir, fmt.Sprintf("http-%d.token", port))
}

// WriteLocalToken makes a fresh token and writes it to LocalTokenFile
// (created 0600 under a temporary name, then renamed over the old one,
// so a reader sees one whole token), creating dir 0700 when missing.
func WriteLocalToken(dir string, port int) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("local HTTP token: %w", err)
	}
	tok := hex.EncodeToString(b)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("local HTTP token: %w", err)
	}
	path := LocalTokenFile(dir, port)
	f, err := os.CreateTemp(dir, ".http-token-*")
	if err != nil {
		return "", fmt.Errorf("local HTTP token: %w", err)
	}
	tmp := f.Name()
	_, werr := f.WriteString(tok + "\n")
	if err := errors.Join(werr, f.Close()); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("local HTTP token %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("local HTTP token: %w", err)
	}
	return tok, nil
}

// ReadLocalToken reads the local token of the API on port from dir. The
// file must be a regular file of this account, readable by no one else,
// and short; anything else is refused with the reason.
func ReadLocalToken(dir string, port int) (string, error) {
	path := LocalTokenFile(dir, port)
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", fmt.Errorf("local HTTP token: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("local HTTP token: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return "", fmt.Errorf("local HTTP token %s: not a regular file", path)
	case fi.Mode().Perm()&0o077 != 0:
		return "", fmt.Errorf("local HTTP token %s: mode %v, readable by others", path, fi.Mode().Perm())
	case ok && int(st.Uid) != os.Geteuid():
		return "", fmt.Errorf("local HTTP token %s: owned by uid %d, not this account's %d", path, st.Uid, os.Geteuid())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxLocalToken+1))
	if err != nil {
		return "", fmt.Errorf("local HTTP token %s: %w", path, err)
	}
	tok := strings.TrimSpace(string(b))
	if len(b) > maxLocalToken || tok == "" {
		return "", fmt.Errorf("local HTTP token %s: not a token", path)
	}
	return tok, nil
}
