package portholder

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvdock/core/testkit/freeport"
)

// TestFindsThisProcess: a port this test listens on is held by this test's
// own pid, found through the real /proc.
func TestFindsThisProcess(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	h, ok := Find("", port)
	if !ok || h.PID != os.Getpid() || h.Command == "" {
		t.Fatalf("Find(%d) = %+v, %v; want pid %d", port, h, ok, os.Getpid())
	}
	if _, ok := Find("", freeport.Port(t)); ok {
		t.Fatal("a port nobody listens on has a holder")
	}
}

// TestHostileCommandLineIsEscaped: a holder's command line is another
// process's bytes: terminal escapes in it come back escaped, and a
// connected (not listening) socket on the port is not a holder.
func TestHostileCommandLineIsEscaped(t *testing.T) {
	root := t.TempDir()
	mk := func(p, body string) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	head := "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	mk("net/tcp", head+
		"   0: 0100007F:1F90 00000000:0000 01 00000000:00000000 00:00000000 00000000  1000        0 111 1 0 100 0 0 10 0\n"+
		"   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 222 1 0 100 0 0 10 0\n")
	mk("net/tcp6", head)
	mk("42/cmdline", "evil\x00\x1b[2Jwipe\x00")
	mk("7/cmdline", "connected")
	for pid, inode := range map[string]string{"7": "111", "42": "222"} {
		if err := os.MkdirAll(filepath.Join(root, pid, "fd"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("socket:["+inode+"]", filepath.Join(root, pid, "fd", "3")); err != nil {
			t.Fatal(err)
		}
	}
	h, ok := Find(root, 8080)
	if !ok || h.PID != 42 || strings.ContainsRune(h.Command, 0x1b) || !strings.Contains(h.Command, `\x1b[2Jwipe`) {
		t.Fatalf("Find = %+v, %v; want pid 42 with the escape escaped", h, ok)
	}
}
