package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvdock/core/hostmem"
)

// `kvdock config check` warns (stderr, exit 0) of a pool above 80 % of the
// host's available memory, says nothing of a small one, and refuses one
// past all of it (exit 2) as serve does, unless overcommit is allowed.
func TestConfigCheckWarnsOfMemory(t *testing.T) {
	avail, err := hostmem.Probe{}.MemAvailable()
	if err != nil {
		t.Fatal(err)
	}
	check := func(sizeGB float64, env ...string) (int, string, string) {
		t.Helper()
		file := filepath.Join(t.TempDir(), "kvdock.yaml")
		if err := os.WriteFile(file, []byte(fmt.Sprintf("l1:\n  size_gb: %.3f\n", sizeGB)), 0o600); err != nil {
			t.Fatal(err)
		}
		return kvdock(t, env, "config", "check", file)
	}
	gb := float64(avail) / (1 << 30)
	if code, out, stderr := check(0.9 * gb); code != 0 || !strings.HasSuffix(out, ": ok\n") ||
		!strings.Contains(stderr, "warning: the pool (l1.size_gb) takes") || !strings.Contains(stderr, "above 80 %") {
		t.Fatalf("90 %% of MemAvailable: exit %d, out %q, stderr %q", code, out, stderr)
	}
	if code, _, stderr := check(0.1 * gb); code != 0 || stderr != "" {
		t.Fatalf("10 %% of MemAvailable: exit %d, stderr %q", code, stderr)
	}
	if code, out, stderr := check(3 * gb); code != 2 || out != "" || !strings.Contains(stderr, "the pool needs") ||
		!strings.Contains(stderr, "--l1-allow-overcommit") {
		t.Fatalf("3× MemAvailable: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	if code, out, stderr := check(3*gb, "KVDOCK_L1_ALLOW_OVERCOMMIT=true"); code != 0 || !strings.HasSuffix(out, ": ok\n") ||
		!strings.Contains(stderr, "l1.allow_overcommit lets it start") {
		t.Fatalf("3× MemAvailable, overcommit allowed: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
}

// The refusal of a pool past the host's memory says its heading once.
func TestPoolRefusalHeadingOnce(t *testing.T) {
	code, _, stderr := kvdock(t, nil, "--headless", "--l1-size-gb", "50000", "--no-l1-prefault", "--port", "1")
	if code != 2 || strings.Count(stderr, "invalid settings") != 1 || !strings.HasPrefix(stderr, "kvdock: invalid settings (1 problem):") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
}

// TestConfigCheckRefusesWhatServeRefuses: config check and serve run one
// validation, the file, KVDOCK_* and flags applied: whatever serve refuses
// (here a pool past the host's memory from the file, a size from the
// environment, a policy from a flag), check refuses too, exit 2, with the
// same problem lines.
func TestConfigCheckRefusesWhatServeRefuses(t *testing.T) {
	dir := t.TempDir()
	huge := filepath.Join(dir, "huge.yaml")
	small := filepath.Join(dir, "small.yaml")
	for file, body := range map[string]string{huge: "l1:\n  size_gb: 50000\n", small: "l1:\n  size_gb: 0.0625\n"} {
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	problems := func(stderr string) string {
		_, rest, _ := strings.Cut(stderr, "invalid settings")
		return rest
	}
	for _, tc := range []struct {
		name  string
		env   []string
		file  string
		flags []string
		want  string
	}{
		{"pool past the host's memory", nil, huge, nil, "l1.size_gb = 50000 (from " + huge + ":2): the pool needs"},
		{"env", []string{"KVDOCK_L1_SIZE_GB=-2"}, small, nil, "l1.size_gb = -2 (from KVDOCK_L1_SIZE_GB): must be > 0"},
		{"flag", nil, small, []string{"--eviction-policy", "fifo"}, `eviction.policy = "fifo" (from --eviction-policy): accepted:`},
	} {
		code, out, checkErr := kvdock(t, tc.env, append(append([]string{"config", "check"}, tc.flags...), tc.file)...)
		if code != 2 || out != "" || !strings.Contains(checkErr, tc.want) {
			t.Errorf("%s: config check exit %d, stdout %q, stderr %q (want %q)", tc.name, code, out, checkErr, tc.want)
			continue
		}
		code, _, serveErr := kvdock(t, tc.env, append([]string{"--headless", "--no-l1-prefault", "--config", tc.file}, tc.flags...)...)
		if code != 2 || problems(serveErr) != problems(checkErr) {
			t.Errorf("%s: serve exit %d; its problems\n%s\ndiffer from check's\n%s", tc.name, code, serveErr, checkErr)
		}
	}
}
