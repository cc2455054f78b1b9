package harness

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// PyWorker is a long-lived Python worker script (tests/interop/py): the
// test reads its JSON lines and writes command lines to its stdin in
// between. It is killed when the test ends.
type PyWorker struct {
	t     testing.TB
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	errb  strings.Builder
}

// StartPyWorker runs script with args under /usr/bin/python3.
func StartPyWorker(t testing.TB, script string, args ...string) *PyWorker {
	t.Helper()
	var err error
	w := &PyWorker{t: t, lines: make(chan string, 16)}
	w.cmd = exec.Command(Python, append([]string{script}, args...)...)
	w.cmd.Stderr = &w.errb
	if w.stdin, err = w.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
		close(w.lines)
	}()
	t.Cleanup(func() {
		_ = w.cmd.Process.Kill()
		_ = w.cmd.Wait()
	})
	return w
}

// Next decodes the worker's next JSON line (60 s at most: a generous bound
// on a busy machine, not a timing assertion).
func (w *PyWorker) Next() map[string]any {
	w.t.Helper()
	select {
	case line, ok := <-w.lines:
		if !ok {
			_ = w.cmd.Wait()
			w.t.Fatalf("worker exited: %s", w.errb.String())
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			w.t.Fatalf("worker line %q: %v", line, err)
		}
		return m
	case <-time.After(60 * time.Second):
		w.t.Fatalf("worker said nothing for 60 s; stderr: %s", w.errb.String())
	}
	return nil
}

// Send writes one command line to the worker's stdin.
func (w *PyWorker) Send(line string) {
	w.t.Helper()
	if _, err := io.WriteString(w.stdin, line+"\n"); err != nil {
		w.t.Fatalf("worker stdin: %v", err)
	}
}

// Kill sends SIGKILL and waits for the process to go.
func (w *PyWorker) Kill() {
	w.t.Helper()
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		w.t.Fatal(err)
	}
	_ = w.cmd.Wait()
}

// LMCacheWorker runs one scenario of tests/interop/py/lmcache_worker.py
// (an emulated LMCache non-GPU worker: pyzmq, msgpack, torch) under python
// against srv and decodes the JSON it prints.
func LMCacheWorker(t testing.TB, python string, srv *Server, scenario string, params map[string]any) map[string]any {
	t.Helper()
	p, err := json.Marshal(params)
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(repoRoot(), "tests", "interop", "py", "lmcache_worker.py")
	out := RunPythonWith(t, python, 120*time.Second, script, srv.Endpoint, scenario, string(p))
	var res map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &res); err != nil {
		t.Fatalf("worker output %q: %v", out, err)
	}
	return res
}

// Run runs the kvdock binary with args and the extra environment (no
// settings file), and returns its combined output.
func Run(t testing.TB, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(Binary(t), args...)
	cmd.Env = append(append(os.Environ(), "KVDOCK_CONFIG="), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
