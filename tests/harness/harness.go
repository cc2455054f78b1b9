// Package harness runs the real kvdock binary for the end-to-end tests in
// tests/: it builds the binary once per test process, starts it on free
// ports with a segment name of its own, waits until it answers, and stops it
// with SIGTERM, checking that it exits 0 and leaves no segment behind.
package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kvdock/assets"
	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/core/testkit/logbuf"
)

// Python is the interpreter the interop tests use: Debian's, with
// python3-zmq, python3-msgpack and python3-torch.
const Python = "/usr/bin/python3"

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// repoRoot is the module root, found from this file's location.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Binary builds kvdock once for this test process and returns its path.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvdock-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "kvdock")
		cmd := exec.Command("go", "build", "-o", binPath, ".")
		cmd.Dir = repoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// FreePort returns a TCP port that was free a moment ago on 127.0.0.1 and
// that no earlier call in this process returned: the kernel may hand the
// port it just freed to the next bind to port 0, so two calls in a row (a
// server's wire and HTTP ports) could otherwise name the same port.
func FreePort(t testing.TB) int {
	t.Helper()
	given.Lock()
	defer given.Unlock()
	if given.ports == nil {
		given.ports = map[int]bool{}
	}
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if !given.ports[port] {
			given.ports[port] = true
			return port
		}
	}
	t.Fatal("no free port this process has not handed out already, in 100 tries")
	return 0
}

// given is the ports FreePort returned in this process.
var given struct {
	sync.Mutex
	ports map[int]bool
}

var nameSeq struct {
	sync.Mutex
	n int
}

// UniqueName is a segment name no other test uses.
func UniqueName(prefix string) string {
	nameSeq.Lock()
	defer nameSeq.Unlock()
	nameSeq.n++
	return fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), nameSeq.n)
}

// Server is a kvdock process.
type Server struct {
	Port     int
	HTTPPort int
	Endpoint string
	// Segment is the /dev/shm name when the server was given --shm-name NAME.
	Segment string
	// Private is the unadvertised segment behind a pool that is not shared
	// (StartKeepingPickle), as /status names it.
	Private string
	// Protocol is the profile the server speaks (--protocol, else nongpu-v1).
	Protocol    string
	autoDefault string // --protocol-auto-default, else rpc-messages
	bin         string // the binary to run; "" = Binary's
	cmd         *exec.Cmd
	out         *logbuf.Buffer
	done        chan struct{}
	exitErr     error
}

// Start runs kvdock --headless on free ports with extra flags, and waits
// until NOOP answers. Unless the flags name --shm-name, the server gets a
// unique one (so parallel test binaries never meet). The server is stopped
// (SIGTERM, exit 0 checked) when the test ends.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	s := &Server{Port: FreePort(t), HTTPPort: FreePort(t)}
	args := s.baseArgs()
	hasName := false
	s.Protocol, s.autoDefault = "nongpu-v1", "rpc-messages"
	for i, a := range extra {
		if a == "--protocol" && i+1 < len(extra) {
			s.Protocol = extra[i+1]
		}
		if a == "--protocol-auto-default" && i+1 < len(extra) {
			s.autoDefault = extra[i+1]
		}
		if a == "--shm-name" || strings.HasPrefix(a, "--shm-name=") {
			hasName = true
			if a == "--shm-name" && i+1 < len(extra) && extra[i+1] != "" {
				s.Segment = "lmcache_l1_pool_" + strings.TrimPrefix(extra[i+1], "/")
			}
		}
	}
	if !hasName {
		name := UniqueName("kvtest")
		args = append(args, "--shm-name", name)
		s.Segment = "lmcache_l1_pool_" + name
	}
	s.out = &logbuf.Buffer{}
	s.launch(t, append(args, extra...))
	t.Cleanup(func() { s.Stop(t) })
	if err := s.waitReady(15 * time.Second); err != nil {
		t.Fatalf("kvdock did not come up: %v\n%s", err, s.out.String())
	}
	// The HTTP API starts after the wire server: a loaded machine can
	// leave a gap between the two that a test's first POST falls into.
	if err := s.waitHTTP(15 * time.Second); err != nil {
		t.Fatalf("kvdock's HTTP API did not come up: %v\n%s", err, s.out.String())
	}
	return s
}

// waitHTTP waits up to limit for the HTTP port to accept a connection.
func (s *Server) waitHTTP(limit time.Duration) error {
	addr := fmt.Sprintf("127.0.0.1:%d", s.HTTPPort)
	deadline := time.Now().Add(limit)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			return c.Close()
		}
		if done, exit := s.Exited(); done {
			return fmt.Errorf("exited: %v", exit)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// baseArgs are the flags every test server gets: headless on s's ports,
// a 64 MiB pool left unfaulted, debug logs.
func (s *Server) baseArgs() []string {
	return []string{"--headless", "--port", fmt.Sprint(s.Port), "--http-port", fmt.Sprint(s.HTTPPort),
		"--l1-size-gb", "0.0625", "--no-l1-prefault", "--log-level", "debug"}
}

// launch starts the binary with args, its output appended to s.out, and
// sets s.Endpoint; it does not wait for the server to answer.
func (s *Server) launch(t testing.TB, args []string) {
	t.Helper()
	bin := s.bin
	if bin == "" {
		bin = Binary(t)
	}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Env = append(os.Environ(), "KVDOCK_CONFIG=")
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	s.done = done
	cmd := s.cmd
	go func() {
		s.exitErr = cmd.Wait()
		close(done)
	}()
	s.Endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", s.Port)
}

// Profile is the named embedded protocol profile.
func Profile(t testing.TB, name string) *protocol.Profile {
	t.Helper()
	p, err := protocol.Load(name, assets.Protocol)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (s *Server) waitReady(limit time.Duration) error {
	name := s.Protocol
	if name == "auto" {
		name = s.autoDefault // what kvdock ctl speaks under auto
	}
	p, err := protocol.Load(name, assets.Protocol)
	if err != nil {
		return err
	}
	c, err := client.Dial(s.Endpoint, p, client.Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("exited: %v", s.exitErr)
		default:
		}
		r, err := c.Call(context.Background(), protocol.Noop)
		if err == nil && r.Present {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("NOOP did not answer")
}

// Output is what the server printed so far.
func (s *Server) Output() string { return s.out.String() }

// PID is the server's process id.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Stop sends SIGTERM and checks the server exits 0 within 5 s and leaves
// no segment. Calling it twice is fine.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.StopWithin(t, 5*time.Second)
}

// StopWithin is Stop with another limit on the exit, for servers stopped
// under load (their drain may take its full timeout).
func (s *Server) StopWithin(t testing.TB, limit time.Duration) {
	t.Helper()
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(limit):
		_ = s.cmd.Process.Kill()
		<-s.done
		t.Errorf("kvdock did not stop within %v of SIGTERM\n%s", limit, s.out.String())
		return
	}
	if s.exitErr != nil {
		t.Errorf("kvdock exited with %v after SIGTERM\n%s", s.exitErr, s.out.String())
	}
	if s.Segment != "" {
		if _, err := os.Stat(filepath.Join("/dev/shm", s.Segment)); err == nil {
			t.Errorf("segment %s left behind after SIGTERM", s.Segment)
		}
	}
}

// Kill sends SIGKILL and waits for the process to go.
func (s *Server) Kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

// Dial connects a Go client to the server, 5 s a call.
func (s *Server) Dial(t testing.TB, profile string) *client.Client {
	t.Helper()
	return s.DialWith(t, profile, 5*time.Second)
}

// DialWith is Dial with another per-call timeout.
func (s *Server) DialWith(t testing.TB, profile string, timeout time.Duration) *client.Client {
	t.Helper()
	return dial(t, s.Endpoint, profile, timeout)
}

// dial connects a Go client speaking profile to endpoint, closed when the
// test ends.
func dial(t testing.TB, endpoint, profile string, timeout time.Duration) *client.Client {
	t.Helper()
	c, err := client.Dial(endpoint, Profile(t, profile), client.Options{Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// RunPython runs a script from dir with args under /usr/bin/python3 and
// returns its stdout; a non-zero exit fails the test with stderr.
func RunPython(t testing.TB, timeout time.Duration, script string, args ...string) string {
	t.Helper()
	return RunPythonWith(t, Python, timeout, script, args...)
}

// RunPythonWith is RunPython under another interpreter (the torch 2.x one of
// scripts/torch2-env.sh).
func RunPythonWith(t testing.TB, python string, timeout time.Duration, script string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, append([]string{script}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %v: %v\nstdout: %s\nstderr: %s", script, args, err, stdout.String(), stderr.String())
	}
	return stdout.String()
}
