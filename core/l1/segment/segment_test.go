package segment

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// shmDir is a fresh directory on the real /dev/shm tmpfs, so names are
// unique per test and statfs sees tmpfs.
func shmDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp(DefaultDir, "kvdock-test-")
	if err != nil {
		t.Fatalf("make test dir in %s: %v", DefaultDir, err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// holdFlock starts a child process that takes an exclusive flock on path
// (creating it) and waits; the returned function SIGKILLs it.
func holdFlock(t *testing.T, path string) (kill func()) {
	t.Helper()
	cmd := exec.Command("/usr/bin/python3", "-c", `
import fcntl, sys, time
f = open(sys.argv[1], "a")
fcntl.flock(f, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(600)
`, path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start flock holder: %v", err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "locked" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("flock holder did not lock %s: %q %v", path, line, err)
	}
	killed := false
	kill = func() {
		if !killed {
			killed = true
			cmd.Process.Kill() // SIGKILL: the owner dies without cleaning up
			cmd.Wait()
		}
	}
	t.Cleanup(kill)
	return kill
}

func TestNormalizeName(t *testing.T) {
	for in, want := range map[string]string{
		"foo":                  "lmcache_l1_pool_foo",
		"/foo":                 "lmcache_l1_pool_foo",
		"//foo":                "lmcache_l1_pool_foo",
		"lmcache_l1_pool_x":    "lmcache_l1_pool_x",
		"/lmcache_l1_pool_123": "lmcache_l1_pool_123",
	} {
		if got := NormalizeName(in); got != want {
			t.Errorf("NormalizeName(%q) = %q, want %q", in, got, want)
		}
	}
	for _, bad := range []string{"lmcache_l1_pool_", "lmcache_l1_pool_a/b", "lmcache_l1_pool_a b", Prefix + strings.Repeat("x", 250)} {
		if ValidName(bad) == nil {
			t.Errorf("ValidName(%q) accepted", bad)
		}
	}
	if _, err := Open(Options{Name: "a/b", Size: 4096, Dir: shmDir(t)}); err == nil {
		t.Error("Open accepted a name with a slash inside")
	}
}

// TestReasonsPrintSizesWithTheGivenFormatter: the reasons print sizes
// with Options.Bytes (the engine's one byte formatter), else as a count of
// bytes.
func TestReasonsPrintSizesWithTheGivenFormatter(t *testing.T) {
	dir := shmDir(t)
	format := func(n int64) string { return fmt.Sprintf("<%d>", n) }
	s, err := Open(Options{Name: "fmt", Size: 1 << 20, Dir: dir, Bytes: format})
	if err != nil {
		t.Fatal(err)
	}
	if d := s.Decision(); !strings.HasSuffix(d.Reason, "created, <1048576>") {
		t.Errorf("reason %q does not print the size with the formatter", d.Reason)
	}
	s.Close()
	s, err = Open(Options{Name: "fmt", Size: 1 << 20, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if d := s.Decision(); !strings.HasSuffix(d.Reason, "created, 1048576 bytes") {
		t.Errorf("reason %q without a formatter", d.Reason)
	}
}

func TestAnonymousPassesReason(t *testing.T) {
	s, err := Open(Options{Size: 1 << 20, NoShmReason: `--shm-name "" given on the command line`})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := s.Decision()
	if d.Shared || d.Segment != "" || d.Private != "" || d.Size != 1<<20 || d.Reason != `--shm-name "" given on the command line; restarts of this pool are cold` {
		t.Fatalf("decision %+v", d)
	}
	b := s.Bytes()
	if len(b) != 1<<20 {
		t.Fatalf("mapping is %d bytes", len(b))
	}
	b[len(b)-1] = 7
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s.Bytes() != nil || s.Close() != nil {
		t.Fatal("Close is not idempotent")
	}
}

func TestSharedSegmentLifecycle(t *testing.T) {
	dir := shmDir(t)
	s, err := Open(Options{Name: "/life", Size: 1 << 20, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	d := s.Decision()
	if !d.Shared || d.Segment != "lmcache_l1_pool_life" || d.Reason != "segment lmcache_l1_pool_life created, 1048576 bytes" || d.ShmFree <= 0 {
		t.Fatalf("decision %+v", d)
	}
	path := filepath.Join(dir, d.Segment)
	info, err := os.Stat(path)
	if err != nil {
		t.Fatalf("segment file: %v", err)
	}
	if info.Mode().Perm() != 0o600 || info.Size() != 1<<20 {
		t.Fatalf("segment mode %v size %d, want 0600 and 1 MiB", info.Mode().Perm(), info.Size())
	}
	copy(s.Bytes()[4096:], "hello")
	got, err := os.ReadFile(path)
	if err != nil || string(got[4096:4101]) != "hello" {
		t.Fatalf("bytes written through the mapping are not in the file: %v", err)
	}
	// Same process, second server: the flock is held, so this is an error.
	if _, err := Open(Options{Name: "life", Size: 1 << 20, Dir: dir}); !errors.Is(err, ErrBusy) {
		t.Fatalf("second Open of a live name: %v, want ErrBusy", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the live segment was removed by the second Open: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("segment still exists after Close: %v", err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 0 {
		t.Fatalf("leftover files: %v", ents)
	}
}

func TestStaleSegmentsRemovedLiveOnesKept(t *testing.T) {
	dir := shmDir(t)
	deadPath := filepath.Join(dir, Prefix+"dead")
	livePath := filepath.Join(dir, Prefix+"live")
	otherPath := filepath.Join(dir, "not_ours")
	for _, p := range []string{otherPath} {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	killDead := holdFlock(t, deadPath)
	holdFlock(t, livePath)
	killDead() // owner SIGKILLed: its lock is free, but it never carried kvdock's marker

	_, err := Open(Options{Name: "live", Size: 1 << 20, Dir: dir})
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), Prefix+"live") {
		t.Fatalf("Open of a name held by a live process: %v, want ErrBusy naming the segment", err)
	}
	if _, err := os.Stat(deadPath); err != nil {
		t.Fatalf("an unmarked segment of another name was removed: %v", err)
	}
	if _, err := os.Stat(livePath); err != nil {
		t.Fatalf("segment of a live owner was removed: %v", err)
	}
	if _, err := os.Stat(otherPath); err != nil {
		t.Fatalf("file without the prefix was removed: %v", err)
	}

	// A stale segment under the requested name is removed, then created anew.
	kill := holdFlock(t, filepath.Join(dir, Prefix+"again"))
	kill()
	s, err := Open(Options{Name: "again", Size: 1 << 20, Dir: dir})
	if err != nil {
		t.Fatalf("Open over a stale segment of the same name: %v", err)
	}
	defer s.Close()
	if !s.Decision().Shared || !strings.Contains(s.Decision().Reason, "removed 1 stale") {
		t.Fatalf("decision %+v", s.Decision())
	}
	if info, err := os.Stat(filepath.Join(dir, Prefix+"again")); err != nil || info.Size() != 1<<20 {
		t.Fatalf("recreated segment: %v", err)
	}
}

func TestCapacityFallbackInjected(t *testing.T) {
	dir := shmDir(t)
	s, err := Open(Options{Name: "big", Size: 1 << 30, Dir: dir,
		Statfs: func(string) (int64, error) { return 60 << 20, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := s.Decision()
	want := fmt.Sprintf("%s has 62914560 bytes free, pool needs 1073741824 bytes", dir)
	if d.Shared || d.Segment != "" || d.ShmFree != 60<<20 || !strings.HasPrefix(d.Reason, want) {
		t.Fatalf("decision %+v, want anonymous with reason %q", d, want)
	}
	if len(s.Bytes()) != 1<<30 {
		t.Fatal("fallback mapping has the wrong size")
	}
	if _, err := os.Stat(filepath.Join(dir, Prefix+"big")); !os.IsNotExist(err) {
		t.Fatalf("a segment was created despite the fallback: %v", err)
	}
	s2, err := Open(Options{Name: "x", Size: 1 << 20, Dir: dir,
		Statfs: func(string) (int64, error) { return 0, errors.New("boom") }})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if s2.Decision().Shared || !strings.Contains(s2.Decision().Reason, "boom") {
		t.Fatalf("statfs failure decision %+v", s2.Decision())
	}
}

// TestCapacityFallbackReal asks for more than the real /dev/shm has free.
func TestCapacityFallbackReal(t *testing.T) {
	dir := shmDir(t)
	free, err := statfsFree(dir)
	if err != nil {
		t.Fatal(err)
	}
	size := free + 1<<30
	s, err := Open(Options{Name: "toolarge", Size: size, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := s.Decision()
	if d.Shared || !strings.Contains(d.Reason, fmt.Sprintf("pool needs %d bytes", size)) || !strings.Contains(d.Reason, " free") {
		t.Fatalf("decision %+v", d)
	}
}

func TestPrefaultInBackground(t *testing.T) {
	// Open must not wait: right after it returns, 1 GiB cannot be populated
	// yet (that takes hundreds of milliseconds). Closing while the prefault
	// runs must stop it before unmapping.
	big, err := Open(Options{Size: 1 << 30, Prefault: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := big.Prefaulted(); got >= 1<<30 {
		t.Fatalf("Open returned after prefaulting all %d bytes", got)
	}
	if err := big.Close(); err != nil {
		t.Fatal(err)
	}

	dir := shmDir(t)
	const size = 256 << 20
	s, err := Open(Options{Name: "pf", Size: size, Dir: dir, Prefault: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	deadline := time.Now().Add(30 * time.Second)
	for s.Prefaulted() < size {
		if time.Now().After(deadline) {
			t.Fatalf("prefault stuck at %d bytes", s.Prefaulted())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// tmpfs now holds every page of the segment.
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, s.Decision().Segment), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 < size {
		t.Fatalf("segment has %d bytes allocated after prefault, want %d", st.Blocks*512, size)
	}
}
