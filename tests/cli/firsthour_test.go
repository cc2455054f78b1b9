package cli

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"kvdock/tests/harness"
)

// TestTakenPortNamesTheFlagAndTheHolder: a start refused because the HTTP
// port (or the ZMQ port) is taken names the flag that moves kvdock and the
// process holding the port (here this test, found through /proc).
func TestTakenPortNamesTheFlagAndTheHolder(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().(*net.TCPAddr).Port
	holder := fmt.Sprintf("port %d is held by pid %d (", taken, os.Getpid())
	for _, tc := range []struct {
		name, flag string
		args       []string
	}{
		{"HTTP", "--http-port", []string{"--port", strconv.Itoa(harness.FreePort(t)), "--http-port", strconv.Itoa(taken)}},
		{"ZMQ", "--port", []string{"--port", strconv.Itoa(taken), "--http-port", "0"}},
	} {
		args := append([]string{"--headless", "--shm-name", harness.UniqueName("kvport"), "--l1-size-gb", "0.0625", "--no-l1-prefault"}, tc.args...)
		code, _, stderr := kvdock(t, nil, args...)
		if code != 1 || !strings.Contains(stderr, "address already in use") || !strings.Contains(stderr, holder) ||
			!strings.Contains(stderr, "give kvdock another with "+tc.flag+" ") {
			t.Errorf("%s port taken: exit %d, want 1 naming %q and %s:\n%s", tc.name, code, holder, tc.flag, stderr)
		}
	}
}

// TestKeepOnExitSaysWhatItLeaves: a stop with --l1-keep-on-exit says on its
// exit line which segment it left in /dev/shm, the memory it holds and what
// it caches; a stop without it says nothing of the kind.
func TestKeepOnExitSaysWhatItLeaves(t *testing.T) {
	srv := harness.StartKeeping(t, false, "--chunk-size", "16")
	storePickle(t, srv, 3)
	srv.StopKept(t)
	want := "; kept " + filepath.Join("/dev/shm", srv.Segment) + " (64.0 MiB of shared memory, 3 object(s), "
	lines := strings.Split(strings.TrimSpace(srv.Output()), "\n")
	last := lines[len(lines)-1]
	if !strings.Contains(last, "stopped by SIGTERM, exit 0"+want) || !strings.Contains(last, "rm it to free the memory; log: ") {
		t.Fatalf("the exit line lacks %q:\n%s", want, last)
	}
	plain := harness.Start(t)
	plain.Stop(t)
	if strings.Contains(plain.Output(), "; kept ") {
		t.Fatalf("a stop without --l1-keep-on-exit says it kept something:\n%s", plain.Output())
	}
}
