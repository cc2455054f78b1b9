package segment

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func keepOne(t *testing.T, dir, name string, size int64) Identity {
	t.Helper()
	s, err := Open(Options{Name: name, Dir: dir, Size: size})
	if err != nil {
		t.Fatal(err)
	}
	copy(s.Bytes()[100:], "kept bytes")
	var id Identity
	if err := s.Keep(func(i Identity) error { id = i; return nil }); err != nil {
		t.Fatalf("keep: %v", err)
	}
	// Marked kept: other kvdocks leave it to its successor for keptGrace.
	if _, err := os.Lstat(filepath.Join(dir, keptPrefix+id.Name)); err != nil {
		t.Fatalf("kept segment not marked kept: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, markerPrefix+id.Name)); !os.IsNotExist(err) {
		t.Fatalf("kept segment still carries a live server's marker: %v", err)
	}
	return id
}

func TestKeepThenAdoptKeepsBytes(t *testing.T) {
	dir := shmDir(t)
	id := keepOne(t, dir, "keep", 1<<20)
	s, err := Adopt(dir, id, 1<<20, true, nil, nil)
	if err != nil {
		t.Fatalf("adopt: %v", err)
	}
	if got := string(s.Bytes()[100:110]); got != "kept bytes" {
		t.Fatalf("adopted bytes %q", got)
	}
	if _, err := os.Lstat(filepath.Join(dir, markerPrefix+id.Name)); err != nil {
		t.Fatalf("adopted segment not marked again: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, keptPrefix+id.Name)); !os.IsNotExist(err) {
		t.Fatalf("adopted segment still marked kept: %v", err)
	}
	// Adopted means held: a second adopter is told it is busy.
	if _, err := Adopt(dir, id, 1<<20, false, nil, nil); !errors.Is(err, ErrBusy) {
		t.Fatalf("second adopt: %v, want ErrBusy", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, id.Name)); !os.IsNotExist(err) {
		t.Fatalf("closed adopted segment still there")
	}
}

// A kept segment that nobody adopts does not hold the host's memory: a
// kvdock that starts during the restart's gap leaves it to its successor,
// one that starts after keptGrace removes it as stale.
func TestKeptSegmentRemovedByTheNextStartThatDoesNotAdopt(t *testing.T) {
	dir := shmDir(t)
	id := keepOne(t, dir, "orphan", 1<<20)
	if removed, err := CleanStale(dir, Prefix+"other", nil); err != nil || len(removed) != 0 {
		t.Fatalf("stale cleanup during the gap: removed %v, %v", removed, err)
	}
	later := cleaner{dir: dir, want: Prefix + "other", uid: os.Geteuid(), now: func() time.Time { return time.Now().Add(keptGrace + time.Second) }}
	removed, err := later.run()
	if err != nil || len(removed) != 1 {
		t.Fatalf("stale cleanup after the grace: removed %v, %v", removed, err)
	}
	for _, name := range []string{id.Name, markerPrefix + id.Name, keptPrefix + id.Name} {
		if _, err := os.Lstat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Fatalf("%s still there after the cleanup: %v", name, err)
		}
	}
	if _, err := Adopt(dir, id, 1<<20, false, nil, nil); !errors.Is(err, ErrNotAdoptable) {
		t.Fatalf("adopt after the cleanup: %v, want ErrNotAdoptable", err)
	}
}

func TestAdoptRefusesAnotherFile(t *testing.T) {
	dir := shmDir(t)
	id := keepOne(t, dir, "swap", 1<<20)
	path := filepath.Join(dir, id.Name)
	for name, tc := range map[string]struct {
		id   Identity
		size int64
		prep func()
	}{
		"other inode": {id: Identity{Name: id.Name, Dev: id.Dev, Ino: id.Ino + 1, Size: id.Size, UID: id.UID}, size: 1 << 20},
		"other size":  {id: id, size: 2 << 20},
		"other uid":   {id: Identity{Name: id.Name, Dev: id.Dev, Ino: id.Ino, Size: id.Size, UID: id.UID + 1}, size: 1 << 20},
		"bad name":    {id: Identity{Name: "../etc", Size: 1 << 20}, size: 1 << 20},
		"mode":        {id: id, size: 1 << 20, prep: func() { os.Chmod(path, 0o644) }},
	} {
		if tc.prep != nil {
			tc.prep()
		}
		if _, err := Adopt(dir, tc.id, tc.size, false, nil, nil); !errors.Is(err, ErrNotAdoptable) {
			t.Errorf("%s: %v, want ErrNotAdoptable", name, err)
		}
		os.Chmod(path, 0o600)
	}
	// A symbolic link at the name is never followed.
	os.Rename(path, path+".real")
	os.Symlink(path+".real", path)
	if _, err := Adopt(dir, id, 1<<20, false, nil, nil); !errors.Is(err, ErrNotAdoptable) {
		t.Fatalf("symlink: %v", err)
	}
	os.Remove(path)
	os.Rename(path+".real", path)
	// Held by a live process: busy, and RemoveKept leaves it.
	kill := holdFlock(t, path)
	if _, err := Adopt(dir, id, 1<<20, false, nil, nil); !errors.Is(err, ErrBusy) {
		t.Fatalf("held: %v, want ErrBusy", err)
	}
	if gone, _ := RemoveKept(dir, id); gone {
		t.Fatal("RemoveKept removed a live segment")
	}
	kill()
	if gone, err := RemoveKept(dir, Identity{Name: id.Name, Dev: id.Dev, Ino: id.Ino + 1}); gone || err != nil {
		t.Fatalf("RemoveKept removed another inode: %v %v", gone, err)
	}
	if gone, err := RemoveKept(dir, id); !gone || err != nil {
		t.Fatalf("RemoveKept: %v %v", gone, err)
	}
	var st unix.Stat_t
	if unix.Lstat(path, &st) == nil {
		t.Fatal("kept segment still there")
	}
}

// TestHostileCleanerMidKeepLeavesTheSegment: Keep links the kept marker,
// then unlinks the live server's marker, then releases the flock. A
// cleaner of another kvdock that listed and opened the live marker before
// its unlink takes its shared flock after the release: it sees a marked
// segment nobody holds, with the kept marker beside it. It must leave it to
// the successor, as it leaves a segment found by its kept marker (the bug:
// it removed the segment in the exec's gap, and the new image started cold,
// its SHM workers' registrations refused; TestHostileSIGUSR2StormKeepsServing
// under the full suite).
func TestHostileCleanerMidKeepLeavesTheSegment(t *testing.T) {
	dir := shmDir(t)
	id := keepOne(t, dir, "midkeep", 1<<20)
	// The state that cleaner sees: both markers, no flock held.
	if err := unix.Link(filepath.Join(dir, id.Name), filepath.Join(dir, markerPrefix+id.Name)); err != nil {
		t.Fatal(err)
	}
	if removed, err := CleanStale(dir, Prefix+"other", nil); err != nil || len(removed) != 0 {
		t.Fatalf("cleanup mid-keep: removed %v, %v", removed, err)
	}
	for _, name := range []string{id.Name, keptPrefix + id.Name} {
		if _, err := os.Lstat(filepath.Join(dir, name)); err != nil {
			t.Fatalf("%s gone after the cleanup mid-keep: %v", name, err)
		}
	}
	s, err := Adopt(dir, id, 1<<20, false, nil, nil)
	if err != nil {
		t.Fatalf("the successor cannot adopt: %v", err)
	}
	if got := string(s.Bytes()[100:110]); got != "kept bytes" {
		t.Fatalf("adopted bytes %q", got)
	}
	_ = s.Close()
	// Past the grace the same state is stale, as a kept segment alone is.
	id = keepOne(t, dir, "midkeep2", 1<<20)
	if err := unix.Link(filepath.Join(dir, id.Name), filepath.Join(dir, markerPrefix+id.Name)); err != nil {
		t.Fatal(err)
	}
	later := cleaner{dir: dir, want: Prefix + "other", uid: os.Geteuid(), now: func() time.Time { return time.Now().Add(keptGrace + time.Second) }}
	if removed, err := later.run(); err != nil || len(removed) != 1 {
		t.Fatalf("cleanup after the grace: removed %v, %v", removed, err)
	}
}
