package restart

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestHostileStartLockRefusesASecondStart: while one start holds the lock
// of an endpoint, another is refused at once with ErrStarting naming the
// holder's pid; once released the file is gone and the next start takes
// it. A missing directory holds no record: no lock, no error.
func TestHostileStartLockRefusesASecondStart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if l, err := Lock(dir, FileName("127.0.0.1", 23001)); l != nil || err != nil {
		t.Fatalf("missing directory: %v %v", l, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	file := FileName("127.0.0.1", 23001)
	first, err := Lock(dir, file)
	if err != nil || first == nil {
		t.Fatalf("first lock: %v", err)
	}
	_, err = Lock(dir, file)
	if !errors.Is(err, ErrStarting) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second lock while the first is held: %v", err)
	}
	if other, err := Lock(dir, FileName("127.0.0.1", 23002)); err != nil || other == nil {
		t.Fatalf("another endpoint's lock: %v", err)
	} else if err := other.Release(); err != nil {
		t.Fatal(err)
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("files left after release: %v", ents)
	}
	again, err := Lock(dir, file)
	if err != nil || again == nil {
		t.Fatalf("lock after release: %v", err)
	}
	if err := again.Release(); err != nil {
		t.Fatal(err)
	}
}

// TestHostileStartLockRefusesAForeignFile: a symbolic link at the lock's
// name is not followed; the lock is refused as invalid.
func TestHostileStartLockRefusesAForeignFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	file := FileName("127.0.0.1", 23003)
	target := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.Symlink(target, filepath.Join(dir, strings.TrimSuffix(file, ".state")+".lock")); err != nil {
		t.Fatal(err)
	}
	if l, err := Lock(dir, file); err == nil || l != nil {
		t.Fatalf("lock through a symbolic link: %v %v", l, err)
	}
	if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the link's target was created: %v", err)
	}
}
