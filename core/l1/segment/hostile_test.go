package segment

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// plantDead leaves under dir what a kvdock killed while holding name leaves:
// the segment and its marker link, nobody holding the flock.
func plantDead(t *testing.T, dir, name string) {
	t.Helper()
	path := filepath.Join(dir, NormalizeName(name))
	if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(path, filepath.Join(dir, markerPrefix+NormalizeName(name))); err != nil {
		t.Fatal(err)
	}
}

// liveProblem says what is wrong with live segment s under its own names:
// both the segment name and the marker must still name the inode it holds.
func liveProblem(s *Segment) string {
	name := s.Decision().Segment
	var bad []string
	for _, p := range []string{name, markerPrefix + name} {
		if !sameFile(s.fd, filepath.Join(s.dir, p)) {
			bad = append(bad, p)
		}
	}
	if len(bad) == 0 {
		return ""
	}
	return fmt.Sprintf("live segment %s: %s no longer name(s) its memory", name, strings.Join(bad, ", "))
}

// yield lets the other goroutines run while a cleaner holds a lock, as a
// preempted process would.
func yield(string) { runtime.Gosched(); time.Sleep(100 * time.Microsecond) }

// jitter starts a goroutine of a round at a random moment of the others'.
func jitter() { time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond) }

// raceRound is one round of the start-up race: kvdocks whose requested names
// were left by killed kvdocks start at the same moment as kvdocks that clean
// up on their own start, and two that ask for the same fresh name, while one
// more kvdock serves. It returns the spurious start failures (a name nobody
// else holds refused, or both or neither of the pair started) and the live
// segments found without their names.
func raceRound(t *testing.T, dir string, cleaners int) (failed, lost []string) {
	t.Helper()
	serving, err := Open(Options{Name: "serving", Size: 4096, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"a", "b", "c", "d", "e", "e"}
	for _, n := range names[:4] {
		plantDead(t, dir, n)
	}
	plantDead(t, dir, "gone")
	if err := os.Remove(filepath.Join(dir, Prefix+"gone")); err != nil { // an orphan marker
		t.Fatal(err)
	}
	segs := make([]*Segment, len(names))
	errs := make([]error, len(names))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			jitter()
			segs[i], errs[i] = Open(Options{Name: n, Size: 4096, Dir: dir, afterLock: yield})
		}()
	}
	for range cleaners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			jitter()
			// A kvdock started with shared memory off.
			cleaner{dir: dir, uid: os.Geteuid(), afterLock: yield}.run()
		}()
	}
	close(start)
	wg.Wait()
	started := map[string]int{}
	for i, s := range segs {
		if s != nil {
			started[names[i]]++
		} else if names[i] != "e" || !errors.Is(errs[i], ErrBusy) {
			failed = append(failed, fmt.Sprintf("%s: %v", names[i], errs[i]))
		}
	}
	if started["e"] != 1 {
		failed = append(failed, fmt.Sprintf("e: %d of the two servers asking for it started", started["e"]))
	}
	for _, s := range append(segs, serving) {
		if s == nil {
			continue
		}
		if p := liveProblem(s); p != "" {
			lost = append(lost, p)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	return failed, lost
}

// Kvdocks starting together, and a kvdock starting while another removes
// stale segments, never remove each other's live segment or marker and never
// make a live one fail to start: a cleaner holding a stale segment's lock for
// a moment is not a live owner.
func TestHostileConcurrentStartAndCleanup(t *testing.T) {
	dir := shmDir(t)
	budget := 2 * time.Second
	rounds, failures, losses := 0, 0, 0
	var first []string
	for deadline := time.Now().Add(budget); time.Now().Before(deadline) || rounds < 100; rounds++ {
		failed, lost := raceRound(t, dir, 3)
		failures += len(failed)
		losses += len(lost)
		if len(first) < 4 {
			first = append(first, failed...)
			first = append(first, lost...)
		}
	}
	t.Logf("%d rounds (6 starts, 4 over dead kvdocks' names, 2 asking for one name; 3 cleanups; 1 serving): %d spurious start failures, %d live segments lost a name", rounds, failures, losses)
	if failures+losses > 0 {
		t.Fatalf("%d spurious start failures and %d live segments without their names in %d rounds, first: %s",
			failures, losses, rounds, strings.Join(first, "; "))
	}
}

// The requested name squatted by another user's file (even as root, and even
// unlocked) is not kvdock's to remove: the start fails and says who owns it.
func TestHostileSquatterOfAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("run as root (CI does): the test gives a file to uid 65534")
	}
	const nobody = 65534
	dir := shmDir(t)
	path := filepath.Join(dir, Prefix+"squatted")
	if err := os.WriteFile(path, []byte("not kvdock's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	// With a marker too: a marker proves nothing about a file of another user.
	if err := os.Link(path, filepath.Join(dir, markerPrefix+Prefix+"squatted")); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Options{Name: "squatted", Size: 4096, Dir: dir})
	if err == nil {
		s.Close()
		t.Fatalf("started over another user's file: %+v", s.Decision())
	}
	if errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Fatalf("error %q: want one naming the owner (uid 65534), not a live holder", err)
	}
	got, rerr := os.ReadFile(path)
	if rerr != nil || string(got) != "not kvdock's" {
		t.Fatalf("another user's file was removed or changed: %q %v", got, rerr)
	}
	if !exists(t, filepath.Join(dir, markerPrefix+Prefix+"squatted")) {
		t.Fatal("another user's marker link was removed")
	}
	t.Logf("refused: %v", err)
}

// A symbolic link (or any non-regular file) at the segment name is refused
// for what it is, never followed, and left in place.
func TestHostileSymlinkAtSegmentName(t *testing.T) {
	dir := shmDir(t)
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("victim"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, Prefix+"linked")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, Prefix+"fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"linked": "symbolic link", "fifo": "named pipe"} {
		s, err := Open(Options{Name: name, Size: 4096, Dir: dir})
		if err == nil {
			s.Close()
			t.Fatalf("%s: started: %+v", name, s.Decision())
		}
		if errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %q: want one saying it is a %s, not a live holder", name, err, want)
		}
		t.Logf("%s refused: %v", name, err)
	}
	if got, err := os.ReadFile(target); err != nil || string(got) != "victim" {
		t.Fatalf("the link's target changed: %q %v", got, err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the symlink was removed or replaced: %v", err)
	}
}
