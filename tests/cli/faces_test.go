package cli

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvdock/core/testkit/logbuf"
	"kvdock/tests/harness"
)

// TestVersionFlags: --version and -v answer what kvdock version does: the
// version, then the revision line (the commit, or why there is none).
func TestVersionFlags(t *testing.T) {
	code, want, stderr := kvdock(t, nil, "version")
	if code != 0 || !strings.HasPrefix(want, "kvdock ") || !strings.Contains(want, "\nrevision  ") || stderr != "" {
		t.Fatalf("kvdock version: exit %d, stdout %q, stderr %q", code, want, stderr)
	}
	for _, flag := range []string{"--version", "-v"} {
		code, out, stderr := kvdock(t, nil, flag)
		if code != 0 || out != want || stderr != "" {
			t.Errorf("kvdock %s: exit %d, stdout %q (want %q), stderr %q", flag, code, out, want, stderr)
		}
	}
}

// TestHelpFlagListsSubcommands: kvdock --help and -h print the commands,
// as kvdock help does, not only serve's flags.
func TestHelpFlagListsSubcommands(t *testing.T) {
	_, want, _ := kvdock(t, nil, "help")
	for _, flag := range []string{"--help", "-h"} {
		code, out, stderr := kvdock(t, nil, flag)
		if code != 0 || out != want || stderr != "" {
			t.Errorf("kvdock %s: exit %d, stderr %q, stdout:\n%s", flag, code, stderr, out)
		}
		for _, cmd := range []string{"kvdock serve", "kvdock ctl", "kvdock bench", "kvdock config", "kvdock version", "kvdock help", "--version"} {
			if !strings.Contains(out, cmd) {
				t.Errorf("kvdock %s lacks %q:\n%s", flag, cmd, out)
			}
		}
	}
}

// TestConfigInitWritesDefaultsCommented: the file config init writes sets
// nothing, so every value still reads as a default (a default that changes
// in a later release is not pinned by an old file), and uncommenting a line
// sets that key.
func TestConfigInitWritesDefaultsCommented(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kvdock.yaml")
	if code, _, stderr := kvdock(t, nil, "config", "init", file); code != 0 {
		t.Fatalf("config init: exit %d: %s", code, stderr)
	}
	body, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	code, out, stderr := kvdock(t, nil, "config", "show", "--sources", "--config", file)
	if code != 0 {
		t.Fatalf("config show: exit %d: %s", code, stderr)
	}
	if strings.Contains(out, file+":") {
		t.Fatalf("a value comes from the fresh file:\n%s\nthe file:\n%s", out, body)
	}
	uncommented := strings.Replace(string(body), "\n  # ratio: ", "\n  ratio: ", 1)
	if uncommented == string(body) {
		t.Fatalf("no commented eviction ratio in:\n%s", body)
	}
	if err := os.WriteFile(file, []byte(uncommented), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, stderr = kvdock(t, nil, "config", "show", "--sources", "--config", file)
	if code != 0 || strings.Count(out, file+":") != 1 || !strings.Contains(out, "ratio:") {
		t.Fatalf("after uncommenting the ratio: exit %d %s\n%s", code, stderr, out)
	}
}

// proc is a kvdock started with exactly the given arguments (the harness
// always passes --port, which would win over the file these tests edit).
type proc struct {
	cmd  *exec.Cmd
	out  *logbuf.Buffer
	done chan error
}

func startKvdock(t *testing.T, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(harness.Binary(t), args...), out: &logbuf.Buffer{}, done: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), "KVDOCK_CONFIG=")
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// waitFor waits until the output holds s, failing the test after 10 s.
func (p *proc) waitFor(t *testing.T, s string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.out.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in:\n%s", s, p.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// stop sends SIGTERM and returns the output once kvdock exited 0.
func (p *proc) stop(t *testing.T) string {
	t.Helper()
	p.signal(t, syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, p.out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no exit within 10 s of SIGTERM:\n%s", p.out.String())
	}
	return p.out.String()
}

func serveArgs(t *testing.T, file string, extra ...string) []string {
	return append([]string{"--headless", "--config", file, "--http-port", fmt.Sprint(harness.FreePort(t)),
		"--l1-size-gb", "0.0625", "--no-l1-prefault", "--shm-name", harness.UniqueName("kvfaces")}, extra...)
}

// TestSIGHUPSaysAFlagWins: a file change that a flag overrides is logged
// with the key, both values and the flag, not dropped in silence.
func TestSIGHUPSaysAFlagWins(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kvdock.yaml")
	write := func(ratio string) {
		if err := os.WriteFile(file, []byte("eviction:\n  ratio: "+ratio+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("0.2")
	p := startKvdock(t, serveArgs(t, file, "--port", fmt.Sprint(harness.FreePort(t)), "--eviction-ratio", "0.3")...)
	p.waitFor(t, "kvdock serving")
	write("0.4")
	p.signal(t, syscall.SIGHUP)
	p.waitFor(t, "SIGHUP: settings unchanged")
	out := p.stop(t)
	want := `SIGHUP: the file's value is overridden" key=eviction.ratio file=0.4 used=0.3 from=--eviction-ratio`
	if !strings.Contains(out, want) {
		t.Fatalf("no %q in:\n%s", want, out)
	}
}

// TestExitLineAfterAPortMove: after SIGHUP moved the wire server to
// another port, the exit line names the new endpoint.
func TestExitLineAfterAPortMove(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kvdock.yaml")
	write := func(port int) {
		if err := os.WriteFile(file, []byte(fmt.Sprintf("server:\n  port: %d\n", port)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	first, second := harness.FreePort(t), harness.FreePort(t)
	write(first)
	p := startKvdock(t, serveArgs(t, file)...)
	p.waitFor(t, "kvdock serving")
	write(second)
	p.signal(t, syscall.SIGHUP)
	p.waitFor(t, "SIGHUP: applied")
	out := p.stop(t)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := lines[len(lines)-1]
	if want := fmt.Sprintf("kvdock: headless on tcp://127.0.0.1:%d ran ", second); !strings.HasPrefix(last, want) {
		t.Fatalf("exit line %q, want it to start %q; output:\n%s", last, want, out)
	}
}
