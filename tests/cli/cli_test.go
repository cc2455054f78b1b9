// Package cli checks kvdock's command line as an operator meets it: exit
// codes, messages that name the culprit, help, config show, signals.
package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvdock/tests/harness"
)

// kvdock runs the binary with env added to a clean environment and returns
// its exit code, stdout and stderr.
func kvdock(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	bin := harness.Binary(t) // a first call builds it: not within the run's deadline
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "KVDOCK_CONFIG="}, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errb.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errb.String()
	}
	t.Fatalf("kvdock %v: %v", args, err)
	return 0, "", ""
}

func TestInvalidSettingsExit2NamingTheSource(t *testing.T) {
	code, _, stderr := kvdock(t, nil, "--headless", "--l1-size-gb", "-1")
	if code != 2 || !strings.Contains(stderr, "--l1-size-gb") || !strings.Contains(stderr, "must be > 0") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	// Every problem at once, each with its source.
	code, _, stderr = kvdock(t, []string{"KVDOCK_EVICTION_RATIO=2"}, "--headless", "--port", "0", "--hash-algorithm", "sha256")
	if code != 2 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"KVDOCK_EVICTION_RATIO", "--port", "--hash-algorithm"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr does not name %s:\n%s", want, stderr)
		}
	}
	code, _, stderr = kvdock(t, nil, "--headless", "--transfer-mode", "gpu")
	if code != 2 || !strings.Contains(stderr, "CUDA") {
		t.Fatalf("--transfer-mode gpu: exit %d\n%s", code, stderr)
	}
}

// A pool larger than the host's available memory is an
// invalid setting (exit 2, both sizes named), not a start that prefaults
// until the OOM killer comes.
func TestPoolLargerThanMemoryExit2(t *testing.T) {
	code, stdout, stderr := kvdock(t, nil, "--headless", "--l1-size-gb", "50000", "--no-l1-prefault", "--port", "1")
	if code != 2 {
		t.Fatalf("exit %d, stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"l1.size_gb = 50000 (from --l1-size-gb)", "the pool needs 48.8 TiB", "GiB available", "--l1-allow-overcommit"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
}

func TestConfigShowSources(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kvdock.yaml")
	if err := os.WriteFile(file, []byte("server:\n  chunk_size: 128\nl1:\n  size_gb: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := kvdock(t, []string{"KVDOCK_EVICTION_RATIO=0.5"},
		"config", "show", "--sources", "--config", file, "--port", "6000")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"chunk_size: 128", file + ":2",
		"size_gb: 2", file + ":4",
		"ratio: 0.5", "KVDOCK_EVICTION_RATIO",
		"port: 6000", "--port",
		"hash_algorithm: blake3", "default",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("config show --sources lacks %q:\n%s", want, out)
		}
	}
}

func TestHelpOnEveryCommand(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"--help"}, {"serve", "--help"}, {"help", "serve"}, {"ctl", "--help"}, {"config", "--help"}, {"version"}} {
		code, out, stderr := kvdock(t, nil, args...)
		if code != 0 || out+stderr == "" {
			t.Errorf("kvdock %v: exit %d", args, code)
		}
	}
	_, out, _ := kvdock(t, nil, "serve", "--help")
	for _, want := range []string{"--l1-size-gb", "KVDOCK_L1_SIZE_GB", "--shm-name", "--no-l1-use-lazy", "(default 5555)"} {
		if !strings.Contains(out, want) {
			t.Errorf("serve --help lacks %q", want)
		}
	}
	if code, _, _ := kvdock(t, nil, "frobnicate"); code != 2 {
		t.Errorf("unknown command exit %d, want 2", code)
	}
}

func TestSIGTERMStopsWithin5sAndRemovesSegment(t *testing.T) {
	srv := harness.Start(t) // Stop checks exit 0 within 5 s and no segment left
	if _, err := os.Stat(filepath.Join("/dev/shm", srv.Segment)); err != nil {
		t.Fatalf("segment missing while serving: %v", err)
	}
	start := time.Now()
	srv.Stop(t)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("stop took %v", d)
	}
}

func TestSIGHUPAppliesTheFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kvdock.yaml")
	write := func(ratio string) {
		if err := os.WriteFile(file, []byte("eviction:\n  ratio: "+ratio+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("0.2")
	srv := harness.Start(t, "--config", file)
	write("0.4")
	if err := syscall.Kill(srv.PID(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second) // bounds a failure only
	for time.Now().Before(deadline) {
		if strings.Contains(srv.Output(), "SIGHUP: applied") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	out := srv.Output()
	if !strings.Contains(out, "SIGHUP: applied") || !strings.Contains(out, "eviction.ratio") || !strings.Contains(out, "class=live") {
		t.Fatalf("SIGHUP did not apply the file:\n%s", out)
	}
	// Still serving.
	c := srv.Dial(t, srv.Protocol)
	if r, err := c.Call(context.Background(), "NOOP"); err != nil || !r.Present {
		t.Fatalf("NOOP after SIGHUP: %v", err)
	}
}
