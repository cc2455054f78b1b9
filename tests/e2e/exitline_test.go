package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvdock/tests/harness"
)

// TestDashboardExitLine: after the dashboard gives the terminal back,
// kvdock leaves one line on it: what ran, for how long, where the log is
// (the dashboard sends the log to a file the operator never saw named).
func TestDashboardExitLine(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatalf("tmux is required (scripts/install-deps.sh installs it): %v", err)
	}
	bin := harness.Binary(t)
	logFile := filepath.Join(t.TempDir(), "k.log")
	m := tmux{t: t, socket: harness.UniqueName("kvdock-bye")}
	// The shell keeps the pane open after kvdock exits, to read the line.
	cmd := fmt.Sprintf("KVDOCK_CONFIG= %s --port %d --http-port 0 --shm-name %s --l1-size-gb 0.0625 --no-l1-prefault --log-file %s; echo EXITED $?; sleep 60",
		bin, harness.FreePort(t), harness.UniqueName("kvbye"), logFile)
	m.run("new-session", "-d", "-s", "kv", "-x", "250", "-y", "30", cmd)
	t.Cleanup(func() { _ = exec.Command("tmux", "-L", m.socket, "kill-server").Run() })
	m.waitFor("dashboard up", 20*time.Second, "SERVING")
	m.keys("q")
	deadline := time.Now().Add(10 * time.Second)
	var screen string
	for time.Now().Before(deadline) {
		screen = m.run("capture-pane", "-p", "-J", "-t", "kv")
		if strings.Contains(screen, "Quit kvdock?") {
			m.keys("y")
		}
		if strings.Contains(screen, "EXITED") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, want := range []string{"kvdock: dashboard on tcp://", "stopped by dashboard quit, exit 0; log: " + logFile, "EXITED 0"} {
		if !strings.Contains(screen, want) {
			t.Fatalf("the terminal lacks %q after quitting:\n%s", want, screen)
		}
	}
}

// TestCtlClearAsksOnATerminal: on a terminal, kvdock ctl clear asks y/N
// before it clears; "y" clears and says what went.
func TestCtlClearAsksOnATerminal(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatalf("tmux is required (scripts/install-deps.sh installs it): %v", err)
	}
	srv := harness.Start(t)
	m := tmux{t: t, socket: harness.UniqueName("kvdock-clear")}
	cmd := fmt.Sprintf("KVDOCK_CONFIG= KVDOCK_PORT=%d KVDOCK_HTTP_PORT=%d %s ctl clear; echo EXITED $?; sleep 60",
		srv.Port, srv.HTTPPort, harness.Binary(t))
	m.run("new-session", "-d", "-s", "kv", "-x", "250", "-y", "10", cmd)
	t.Cleanup(func() { _ = exec.Command("tmux", "-L", m.socket, "kill-server").Run() })
	m.waitFor("the question", 10*time.Second, "Clear every object", "[y/N]")
	m.keys("y", "Enter")
	m.waitFor("the answer", 10*time.Second, "cleared 0 objects (0 B)", "EXITED 0")
}
