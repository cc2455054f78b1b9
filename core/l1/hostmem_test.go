package l1_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvdock/core/l1"
)

func TestHostMemoryReadsMemAvailable(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) l1.HostMemory {
		p := filepath.Join(dir, "meminfo")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return l1.HostMemory{Path: p}
	}
	h := write("MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   23068672 kB\nBuffers: 1 kB\n")
	if n, err := h.MemAvailable(); err != nil || n != 23068672<<10 {
		t.Fatalf("MemAvailable = %d, %v", n, err)
	}
	for _, bad := range []string{
		"MemTotal: 1 kB\n",                                    // no line
		"MemAvailable: lots kB\n",                             // not a number
		"MemAvailable: 12 MB\n",                               // unknown unit
		"MemAvailable: -5 kB\n",                               // negative
		"MemAvailable: 99999999999999999 kB\n",                // past any host
		strings.Repeat("x", 2<<20) + "\nMemAvailable: 1 kB\n", // a huge line
	} {
		if n, err := write(bad).MemAvailable(); err == nil {
			t.Fatalf("%.40q: got %d, want an error", bad, n)
		}
	}
	if _, err := (l1.HostMemory{Path: filepath.Join(dir, "absent")}).MemAvailable(); err == nil {
		t.Fatal("absent file: no error")
	}
	// The real host answers something positive.
	if n, err := (l1.HostMemory{}).MemAvailable(); err != nil || n <= 0 {
		t.Fatalf("/proc/meminfo: %d, %v", n, err)
	}
}
