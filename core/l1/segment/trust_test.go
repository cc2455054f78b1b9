package segment

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvdock/core/testkit/tmpfs"
)

// Environment of the helper processes this file starts from the test binary.
const (
	envHelperDir  = "KVDOCK_SEGMENT_HELPER_DIR"  // TestHelperHoldSegment: directory
	envHelperName = "KVDOCK_SEGMENT_HELPER_NAME" // TestHelperHoldSegment: segment name
)

// TestHelperHoldSegment is not a test: run by deadKvdockSegment, it opens a
// segment as a kvdock server would and waits to be killed.
func TestHelperHoldSegment(t *testing.T) {
	dir, name := os.Getenv(envHelperDir), os.Getenv(envHelperName)
	if dir == "" {
		t.Skip("helper process only")
	}
	s, err := Open(Options{Name: name, Size: 1 << 20, Dir: dir})
	if err != nil || !s.Decision().Shared {
		fmt.Printf("failed %v\n", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin) // until killed
	os.Exit(0)
}

// deadKvdockSegment leaves what a kvdock server killed with SIGKILL leaves:
// its segment name under dir and the marker, nobody holding the flock.
func deadKvdockSegment(t *testing.T, dir, name string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHoldSegment$", "-test.count=1")
	cmd.Env = append(os.Environ(), envHelperDir+"="+dir, envHelperName+"="+name)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start segment holder: %v", err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if strings.TrimSpace(line) != "ready" {
		t.Fatalf("segment holder did not open %s: %q %v", name, line, err)
	}
	if _, err := os.Stat(filepath.Join(dir, NormalizeName(name))); err != nil {
		t.Fatalf("the killed holder left no segment: %v", err)
	}
}

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}

// A segment of another name is removed only when it is provably a dead
// kvdock's: Python LMCache never takes the flock, so an unlocked segment
// without kvdock's marker may be in use.
func TestCleanupLeavesUnmarkedSegments(t *testing.T) {
	dir := shmDir(t)
	python := filepath.Join(dir, Prefix+"python_server")
	if err := os.WriteFile(python, []byte("live KV cache of a server that never locks"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Options{Name: "kvdock", Size: 1 << 20, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !exists(t, python) {
		t.Fatal("an unlocked, unmarked segment of another name was removed")
	}
	if strings.Contains(s.Decision().Reason, "removed") {
		t.Fatalf("reason %q", s.Decision().Reason)
	}
}

func TestCleanupRemovesDeadKvdockSegments(t *testing.T) {
	dir := shmDir(t)
	live, err := Open(Options{Name: "alive", Size: 1 << 20, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	deadKvdockSegment(t, dir, "crashed")
	crashed, crashedMarker := filepath.Join(dir, Prefix+"crashed"), filepath.Join(dir, markerPrefix+Prefix+"crashed")
	if !exists(t, crashedMarker) {
		t.Fatal("a kvdock segment carries no marker")
	}
	// A marker whose segment name went (removed by hand), and crash leftovers
	// of segments being created, one old and one fresh.
	orphan := filepath.Join(dir, markerPrefix+Prefix+"orphan")
	oldTmp, freshTmp := filepath.Join(dir, tmpPrefix+"1-old"), filepath.Join(dir, tmpPrefix+"2-fresh")
	for _, p := range []string{orphan, oldTmp, freshTmp} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(oldTmp, old, old); err != nil {
		t.Fatal(err)
	}

	s, err := Open(Options{Name: "next", Size: 1 << 20, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !strings.HasSuffix(s.Decision().Reason, "(removed 1 stale segment(s))") {
		t.Fatalf("reason %q", s.Decision().Reason)
	}
	for path, want := range map[string]bool{
		crashed: false, crashedMarker: false, orphan: false, oldTmp: false, freshTmp: true,
		filepath.Join(dir, Prefix+"alive"): true, filepath.Join(dir, markerPrefix+Prefix+"alive"): true,
	} {
		if got := exists(t, path); got != want {
			t.Errorf("%s exists = %v, want %v", filepath.Base(path), got, want)
		}
	}
	// Close removes both links of its own segment.
	if err := live.Close(); err != nil {
		t.Fatal(err)
	}
	if exists(t, filepath.Join(dir, Prefix+"alive")) || exists(t, filepath.Join(dir, markerPrefix+Prefix+"alive")) {
		t.Fatal("Close left a link of its segment")
	}
}

// Even as root, another user's segment is not ours to remove, marker or
// not, under another name or under the requested one: the start fails and
// says whose it is (TestHostileSquatterOfAnotherUser covers a plain file).
func TestCleanupSkipsOtherUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give files to another user")
	}
	const other = 4242
	dir := shmDir(t)
	deadKvdockSegment(t, dir, "theirs")
	theirs := filepath.Join(dir, Prefix+"theirs")
	if err := os.Chown(theirs, other, other); err != nil { // the marker is the same inode
		t.Fatal(err)
	}
	deadKvdockSegment(t, dir, "wanted")
	wanted := filepath.Join(dir, Prefix+"wanted")
	if err := os.Chown(wanted, other, other); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Options{Name: "wanted", Size: 1 << 20, Dir: dir})
	if err == nil {
		s.Close()
		t.Fatalf("took over another user's segment: %+v", s.Decision())
	}
	if !errors.Is(err, ErrForeign) || !strings.Contains(err.Error(), "owned by uid 4242") {
		t.Fatalf("error %v: want ErrForeign naming uid 4242", err)
	}
	for _, p := range []string{theirs, filepath.Join(dir, markerPrefix+Prefix+"theirs"), wanted, filepath.Join(dir, markerPrefix+Prefix+"wanted")} {
		if !exists(t, p) {
			t.Errorf("another user's %s was removed", filepath.Base(p))
		}
	}
	// Another name still starts, and leaves their segments alone.
	s, err = Open(Options{Name: "mine", Size: 1 << 20, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !exists(t, theirs) || !exists(t, wanted) || strings.Contains(s.Decision().Reason, "removed") {
		t.Fatalf("another user's segment was removed: %+v", s.Decision())
	}
}

// The cleaner locks a file, then unlinks by name: if the name was given to
// another file meanwhile, that file is not the one it proved stale.
func TestCleanupChecksInodeBeforeUnlink(t *testing.T) {
	dir := shmDir(t)
	deadKvdockSegment(t, dir, "marked")
	want := filepath.Join(dir, Prefix+"wanted")
	if err := os.WriteFile(want, []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	replaced := map[string]bool{}
	c := cleaner{dir: dir, want: Prefix + "wanted", uid: os.Geteuid(), afterLock: func(path string) {
		// A starting server puts a new segment in place under the name.
		path = strings.Replace(path, markerPrefix, "", 1)
		tmp := path + ".new"
		if err := os.WriteFile(tmp, []byte("new"), 0o600); err != nil {
			t.Error(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Error(err)
		}
		replaced[filepath.Base(path)] = true
	}}
	removed, err := c.run()
	if err != nil {
		t.Fatal(err)
	}
	ok, err := c.clearWant()
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 0 || ok || !replaced[Prefix+"wanted"] || !replaced[Prefix+"marked"] {
		t.Fatalf("removed %v and want %v, replaced %v", removed, ok, replaced)
	}
	for _, name := range []string{Prefix + "wanted", Prefix + "marked"} {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != "new" {
			t.Errorf("%s: the file put in place after the lock was removed or changed: %q %v", name, got, err)
		}
	}
}

// touchAll writes one byte per page of mem and reports the first fault (a
// SIGBUS from a tmpfs that has no page to give) as an error, not a crash.
func touchAll(mem []byte) (off int, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	page := os.Getpagesize()
	for off = 0; off < len(mem); off += page {
		mem[off] = 1
	}
	return off, nil
}

// The pages are reserved at creation: a /dev/shm that fills up afterwards
// (another program, another segment) cannot fault the pool on first touch.
func TestFullShmAfterStartDoesNotFault(t *testing.T) {
	tmpfs.With(t, 8<<20, func(t *testing.T, dir string) {
		const size = 6 << 20
		s, err := Open(Options{Name: "full", Size: size, Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if !s.Decision().Shared {
			t.Fatalf("decision %+v", s.Decision())
		}
		f, err := os.Create(filepath.Join(dir, "filler"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var filled int64
		buf := make([]byte, 64<<10)
		for {
			n, err := f.Write(buf)
			filled += int64(n)
			if err != nil {
				if !errors.Is(err, unix.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
		t.Logf("a filler took %d bytes of the 8 MiB tmpfs next to a 6 MiB segment", filled)
		if off, err := touchAll(s.Bytes()); err != nil {
			t.Fatalf("first touch of the pool at byte %d after the tmpfs filled up: %v", off, err)
		}
		if filled > 8<<20-size {
			t.Fatalf("the filler got %d bytes: the segment's pages were not reserved", filled)
		}
	})
}

// A /dev/shm that passes the free-space check but cannot reserve the pages
// (filled up in between, or a lying statfs) falls back to anonymous memory.
func TestReserveFailureFallsBack(t *testing.T) {
	tmpfs.With(t, 8<<20, func(t *testing.T, dir string) {
		s, err := Open(Options{Name: "nospace", Size: 16 << 20, Dir: dir,
			Statfs: func(string) (int64, error) { return 1 << 30, nil }})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		d := s.Decision()
		want := dir + " could not reserve 16777216 bytes: no space left on device; using anonymous memory; restarts of this pool are cold"
		if d.Shared || d.Segment != "" || d.Size != 16<<20 || d.Reason != want {
			t.Fatalf("decision %+v, want anonymous memory with reason %q", d, want)
		}
		ents, err := os.ReadDir(dir)
		if err != nil || len(ents) != 0 {
			t.Fatalf("the failed segment left files: %v %v", ents, err)
		}
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		if st.Bfree != st.Blocks {
			t.Fatalf("the failed reservation still holds %d blocks", st.Blocks-st.Bfree)
		}
		if off, err := touchAll(s.Bytes()); err != nil || off != 16<<20 {
			t.Fatalf("anonymous fallback: touched %d bytes: %v", off, err)
		}
	})
}
