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
// host's available memory, says nothing of a small one, and says serve
// refuses one past all of it.
func TestConfigCheckWarnsOfMemory(t *testing.T) {
	avail, err := hostmem.Probe{}.MemAvailable()
	if err != nil {
		t.Fatal(err)
	}
	check := func(sizeGB float64) (int, string, string) {
		t.Helper()
		file := filepath.Join(t.TempDir(), "kvdock.yaml")
		if err := os.WriteFile(file, []byte(fmt.Sprintf("l1:\n  size_gb: %.3f\n", sizeGB)), 0o600); err != nil {
			t.Fatal(err)
		}
		return kvdock(t, nil, "config", "check", file)
	}
	gb := float64(avail) / (1 << 30)
	if code, out, stderr := check(0.9 * gb); code != 0 || !strings.HasSuffix(out, ": ok\n") ||
		!strings.Contains(stderr, "warning: the pool (l1.size_gb) takes") || !strings.Contains(stderr, "above 80 %") {
		t.Fatalf("90 %% of MemAvailable: exit %d, out %q, stderr %q", code, out, stderr)
	}
	if code, _, stderr := check(0.1 * gb); code != 0 || stderr != "" {
		t.Fatalf("10 %% of MemAvailable: exit %d, stderr %q", code, stderr)
	}
	if code, _, stderr := check(3 * gb); code != 0 || !strings.Contains(stderr, "kvdock serve refuses it") {
		t.Fatalf("3× MemAvailable: exit %d, stderr %q", code, stderr)
	}
}

// The refusal of a pool past the host's memory says its heading once.
func TestPoolRefusalHeadingOnce(t *testing.T) {
	code, _, stderr := kvdock(t, nil, "--headless", "--l1-size-gb", "50000", "--no-l1-prefault", "--port", "1")
	if code != 2 || strings.Count(stderr, "invalid settings") != 1 || !strings.HasPrefix(stderr, "kvdock: invalid settings (1 problem):") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
}
