// Package redisserver runs real redis-server processes for tests: standalone
// servers and small Redis Clusters, each on free loopback ports, with no
// persistence, killed at the test's cleanup. The tests of the resp tier and
// the end-to-end tier tests share it. Debian's redis-server (and redis-tools
// for redis-cli) come from scripts/install-deps.sh; where they are missing a
// test is skipped on a developer's machine and fails under CI (CI is set),
// so the tier tests can never silently not run there.
package redisserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kvdock/core/testkit/logbuf"
)

// startLimit bounds how long a server may take to say it is ready.
const startLimit = 20 * time.Second

// Need skips t (fails it under CI) when redis-server or redis-cli is missing.
func Need(t testing.TB) {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			msg := fmt.Sprintf("%s not found (scripts/install-deps.sh test installs redis-server and redis-tools): %v", bin, err)
			if os.Getenv("CI") != "" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
}

// Options shape one server.
type Options struct {
	// Password, when set, is required of every client (requirepass).
	Password string
	// Port to listen on; 0 picks a free loopback port.
	Port int
	// Cluster starts the server with cluster mode on (its bus on a second free port).
	Cluster bool
	// TLS, when set, makes Port a TLS port (plain TCP is off); see NewTLS.
	TLS *TLSFiles
	// Args are extra redis-server arguments (e.g. "--maxmemory", "1mb").
	Args []string
}

// Server is one redis-server process listening on 127.0.0.1.
type Server struct {
	t    testing.TB
	opts Options
	dir  string
	// Port and Addr ("127.0.0.1:port") stay the same across Restart.
	Port int
	Addr string
	bus  int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
	log  *logbuf.Buffer
}

// Start starts a server and registers its kill with t.Cleanup.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	Need(t)
	s := &Server{t: t, opts: opts, dir: t.TempDir()}
	t.Cleanup(s.Kill)
	var err error
	// A free port can be taken by someone else before redis binds it: retry.
	for range 5 {
		s.Port = opts.Port
		if s.Port == 0 {
			if s.Port, err = FreePort(); err != nil {
				t.Fatal(err)
			}
		}
		if opts.Cluster {
			if s.bus, err = FreePort(); err != nil {
				t.Fatal(err)
			}
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
		if err = s.start(); err == nil || opts.Port != 0 {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) start() error {
	port := []string{"--port", strconv.Itoa(s.Port)}
	if f := s.opts.TLS; f != nil {
		port = []string{"--port", "0", "--tls-port", strconv.Itoa(s.Port),
			"--tls-cert-file", f.CertFile, "--tls-key-file", f.KeyFile,
			"--tls-ca-cert-file", f.CAFile, "--tls-auth-clients", "no"}
	}
	args := append(port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", "", "--daemonize", "no", "--protected-mode", "yes")
	if s.opts.Password != "" {
		args = append(args, "--requirepass", s.opts.Password)
	}
	if s.opts.Cluster {
		args = append(args, "--cluster-enabled", "yes",
			"--cluster-config-file", s.dir+"/nodes.conf",
			"--cluster-port", strconv.Itoa(s.bus),
			"--cluster-node-timeout", "2000")
	}
	args = append(args, s.opts.Args...)
	cmd := exec.Command("redis-server", args...)
	lb := &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = lb, lb
	// The server dies with the test process even when cleanup never runs.
	// The parent-death signal fires when the thread that started the child
	// exits, not the process: a goroutine that locks its thread and ends
	// (the tier's write-behind writers do) ends that thread, and a server
	// started from it would die mid-test. So the server is started, and
	// waited for, on a thread locked for its whole life.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends after the server
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(done)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	s.mu.Lock()
	s.cmd, s.done, s.log = cmd, done, lb
	s.mu.Unlock()
	ready := make(chan error, 1)
	go func() { ready <- lb.Wait("Ready to accept connections", startLimit) }()
	select {
	case err := <-ready:
		if err != nil {
			s.Kill()
			return fmt.Errorf("redis-server on %s not ready: %w\n%s", s.Addr, err, lb.String())
		}
		return nil
	case <-done:
		return fmt.Errorf("redis-server on %s exited at start:\n%s", s.Addr, lb.String())
	}
}

// Kill SIGKILLs the server (as a crash would) and waits for it to exit.
// Killing a stopped server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Pause stops the server with SIGSTOP: connections stay open, nothing is
// answered (a server hung or descheduled). Resume sends SIGCONT; a paused
// server is resumed at cleanup too, so that it can be killed.
func (s *Server) Pause() {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGSTOP)
		s.t.Cleanup(s.Resume)
	}
}

// Resume continues a paused server.
func (s *Server) Resume() {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGCONT)
	}
}

// Restart starts a killed server again on the same port, empty.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	var err error
	// The port may linger a moment after the kill; retry binding briefly.
	deadline := time.Now().Add(startLimit)
	for {
		if err = s.start(); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatal(err)
	}
}

// Log returns what the server printed since its last start.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.log == nil {
		return ""
	}
	return s.log.String()
}

// Do sends one command (arguments without spaces) and returns the reply's
// first line, or a bulk reply's body: enough for the harness's own checks.
func (s *Server) Do(ctx context.Context, args ...string) (string, error) {
	return Do(ctx, s.Addr, s.opts.Password, args...)
}

// Do sends one command to addr (authenticating first when password is set).
func Do(ctx context.Context, addr, password string, args ...string) (string, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", fmt.Errorf("dial %s: %w", addr, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	r := bufio.NewReader(c)
	if password != "" {
		if _, err := roundTrip(c, r, "AUTH", password); err != nil {
			return "", err
		}
	}
	return roundTrip(c, r, args...)
}

func roundTrip(c net.Conn, r *bufio.Reader, args ...string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", fmt.Errorf("send %s: %w", args[0], err)
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read reply to %s: %w", args[0], err)
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case strings.HasPrefix(line, "-"):
		return "", fmt.Errorf("%s: %s", args[0], line[1:])
	case strings.HasPrefix(line, "$"):
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", nil
		}
		body := make([]byte, n+2)
		if _, err := io.ReadFull(r, body); err != nil {
			return "", fmt.Errorf("read bulk reply to %s: %w", args[0], err)
		}
		return string(body[:n]), nil
	default:
		return line[1:], nil
	}
}

// Cluster is a Redis Cluster of servers with all slots assigned, no replicas.
type Cluster struct {
	Nodes []*Server
}

// Addrs lists the nodes' "127.0.0.1:port" addresses.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr
	}
	return out
}

// StartCluster starts n cluster-mode servers, joins them with
// redis-cli --cluster create, and waits until every node reports the
// cluster state ok.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{}
	for range n {
		c.Nodes = append(c.Nodes, Start(t, Options{Cluster: true}))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), startLimit)
	defer cancel()
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, node := range c.Nodes {
		if err := waitClusterOK(ctx, node); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	return c
}

// waitClusterOK polls CLUSTER INFO: gossip has no event a test can wait on.
func waitClusterOK(ctx context.Context, s *Server) error {
	for {
		info, err := s.Do(ctx, "CLUSTER", "INFO")
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("cluster node %s never reported state ok", s.Addr), err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
