// Package e2e drives the real kvdock binary as an operator would: the
// dashboard in a tmux pane, fed keys, read back with capture-pane.
package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvdock/tests/harness"
)

// tmux runs a tmux command on this test's private server socket.
type tmux struct {
	t      *testing.T
	socket string
}

func (m tmux) run(args ...string) string {
	m.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", m.socket}, args...)...).CombinedOutput()
	if err != nil {
		m.t.Fatalf("tmux %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func (m tmux) capture() string { return m.run("capture-pane", "-p", "-t", "kv") }

func (m tmux) keys(keys ...string) { m.run(append([]string{"send-keys", "-t", "kv"}, keys...)...) }

// waitFor polls the pane until every want string is on it. The limits only
// bound a failure: a loaded machine may take seconds to redraw.
func (m tmux) waitFor(what string, limit time.Duration, want ...string) string {
	m.t.Helper()
	deadline := time.Now().Add(limit)
	var screen string
	for time.Now().Before(deadline) {
		screen = m.capture()
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(screen, w)
		}
		if ok {
			return screen
		}
		time.Sleep(200 * time.Millisecond)
	}
	m.t.Fatalf("%s: %q not on screen after %v:\n%s", what, want, limit, screen)
	return ""
}

// paneProcess opens the pane's process (kvdock itself: the pane command
// execs it) as a pidfd, which becomes readable when the process exits.
func (m tmux) paneProcess() int {
	m.t.Helper()
	out := strings.TrimSpace(m.run("display-message", "-p", "-t", "kv", "#{pane_pid}"))
	pid, err := strconv.Atoi(out)
	if err != nil {
		m.t.Fatalf("pane pid %q: %v", out, err)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		m.t.Fatalf("pidfd of kvdock (pid %d): %v", pid, err)
	}
	m.t.Cleanup(func() { _ = unix.Close(fd) })
	return fd
}

// exited waits until the process behind pidfd fd has exited, up to limit.
func exited(fd int, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n > 0
	}
}

func register(t *testing.T, endpoint string, id int, forcePickle bool) {
	t.Helper()
	params := fmt.Sprintf(`{"instance_id": %d, "model": "tmux-model", "force_pickle": %v, "dtype": "float16"}`, id,
		map[bool]string{true: "true", false: "false"}[forcePickle])
	harness.RunPython(t, 60*time.Second, "../interop/py/lmcache_worker.py", endpoint, "register", params)
}

// contextRow returns the contexts-table line of instance id.
func contextRow(screen string, id int) string {
	for _, l := range strings.Split(screen, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && strings.TrimLeft(f[0], ">*▶ ") == fmt.Sprint(id) {
			return l
		}
		if len(f) > 1 && f[1] == fmt.Sprint(id) {
			return l
		}
	}
	return ""
}

func TestDashboardInTmux(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatalf("tmux is required (scripts/install-deps.sh installs it): %v", err)
	}
	bin := harness.Binary(t)
	port, httpPort := harness.FreePort(t), harness.FreePort(t)
	name := harness.UniqueName("kvtmux")
	endpoint := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	logFile := filepath.Join(t.TempDir(), "kvdock.log")
	m := tmux{t: t, socket: harness.UniqueName("kvdock-e2e")}
	cmd := fmt.Sprintf("exec env KVDOCK_CONFIG= %s --port %d --http-port %d --shm-name %s --l1-size-gb 0.0625 --no-l1-prefault --chunk-size 16 --log-file %s",
		bin, port, httpPort, name, logFile)
	m.run("new-session", "-d", "-s", "kv", "-x", "160", "-y", "48", cmd)
	t.Cleanup(func() {
		_ = exec.Command("tmux", "-L", m.socket, "kill-server").Run()
	})
	m.waitFor("dashboard up", 20*time.Second, "SERVING", endpoint)
	kvdock := m.paneProcess()

	// One worker attaches the segment, the other cannot (it behaves as a
	// pickle worker); kvdock notices the fallback on its first store.
	register(t, endpoint, 101, false)
	register(t, endpoint, 102, true)
	screen := m.waitFor("two contexts", 10*time.Second, "SHM", "PICKLE")
	if r := contextRow(screen, 101); !strings.Contains(r, "SHM") {
		t.Fatalf("instance 101 row %q, want SHM:\n%s", r, screen)
	}
	if r := contextRow(screen, 102); !strings.Contains(r, "PICKLE") {
		t.Fatalf("instance 102 row %q, want PICKLE:\n%s", r, screen)
	}
	// The fallback is an event: the events pane shows it, with the reason.
	m.keys("4")
	m.waitFor("fallback event", 15*time.Second, "fallback", "instance 102 (tmux-model): worker fell back: could not attach")
	// The pane heads with the latency of the requests the workers sent
	// (sampled once a second), a p99 sparkline beside each kind.
	m.waitFor("request latency", 10*time.Second, "REQUEST, LAST MIN", "P99 EACH SECOND", "REGISTER")

	// Settings pane: server.shm_name → "" (SHM off), apply, confirm.
	m.keys("5")
	m.waitFor("settings pane", 15*time.Second, "server.shm_name")
	m.keys("/", "shm_name", "Enter")
	m.keys("Enter")
	m.keys("C-u", "Enter")
	m.keys("a")
	m.waitFor("apply confirmation", 15*time.Second, "REBUILD", "cache will be cleared")
	m.keys("y")
	m.waitFor("restart with SHM off", 20*time.Second, "SERVING", "applied")

	m.keys("2")
	m.waitFor("pool pane says why", 15*time.Second, "(private, not advertised)", `--shm-name "" given`)

	// A newly registered worker gets pickle.
	register(t, endpoint, 103, false)
	m.keys("1")
	screen = m.waitFor("new worker", 10*time.Second, "[1 Contexts]", "PICKLE   ") // the header also says PICKLE
	if r := contextRow(screen, 103); !strings.Contains(r, "PICKLE") {
		t.Fatalf("instance 103 row %q, want PICKLE:\n%s", r, screen)
	}
	if contextRow(screen, 101) != "" {
		t.Fatalf("contexts of the old segment survived the rebuild:\n%s", screen)
	}

	// q asks because a worker is registered; y quits and the segment goes.
	m.keys("q")
	m.waitFor("quit confirmation", 15*time.Second, "Quit kvdock?")
	m.keys("y")
	if !exited(kvdock, 10*time.Second) {
		t.Fatalf("kvdock did not exit after quit:\n%s", m.capture())
	}
}

// A terminal that goes away (SIGHUP to the dashboard) stops kvdock cleanly:
// it must not run on without a screen, holding its segment.
func TestDashboardStopsWhenTheTerminalHangsUp(t *testing.T) {
	bin := harness.Binary(t)
	name := harness.UniqueName("kvhup")
	segment := filepath.Join("/dev/shm", "lmcache_l1_pool_"+name)
	m := tmux{t: t, socket: harness.UniqueName("kvdock-hup")}
	cmd := fmt.Sprintf("exec env KVDOCK_CONFIG= %s --port %d --http-port 0 --shm-name %s --l1-size-gb 0.0625 --no-l1-prefault --log-file %s",
		bin, harness.FreePort(t), name, filepath.Join(t.TempDir(), "kvdock.log"))
	m.run("new-session", "-d", "-s", "kv", "-x", "100", "-y", "30", cmd)
	t.Cleanup(func() {
		// Should the test fail, no kvdock may outlive it holding its segment.
		_ = exec.Command("pkill", "-f", "--shm-name "+name+" ").Run()
		_ = os.Remove(segment)
	})
	m.waitFor("dashboard up", 20*time.Second, "SERVING")
	kvdock := m.paneProcess()
	if _, err := os.Stat(segment); err != nil {
		t.Fatalf("segment missing while serving: %v", err)
	}
	m.run("kill-server") // the pane's terminal hangs up
	if !exited(kvdock, 5*time.Second) {
		t.Fatalf("kvdock still running 5 s after its terminal hung up")
	}
	if _, err := os.Stat(segment); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("kvdock exited leaving %s (stat: %v)", segment, err)
	}
}
