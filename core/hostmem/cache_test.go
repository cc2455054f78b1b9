package hostmem

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestProbeReadsMemAvailable(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) Probe {
		p := filepath.Join(dir, "meminfo")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return Probe{Path: p}
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
	if _, err := (Probe{Path: filepath.Join(dir, "absent")}).MemAvailable(); err == nil {
		t.Fatal("absent file: no error")
	}
	// The real host answers something positive.
	if n, err := (Probe{}).MemAvailable(); err != nil || n <= 0 {
		t.Fatalf("/proc/meminfo: %d, %v", n, err)
	}
}

// The cache finds a mapping in /proc/self/numa_maps: untouched pages are on
// no node, written ones are, a reading is reused for 30 s, and a mapping
// that is gone says so.
func TestPlacementCacheOfAMapping(t *testing.T) {
	const size = 16 * 4096
	// A shared file mapping, as the pool's: the kernel never merges it
	// with its neighbours, so numa_maps has a line starting at it.
	fd, err := unix.MemfdCreate("placement", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	mapped := true
	t.Cleanup(func() {
		if mapped {
			_ = unix.Munmap(mem)
		}
	})
	span := func() (uintptr, uintptr, bool) {
		if !mapped {
			return 0, 0, false
		}
		s := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
		return s, s + size, true
	}
	var c PlacementCache
	now := time.Unix(1000, 0)
	pl, why := c.Read(now, span)
	if why != "" || pl.Resident() != 0 {
		t.Fatalf("fresh mapping: %+v, %q", pl, why)
	}
	for i := range mem {
		mem[i] = 1
	}
	if pl, _ = c.Read(now.Add(29*time.Second), span); pl.Resident() != 0 {
		t.Fatal("a reading younger than 30 s was not reused")
	}
	now = now.Add(31 * time.Second)
	pl, why = c.Read(now, span)
	if why != "" || pl.Resident() != 16 || pl.PageSize != 4096 {
		t.Fatalf("written mapping: %+v, %q; want 16 pages of 4 KiB", pl, why)
	}
	if err := unix.Munmap(mem); err != nil {
		t.Fatal(err)
	}
	mapped = false
	if _, why = c.Read(now.Add(31*time.Second), span); why != "pool closed" {
		t.Fatalf("gone mapping: %q", why)
	}
	// A clock that went back reads again rather than trusting the future.
	if _, why = c.Read(now.Add(-time.Second), span); why != "pool closed" {
		t.Fatalf("clock back: %q", why)
	}
}
