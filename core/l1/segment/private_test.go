package segment

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"kvdock/core/testkit/tmpfs"

	"golang.org/x/sys/unix"
)

// privateName is a private segment name unique to the test.
func privateName(t *testing.T) string {
	t.Helper()
	return PrivateName(t.Name(), 27000+os.Getpid()%1000)
}

// openPrivateIn opens a private segment of size bytes in dir.
func openPrivateIn(t *testing.T, dir, name string, size int64) *Segment {
	t.Helper()
	s, err := Open(Options{Private: name, NoShmReason: `--shm-name "" given`, Dir: dir, Size: size})
	if err != nil {
		t.Fatalf("open private segment: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestPrivateNameIsPerEndpointAndUser(t *testing.T) {
	a, b, c := PrivateName("127.0.0.1", 5555), PrivateName("127.0.0.1", 5556), PrivateName("::1", 5555)
	if a == b || a == c || b == c {
		t.Fatalf("names collide: %s %s %s", a, b, c)
	}
	for _, n := range []string{a, b, c} {
		if err := ValidName(n); err != nil || !IsPrivate(n) || strings.HasPrefix(n, Prefix) {
			t.Errorf("%s: valid %v, private %v", n, err, IsPrivate(n))
		}
		if !strings.Contains(n, "_"+strconv.Itoa(os.Geteuid())+"_") {
			t.Errorf("%s does not carry the uid %d", n, os.Geteuid())
		}
	}
	if a != PrivateName("127.0.0.1", 5555) {
		t.Fatal("the same endpoint gives another name: a restart would not find its segment")
	}
	// No name a worker is told can be a private one, however it is spelled.
	for _, given := range []string{a, "/" + a, "kvdock_private_pool_x"} {
		if IsPrivate(NormalizeName(given)) {
			t.Errorf("--shm-name %q normalises to a private name", given)
		}
	}
}

// A private segment is made as a shared one is (a regular file of ours,
// mode 0600, every page reserved, flocked, marked), but its Decision is
// not shared and names it only as Private.
func TestPrivateSegmentLifecycle(t *testing.T) {
	dir := shmDir(t)
	name := privateName(t)
	s := openPrivateIn(t, dir, name, 1<<20)
	d := s.Decision()
	if d.Shared || d.Segment != "" || d.Private != name || d.File() != name || d.Size != 1<<20 {
		t.Fatalf("decision %+v: want private %s, not shared", d, name)
	}
	if !strings.HasPrefix(d.Reason, `--shm-name "" given; the pool is the private segment `+name) || !strings.Contains(d.Reason, "never advertised") {
		t.Fatalf("reason %q", d.Reason)
	}
	path := filepath.Join(dir, name)
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o777 != 0o600 || int(st.Uid) != os.Geteuid() || st.Blocks*512 < 1<<20 {
		t.Fatalf("segment file mode %#o uid %d, %d bytes reserved", st.Mode, st.Uid, st.Blocks*512)
	}
	if !exists(t, filepath.Join(dir, markerPrefix+name)) {
		t.Fatal("private segment not marked as kvdock's")
	}
	second, err := Open(Options{Private: name, Dir: dir, Size: 1 << 20})
	if err != nil {
		t.Fatalf("a second server on a held private segment: %v, want anonymous memory", err)
	}
	if d := second.Decision(); d.File() != "" || !strings.Contains(d.Reason, "held by a live process") {
		t.Fatalf("second server's decision %+v", d)
	}
	_ = second.Close()
	copy(s.Bytes(), "private bytes")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if exists(t, path) || exists(t, filepath.Join(dir, markerPrefix+name)) {
		t.Fatal("closed private segment left its names")
	}
}

// Kept and adopted as a shared segment is, it stays private: the adopted
// Decision is never Shared, and the bytes are the kept ones.
func TestPrivateSegmentKeptAndAdoptedPrivate(t *testing.T) {
	dir := shmDir(t)
	name := privateName(t)
	s := openPrivateIn(t, dir, name, 1<<20)
	copy(s.Bytes()[4096:], "kept pickle bytes")
	var id Identity
	if err := s.Keep(func(i Identity) error { id = i; return nil }); err != nil {
		t.Fatalf("keep: %v", err)
	}
	if id.Name != name || !exists(t, filepath.Join(dir, keptPrefix+name)) {
		t.Fatalf("kept %+v, kept marker there: %v", id, exists(t, filepath.Join(dir, keptPrefix+name)))
	}
	a, err := Adopt(dir, id, 1<<20, false, nil, nil)
	if err != nil {
		t.Fatalf("adopt: %v", err)
	}
	defer a.Close()
	d := a.Decision()
	if d.Shared || d.Segment != "" || d.Private != name || !strings.Contains(d.Reason, "never advertised") {
		t.Fatalf("adopted decision %+v: want private, not shared", d)
	}
	if got := string(a.Bytes()[4096 : 4096+17]); got != "kept pickle bytes" {
		t.Fatalf("adopted bytes %q", got)
	}
}

// A kvdock that died holding a private segment leaves it marked: the next
// start (of any endpoint) removes it, as it removes a dead shared segment.
func TestDeadPrivateSegmentRemovedByTheNextStart(t *testing.T) {
	dir := shmDir(t)
	name := privateName(t)
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(path, filepath.Join(dir, markerPrefix+name)); err != nil {
		t.Fatal(err)
	}
	other := openPrivateIn(t, dir, PrivateName("elsewhere", 1), 4096)
	if other.Decision().Private == "" || !strings.Contains(other.Decision().Reason, "private segment") {
		t.Fatalf("decision %+v", other.Decision())
	}
	if exists(t, path) || exists(t, filepath.Join(dir, markerPrefix+name)) {
		t.Fatal("the dead kvdock's private segment is still there: its memory is held for good")
	}
}

// A private name squatted by a symbolic link, a named pipe or another
// user's file is left alone, never followed, and the server starts on
// anonymous memory saying why and that its restarts are cold: shared
// memory is off, so nobody's file may stop the server.
func TestHostilePrivateSegmentNameSquatted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("run as root (CI does): the test gives a file to uid 65534")
	}
	dir := shmDir(t)
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("victim"), 0o600); err != nil {
		t.Fatal(err)
	}
	squat := map[string]func(path string) error{
		"symbolic link": func(path string) error { return os.Symlink(target, path) },
		"named pipe":    func(path string) error { return unix.Mkfifo(path, 0o600) },
		"owned by uid 65534": func(path string) error {
			if err := os.WriteFile(path, []byte("not kvdock's"), 0o644); err != nil {
				return err
			}
			return os.Chown(path, 65534, 65534)
		},
	}
	for what, plant := range squat {
		name := PrivateName(what, 1)
		path := filepath.Join(dir, name)
		if err := plant(path); err != nil {
			t.Fatal(err)
		}
		var before unix.Stat_t
		if err := unix.Lstat(path, &before); err != nil {
			t.Fatal(err)
		}
		s := openPrivateIn(t, dir, name, 1<<20)
		d := s.Decision()
		if d.Shared || d.Segment != "" || d.Private != "" || d.File() != "" {
			t.Fatalf("%s: decision %+v, want anonymous memory", what, d)
		}
		if !strings.Contains(d.Reason, what) || !strings.HasSuffix(d.Reason, "restarts of this pool are cold") {
			t.Errorf("%s: reason %q: want it to say what is there and that restarts are cold", what, d.Reason)
		}
		copy(s.Bytes(), "anonymous")
		var after unix.Stat_t
		if err := unix.Lstat(path, &after); err != nil || after.Ino != before.Ino || after.Mode != before.Mode {
			t.Fatalf("%s: the squatter was removed or replaced: %v", what, err)
		}
		t.Logf("%s: %s", what, d.Reason)
	}
	if got, err := os.ReadFile(target); err != nil || string(got) != "victim" {
		t.Fatalf("the link's target changed: %q %v", got, err)
	}
}

// A kept private segment swapped for a symbolic link or another user's
// file is not adopted: the package's adoption checks hold for it as for a
// shared one.
func TestHostileKeptPrivateSegmentReplaced(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("run as root (CI does): the test gives a file to uid 65534")
	}
	dir := shmDir(t)
	name := privateName(t)
	s := openPrivateIn(t, dir, name, 1<<20)
	var id Identity
	if err := s.Keep(func(i Identity) error { id = i; return nil }); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.Rename(path, path+".real"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(path+".real", path); err != nil {
		t.Fatal(err)
	}
	if _, err := Adopt(dir, id, 1<<20, false, nil, nil); !errors.Is(err, ErrNotAdoptable) {
		t.Fatalf("symlink adopted: %v", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".real", path); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := Adopt(dir, id, 1<<20, false, nil, nil); !errors.Is(err, ErrNotAdoptable) || !strings.Contains(err.Error(), "uid 65534") {
		t.Fatalf("another user's file adopted: %v", err)
	}
	if gone, _ := RemoveKept(dir, id); gone || !exists(t, path) {
		t.Fatal("RemoveKept removed another user's file")
	}
}

// A private segment needs room in the shm directory like a shared one:
// without it the pool is anonymous memory, with both figures and the
// warning that restarts of it are cold.
func TestPrivateSegmentWithoutRoomIsAnonymous(t *testing.T) {
	tmpfs.With(t, 8<<20, func(t *testing.T, dir string) {
		s, err := Open(Options{Private: PrivateName("full", 1), NoShmReason: `--shm-name "" given`, Dir: dir, Size: 16 << 20})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		d := s.Decision()
		if d.Private != "" || d.Shared || d.Size != 16<<20 || !strings.Contains(d.Reason, "pool needs 16777216 bytes") ||
			!strings.HasSuffix(d.Reason, "anonymous memory; restarts of this pool are cold") {
			t.Fatalf("decision %+v", d)
		}
		if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
			t.Fatalf("files left: %v %v", ents, err)
		}
		if off, err := touchAll(s.Bytes()); err != nil || off != 16<<20 {
			t.Fatalf("touched %d bytes: %v", off, err)
		}
	})
}
