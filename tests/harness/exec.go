package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"kvdock/core/testkit/logbuf"
)

// Exited reports whether the process has exited, and how (nil: exit 0).
func (s *Server) Exited() (bool, error) {
	select {
	case <-s.done:
		return true, s.exitErr
	default:
		return false, nil
	}
}

// WaitExit waits up to limit for the process to exit; false if it still runs.
func (s *Server) WaitExit(limit time.Duration) bool {
	select {
	case <-s.done:
		return true
	case <-time.After(limit):
		return false
	}
}

// WaitReady waits up to limit for NOOP to answer on the endpoint and
// /status on the HTTP API (which starts after the wire server); an error
// when the process exits first or either does not answer in time.
func (s *Server) WaitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	if err := s.waitReady(limit); err != nil {
		return err
	}
	for {
		_, err := s.keptStatus()
		if err == nil {
			return nil
		}
		if done, exit := s.Exited(); done {
			return fmt.Errorf("exited: %v", exit)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("/status did not answer: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// StopKept sends SIGTERM and waits for exit 0, leaving the kept pool and
// its record for the next start (StartKeeping's servers).
func (s *Server) StopKept(t testing.TB) {
	t.Helper()
	if err := s.stopKept(); err != nil {
		t.Fatal(err)
	}
}

// Launch starts another process with s's command line and binary (same
// ports, segment name and state directory), its output kept apart, and
// returns without waiting for it: for tests that start two at once. A
// process still running when the test ends is stopped as StartKeeping's
// are, and a kept segment is removed by the server it was launched from.
func (s *Server) Launch(t testing.TB) *Server {
	t.Helper()
	n := &Server{Port: s.Port, HTTPPort: s.HTTPPort, Segment: s.Segment, Protocol: s.Protocol,
		autoDefault: s.autoDefault, bin: s.bin, out: &logbuf.Buffer{}}
	n.launch(t, s.cmd.Args[1:])
	t.Cleanup(func() {
		if err := n.stopKept(); err != nil {
			t.Error(err)
		}
		if n.Segment != "" {
			_ = os.Remove(filepath.Join("/dev/shm", n.Segment))
		}
	})
	return n
}
