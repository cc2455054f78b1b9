package reliability

import (
	"context"
	"crypto/sha256"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvdock/tests/harness"

	"golang.org/x/sys/unix"
)

// pickleServer starts kvdock with --shm-name "" and --l1-keep-on-exit,
// and requires its pool to be the endpoint's private segment: a regular
// file of this user, mode 0600.
func pickleServer(t *testing.T) (*harness.Server, string) {
	t.Helper()
	srv := harness.StartKeepingPickle(t, "--chunk-size", "16")
	path := filepath.Join("/dev/shm", srv.Private)
	var st unix.Stat_t
	if !strings.HasPrefix(srv.Private, "kvdock_private_pool_") || unix.Lstat(path, &st) != nil {
		t.Fatalf("pickle-mode pool is not in a private segment (%q)\n%s", srv.Private, srv.Output())
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o777 != 0o600 || int(st.Uid) != os.Geteuid() {
		t.Fatalf("private segment %s: mode %#o, uid %d; want a regular file of uid %d, mode 0600", path, st.Mode, st.Uid, os.Geteuid())
	}
	return srv, path
}

// requireNothingAdvertised registers a worker and requires {"", 0} and the
// pickle mode, and the same in /status; it returns the worker.
func requireNothingAdvertised(t *testing.T, srv *harness.Server, id int64, when string) *harness.GoWorker {
	t.Helper()
	w := harness.NewWorker(t, srv.Dial(t, "nongpu-v1"), id, "private-hostile", false)
	if w.SegName != "" || w.PoolSize != 0 || w.Mode() != "pickle" {
		t.Fatalf("%s: REGISTER advertised {%q, %d}, worker mode %s; want {\"\", 0} and pickle", when, w.SegName, w.PoolSize, w.Mode())
	}
	if name := srv.ShmName(t); name != "" {
		t.Fatalf("%s: /status advertises %q", when, name)
	}
	return w
}

// storeAndRead stores prompt seq through w and reads it back identical.
func storeAndRead(t *testing.T, w *harness.GoWorker, seq int, when string) {
	t.Helper()
	ctx := context.Background()
	toks := harness.Tokens(seq, 2, w.Chunk)
	data := [][]byte{harness.ChunkData(seq, 0, w.ChunkBytes), harness.ChunkData(seq, 1, w.ChunkBytes)}
	if r, err := w.Store(ctx, toks, data, "s"); err != nil || r != "true" {
		t.Fatalf("%s: store: %q %v", when, r, err)
	}
	requireIdentical(t, w, seq, when)
}

func requireIdentical(t *testing.T, w *harness.GoWorker, seq int, when string) {
	t.Helper()
	got, err := w.Retrieve(context.Background(), harness.Tokens(seq, 2, w.Chunk), 2, "r")
	if err != nil || len(got) != 2 || harness.Sum(got[0]) != harness.Sum(harness.ChunkData(seq, 0, w.ChunkBytes)) || harness.Sum(got[1]) != harness.Sum(harness.ChunkData(seq, 1, w.ChunkBytes)) {
		t.Fatalf("%s: prompt %d: %d chunks back, %v; want both, identical", when, seq, len(got), err)
	}
}

// TestHostilePickleModeNeverAdvertisesItsSegment: the pickle-mode pool is
// a segment in /dev/shm, but no REGISTER and no /status advertisement ever
// names it, before or after a restart adopts it; workers keep pickling.
func TestHostilePickleModeNeverAdvertisesItsSegment(t *testing.T) {
	srv, _ := pickleServer(t)
	w := requireNothingAdvertised(t, srv, 801, "first start")
	storeAndRead(t, w, 1, "first start")
	t.Logf("SIGUSR2: back in %v", srv.RestartSignal(t))
	if rs := srv.LastRestart(t); !rs.Adopted || rs.AdoptedObjects != 2 {
		t.Fatalf("SIGUSR2: restart %+v, want the private pool adopted", rs)
	}
	if private, _ := srv.PoolStatus(t); private != srv.Private {
		t.Fatalf("SIGUSR2: pool in %q, want the adopted %s", private, srv.Private)
	}
	requireIdentical(t, w, 1, "after SIGUSR2")
	requireNothingAdvertised(t, srv, 802, "after SIGUSR2")
	t.Logf("SIGTERM and the same command line: back in %v", srv.RestartTerm(t))
	if rs := srv.LastRestart(t); !rs.Adopted {
		t.Fatalf("SIGTERM and the same command line: restart %+v, want the private pool adopted", rs)
	}
	requireIdentical(t, w, 1, "after SIGTERM")
	requireNothingAdvertised(t, srv, 803, "after SIGTERM")
}

// fileSum is the SHA-256 of the file at path (not followed if a link).
func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}

// TestHostileKeptPrivateSegmentSwapped: between the stop that kept the
// pickle-mode pool and the next start, the private segment's name is made
// a symbolic link to the kept file (which adopting through it would map),
// or the file is given to another user. The start adopts nothing (the
// segment package's checks: no link followed, only our own files), leaves
// the file and the link as they are, serves on anonymous memory saying
// that its restarts are cold, and advertises nothing.
func TestHostileKeptPrivateSegmentSwapped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("run as root (CI does): the test gives a file to uid 65534")
	}
	for _, tc := range []struct {
		name string
		swap func(t *testing.T, path string) (check func())
		want string // in the pool's reason
	}{
		{"symbolic link", func(t *testing.T, path string) func() {
			real := path + ".real"
			if err := os.Rename(path, real); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.Remove(real) })
			if err := os.Symlink(real, path); err != nil {
				t.Fatal(err)
			}
			before := fileSum(t, real)
			return func() {
				if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSymlink == 0 {
					t.Fatalf("the symbolic link was removed or replaced: %v", err)
				}
				if fileSum(t, real) != before {
					t.Fatal("the file behind the link was written")
				}
			}
		}, "symbolic link"},
		{"another user's file", func(t *testing.T, path string) func() {
			if err := os.Chown(path, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			before := fileSum(t, path)
			return func() {
				var st unix.Stat_t
				if err := unix.Lstat(path, &st); err != nil || st.Uid != 65534 {
					t.Fatalf("another user's file was removed or taken: %v", err)
				}
				if fileSum(t, path) != before {
					t.Fatal("another user's file was written")
				}
			}
		}, "owned by uid 65534"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, path := pickleServer(t)
			w := harness.NewWorker(t, srv.Dial(t, "nongpu-v1"), 811, "private-hostile", false)
			storeAndRead(t, w, 2, "first start")
			var check func()
			srv.RestartTermWith(t, func() { check = tc.swap(t, path) })
			t.Cleanup(func() {
				// The refused segment, and the kept marker that still links it.
				_ = os.Remove(path)
				_ = os.Remove(filepath.Join(filepath.Dir(path), ".kvdock-kept-"+filepath.Base(path)))
			})
			rs := srv.LastRestart(t)
			if rs.Adopted || !strings.Contains(rs.Reason, "not adoptable") {
				t.Fatalf("restart %+v: want nothing adopted, saying the kept segment is not adoptable", rs)
			}
			private, reason := srv.PoolStatus(t)
			if private != "" || !strings.Contains(reason, tc.want) || !strings.HasSuffix(reason, "restarts of this pool are cold") {
				t.Fatalf("pool in %q, reason %q: want anonymous memory, saying %q and that restarts are cold", private, reason, tc.want)
			}
			check()
			w2 := requireNothingAdvertised(t, srv, 812, "after the swap")
			storeAndRead(t, w2, 3, "after the swap")
		})
	}
}
