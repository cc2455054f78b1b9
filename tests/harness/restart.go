package harness

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvdock/core/testkit/logbuf"
)

// RestartStatus is /status's "restart" block: what the last start adopted
// from the pool a previous kvdock kept, or why it adopted nothing.
type RestartStatus struct {
	Adopted         bool    `json:"adopted"`
	AdoptedObjects  int64   `json:"adopted_objects"`
	AdoptedBytes    int64   `json:"adopted_bytes"`
	AdoptedContexts int64   `json:"adopted_contexts"`
	AdoptedLookups  int64   `json:"adopted_lookups"`
	GapMs           float64 `json:"gap_ms"`
	Reason          string  `json:"reason"`
	At              string  `json:"at"`
	// What the previous stop's handover did: requests parked and answered,
	// requests read after its last answer, transfers carried here.
	HandoverParked int64 `json:"handover_parked"`
	HandoverLost   int64 `json:"handover_lost"`
	Transfers      int64 `json:"transfers"`
}

// keptStatus is the part of /status a restart changes.
type keptStatus struct {
	ShmName   string        `json:"shm_name"`
	StartedAt *time.Time    `json:"started_at"`
	Restart   RestartStatus `json:"restart"`
	Pool      struct {
		PrivateSegment string `json:"private_segment"`
		Reason         string `json:"reason"`
	} `json:"pool"`
}

// The segment naming a keeping server is started with.
const (
	namedSegment = iota
	autoSegment
	noSharedSegment // --shm-name "": the pickle mode
)

// StartKeeping starts kvdock like Start, with --l1-keep-on-exit and a
// state directory of the test's own, so that a SIGTERM keeps the pool for
// the next start. With auto the server gets no --shm-name (its segment is
// lmcache_l1_pool_<pid>, read from /status). When the test ends the server
// is stopped and its kept segment removed.
func StartKeeping(t testing.TB, auto bool, extra ...string) *Server {
	t.Helper()
	return StartKeepingFrom(t, "", auto, extra...)
}

// StartKeepingFrom is StartKeeping running the binary at bin ("" = the
// one Binary builds): a test that deletes or breaks the binary under a
// running server works on a copy of its own.
func StartKeepingFrom(t testing.TB, bin string, auto bool, extra ...string) *Server {
	t.Helper()
	naming := namedSegment
	if auto {
		naming = autoSegment
	}
	return startKeeping(t, bin, naming, extra...)
}

// StartKeepingPickle is StartKeeping with --shm-name "" (the seed's pickle
// mode): nothing is advertised (Segment is ""), and the pool is the
// endpoint's private segment, read from /status into Private ("" when the
// server fell back to anonymous memory).
func StartKeepingPickle(t testing.TB, extra ...string) *Server {
	t.Helper()
	return startKeeping(t, "", noSharedSegment, extra...)
}

func startKeeping(t testing.TB, bin string, naming int, extra ...string) *Server {
	t.Helper()
	s := &Server{Port: FreePort(t), HTTPPort: FreePort(t), Protocol: "nongpu-v1", autoDefault: "rpc-messages", bin: bin}
	for i, a := range extra {
		if a == "--protocol" && i+1 < len(extra) {
			s.Protocol = extra[i+1]
		}
		if a == "--protocol-auto-default" && i+1 < len(extra) {
			s.autoDefault = extra[i+1]
		}
	}
	args := append(s.baseArgs(), "--l1-keep-on-exit", "--state-dir", filepath.Join(t.TempDir(), "state"))
	switch naming {
	case namedSegment:
		name := UniqueName("kvkeep")
		args = append(args, "--shm-name", name)
		s.Segment = "lmcache_l1_pool_" + name
	case noSharedSegment:
		args = append(args, "--shm-name", "")
	}
	s.out = &logbuf.Buffer{}
	s.launch(t, append(args, extra...))
	t.Cleanup(func() {
		if err := s.stopKept(); err != nil {
			t.Error(err)
		}
		for _, name := range []string{s.Segment, s.Private} {
			if name != "" {
				_ = os.Remove(filepath.Join("/dev/shm", name))
			}
		}
	})
	if err := s.waitReady(15 * time.Second); err != nil {
		t.Fatalf("kvdock did not come up: %v\n%s", err, s.out.String())
	}
	switch st := s.kept(t); naming {
	case autoSegment:
		s.Segment = st.ShmName
		if !strings.HasPrefix(s.Segment, "lmcache_l1_pool_") {
			t.Fatalf("auto naming advertised %q\n%s", s.Segment, s.out.String())
		}
	case noSharedSegment:
		s.Private = st.Pool.PrivateSegment
	}
	return s
}

// PoolStatus is /status's pool block as a restart test reads it: the
// private segment behind a pool that is not shared, and the reason.
func (s *Server) PoolStatus(t testing.TB) (privateSegment, reason string) {
	t.Helper()
	st := s.kept(t)
	return st.Pool.PrivateSegment, st.Pool.Reason
}

// stopKept sends SIGTERM and waits (10 s at most) for exit 0, leaving the
// segment in place.
func (s *Server) stopKept() error {
	select {
	case <-s.done:
		return nil
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
		return fmt.Errorf("kvdock did not stop within 10 s of SIGTERM\n%s", s.out.String())
	}
	if s.exitErr != nil {
		return fmt.Errorf("kvdock exited with %v after SIGTERM\n%s", s.exitErr, s.out.String())
	}
	return nil
}

// RestartTerm stops the server with SIGTERM (the pool kept), checks the
// segment is still there, and starts the same command line again on the
// same ports; it returns once NOOP answers, with the time from the signal.
func (s *Server) RestartTerm(t testing.TB) time.Duration {
	t.Helper()
	return s.RestartTermWith(t, nil)
}

// RestartTermWith is RestartTerm that runs between (when not nil) after
// the server stopped and before it starts again: what a hostile process
// could do to the kept pool during the gap.
func (s *Server) RestartTermWith(t testing.TB, between func()) time.Duration {
	t.Helper()
	args := s.cmd.Args[1:]
	start := time.Now()
	if err := s.stopKept(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{s.Segment, s.Private} {
		if _, err := os.Stat(filepath.Join("/dev/shm", name)); name != "" && err != nil {
			t.Fatalf("segment %s gone after a SIGTERM with --l1-keep-on-exit: %v\n%s", name, err, s.out.String())
		}
	}
	if between != nil {
		between()
	}
	s.launch(t, args)
	// Back means both faces answer: ZMQ, then /status (the HTTP API starts
	// after the engine).
	if err := s.WaitReady(15 * time.Second); err != nil {
		t.Fatalf("kvdock did not come back after SIGTERM: %v\n%s", err, s.out.String())
	}
	return time.Since(start)
}

// RestartSignal sends SIGUSR2 (kvdock re-executes itself, same pid) and
// returns once /status answers from the new process, with the time from
// the signal.
func (s *Server) RestartSignal(t testing.TB) time.Duration {
	t.Helper()
	return s.RestartBy(t, func() error { return s.cmd.Process.Signal(syscall.SIGUSR2) })
}

// RestartBy runs ask (a signal, `kvdock ctl restart`) and returns once
// /status answers from a process started after it, with the time taken.
// The pid must stay the same: a re-exec, not a new process.
func (s *Server) RestartBy(t testing.TB, ask func() error) time.Duration {
	t.Helper()
	before := s.kept(t).StartedAt
	if before == nil {
		t.Fatalf("/status has no started_at")
	}
	start := time.Now()
	if err := ask(); err != nil {
		t.Fatalf("restart: %v\n%s", err, s.out.String())
	}
	deadline := start.Add(20 * time.Second)
	for {
		select {
		case <-s.done:
			t.Fatalf("kvdock exited (%v) instead of re-executing itself\n%s", s.exitErr, s.out.String())
		default:
		}
		if st, err := s.keptStatus(); err == nil && st.StartedAt != nil && !st.StartedAt.Equal(*before) {
			if err := s.waitReady(15 * time.Second); err != nil {
				t.Fatalf("kvdock did not answer NOOP after re-executing: %v\n%s", err, s.out.String())
			}
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new process behind /status within 20 s of the restart\n%s", s.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// LastRestart is /status's restart block.
func (s *Server) LastRestart(t testing.TB) RestartStatus {
	t.Helper()
	return s.kept(t).Restart
}

// ShmName is the segment /status advertises now.
func (s *Server) ShmName(t testing.TB) string {
	t.Helper()
	return s.kept(t).ShmName
}

func (s *Server) kept(t testing.TB) keptStatus {
	t.Helper()
	st, err := s.keptStatus()
	if err != nil {
		t.Fatalf("/status: %v\n%s", err, s.out.String())
	}
	return st
}

func (s *Server) keptStatus() (keptStatus, error) {
	var st keptStatus
	hc := http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/status", s.HTTPPort))
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("GET /status: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("decode /status: %w", err)
	}
	return st, nil
}
