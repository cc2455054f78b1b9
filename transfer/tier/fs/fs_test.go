package fs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"kvdock/core/layout"
	"kvdock/core/testkit/tmpfs"
	"kvdock/core/tierstate"
	"kvdock/settings"
	"kvdock/transfer/tier"
)

const (
	envHelperBase = "KVDOCK_FSTIER_HELPER_BASE"
)

func openTier(t *testing.T, base string, capacity int64) *Tier {
	t.Helper()
	tr, err := Open(FSConfig{BasePath: base, CapacityBytes: capacity, RecoverOnStart: true}, nil)
	if err != nil {
		t.Fatalf("open %s: %v", base, err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// value is what key k holds: its length and every byte derive from k, so a
// read can tell whose bytes it got. When size leaves room for it, the value
// is a tier value stored under k (header, then payload), as the scan at
// start indexes only those.
// mustPut stores value(k, size) under k and fails t when the put errs.
func mustPut(t *testing.T, tr *Tier, k string, size int) {
	t.Helper()
	if err := tr.Put(context.Background(), k, value(k, size)); err != nil {
		t.Fatal(err)
	}
}

func value(k string, size int) []byte {
	h := hashKey(k)
	v := make([]byte, size)
	for i := range v {
		v[i] = h[i%len(h)] ^ byte(i/len(h))
	}
	lay := layout.Layout{Shape: []int{1}, Dtype: "uint8"}
	hl := tier.HeaderLen(k, lay)
	if size < hl {
		return v
	}
	lay.Shape[0], lay.Bytes = size-hl, int64(size-hl)
	enc, err := tier.Encode(k, lay, v[hl:])
	if err != nil {
		panic(err) // a test's own key and size
	}
	return enc
}

// files lists the regular files under dir, relative to it.
func files(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d iofs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func tempFiles(t *testing.T, dir string) []string {
	var out []string
	for _, f := range files(t, dir) {
		if strings.HasPrefix(filepath.Base(f), tmpPrefix) {
			out = append(out, f)
		}
	}
	return out
}

func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	base := filepath.Join(t.TempDir(), "l2")
	tr := openTier(t, base, 64<<20)
	v := value("k1", 128<<10)
	if err := tr.Put(ctx, "k1", v); err != nil {
		t.Fatal(err)
	}
	if err := tr.Put(ctx, "empty", nil); err != nil {
		t.Fatal(err)
	}
	got, err := tr.Get(ctx, "k1")
	if err != nil || !bytes.Equal(got, v) {
		t.Fatalf("get k1: %d bytes, %v", len(got), err)
	}
	if got, err := tr.Get(ctx, "empty"); err != nil || len(got) != 0 {
		t.Fatalf("get empty: %d bytes, %v", len(got), err)
	}
	if n, err := tr.Has(ctx, []string{"k1", "empty", "nope", "k1"}); n != 2 || err != nil {
		t.Fatalf("has = %d, %v; want 2 leading", n, err)
	}
	if _, err := tr.Get(ctx, "nope"); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("get absent: %v, want ErrNotFound", err)
	}
	h := hex.EncodeToString(func() []byte { a := hashKey("k1"); return a[:] }())
	if _, err := os.Stat(filepath.Join(base, h[:2], h)); err != nil {
		t.Fatalf("chunk file not in the sharded layout: %v", err)
	}
	st := tr.Stats()
	if st.Type != "fs" || st.Target != base || st.State != tierstate.Up || st.Objects != 2 ||
		st.UsedBytes != 128<<10 || st.CapacityBytes != 64<<20 || st.WriteBytes != 128<<10 || st.ReadBytes != 128<<10 {
		t.Fatalf("stats %+v", st)
	}
	if err := tr.Delete(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	if err := tr.Delete(ctx, "k1"); err != nil {
		t.Fatalf("delete absent: %v", err)
	}
	if _, err := tr.Get(ctx, "k1"); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("get deleted: %v", err)
	}
	if got := len(files(t, base)); got != 2 { // the lock file and "empty"
		t.Fatalf("%d files left, want 2: %v", got, files(t, base))
	}
	if len(tempFiles(t, base)) != 0 {
		t.Fatal("temporary files left behind")
	}
}

func TestCancelledContext(t *testing.T) {
	base := t.TempDir()
	tr := openTier(t, base, 64<<20)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := tr.Put(ctx, "k", value("k", 1<<20)); !errors.Is(err, context.Canceled) {
		t.Fatalf("put: %v", err)
	}
	if _, err := tr.Get(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("get: %v", err)
	}
	if _, err := tr.Has(ctx, []string{"k"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("has: %v", err)
	}
	if n := len(files(t, base)); n != 1 {
		t.Fatalf("files after cancelled put: %v", files(t, base))
	}
	if st := tr.Stats(); st.State != tierstate.Up || st.DroppedWrites != 0 {
		t.Fatalf("a cancelled put is not a failed write: %+v", st)
	}
}

func TestLRUEvictionAtCapacity(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	const size = 64 << 10
	tr := openTier(t, base, 4*size)
	for i := range 4 {
		k := fmt.Sprint("k", i)
		mustPut(t, tr, k, size)
	}
	if _, err := tr.Get(ctx, "k0"); err != nil { // k0 becomes most recent; k1 is now the oldest
		t.Fatal(err)
	}
	if err := tr.Put(ctx, "k4", value("k4", size)); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]bool{"k0": true, "k1": false, "k2": true, "k3": true, "k4": true} {
		_, err := tr.Get(ctx, k)
		if (err == nil) != want {
			t.Errorf("%s present=%v, want %v (%v)", k, err == nil, want, err)
		}
	}
	// A value twice the size pushes out the two least recently used.
	if err := tr.Put(ctx, "big", value("big", 2*size)); err != nil {
		t.Fatal(err)
	}
	st := tr.Stats()
	if st.UsedBytes > st.CapacityBytes || st.Objects != 3 {
		t.Fatalf("after big put: %+v", st)
	}
	if n := len(files(t, base)) - 1; n != 3 {
		t.Fatalf("%d chunk files on disk, want 3", n)
	}
	// Replacing a key charges only the difference, never evicts itself.
	if err := tr.Put(ctx, "big", value("big", 2*size)); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Get(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	if err := tr.Put(ctx, "huge", make([]byte, 4*size+1)); err == nil {
		t.Fatal("a value over the capacity was accepted")
	}
}

// Files written by a previous run are hits after a restart; files that are
// not ours are left alone; staged writes a dead process left are removed.
func TestRestartWarm(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	tr, err := Open(FSConfig{BasePath: base, CapacityBytes: 64 << 20, RecoverOnStart: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "b", "c"}
	for _, k := range keys {
		if err := tr.Put(ctx, k, value(k, 100<<10+len(k))); err != nil {
			t.Fatal(err)
		}
	}
	tr.Close()

	foreign := map[string]string{
		"README":                        "not ours",
		"ab/notes.txt":                  "not ours",
		"zz/cd/x":                       "not ours",
		"AB/" + strings.Repeat("A", 64): "upper-case: not a name we write",
		// our name pattern but in the wrong shard, or a level too deep: not ours
		"00/" + strings.Repeat("f", 64):    "misplaced",
		"ff/ff/" + strings.Repeat("f", 64): "too deep",
	}
	for p, body := range foreign {
		if err := os.MkdirAll(filepath.Join(base, filepath.Dir(p)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(base, p), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	h := hex.EncodeToString(func() []byte { a := hashKey("d"); return a[:] }())
	stale := filepath.Join(base, h[:2], tmpPrefix+h[:16]+"-123")
	os.MkdirAll(filepath.Dir(stale), 0o700)
	if err := os.WriteFile(stale, value("d", 50<<10), 0o600); err != nil {
		t.Fatal(err)
	}

	tr2 := openTier(t, base, 64<<20)
	for _, k := range keys {
		got, err := tr2.Get(ctx, k)
		if err != nil || !bytes.Equal(got, value(k, 100<<10+len(k))) {
			t.Fatalf("after restart %s: %d bytes, %v", k, len(got), err)
		}
	}
	if n, _ := tr2.Has(ctx, []string{"d"}); n != 0 {
		t.Fatal("a staged write was indexed")
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale temporary file not removed: %v", err)
	}
	for p, body := range foreign {
		b, err := os.ReadFile(filepath.Join(base, p))
		if err != nil || string(b) != body {
			t.Fatalf("foreign file %s touched: %q, %v", p, b, err)
		}
	}
	if st := tr2.Stats(); st.Objects != 3 || st.UsedBytes != 3*charge(100<<10+1) {
		t.Fatalf("rebuilt stats %+v", st)
	}
}

// A restart with a smaller capacity keeps the newest files (by mtime) and
// removes the rest; recover_on_start=false starts cold and removes ours only.
func TestRestartOverCapacityAndCold(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	tr, err := Open(FSConfig{BasePath: base, CapacityBytes: 64 << 20, RecoverOnStart: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const size = 8 << 10
	now := time.Now()
	for i := range 10 {
		k := fmt.Sprint("k", i)
		mustPut(t, tr, k, size)
		h := hex.EncodeToString(func() []byte { a := hashKey(k); return a[:] }())
		ts := now.Add(time.Duration(i-10) * time.Minute)
		if err := os.Chtimes(filepath.Join(base, h[:2], h), ts, ts); err != nil {
			t.Fatal(err)
		}
	}
	tr.Close()

	tr2, err := Open(FSConfig{BasePath: base, CapacityBytes: 3 * size, RecoverOnStart: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := tr2.Has(ctx, []string{"k7", "k8", "k9"}); n != 3 {
		t.Fatalf("newest three not kept: %d", n)
	}
	if n, _ := tr2.Has(ctx, []string{"k6"}); n != 0 {
		t.Fatal("k6 kept over capacity")
	}
	if n := len(files(t, base)) - 1; n != 3 {
		t.Fatalf("%d chunk files after shrink, want 3", n)
	}
	tr2.Close()

	os.WriteFile(filepath.Join(base, "mine-not"), []byte("x"), 0o600)
	tr4, err := Open(FSConfig{BasePath: base, CapacityBytes: 64 << 20, RecoverOnStart: false}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr4.Close()
	if st := tr4.Stats(); st.Objects != 0 {
		t.Fatalf("cold start indexed %d", st.Objects)
	}
	if got := files(t, base); len(got) != 2 { // lock + mine-not
		t.Fatalf("cold start left %v", got)
	}
}

// A temporary file under the very name a write of the key would use is
// never served: it is removed at start and the key is a miss.
func TestCrashLeftoverNeverServed(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	k := "half-written"
	h := hex.EncodeToString(func() []byte { a := hashKey(k); return a[:] }())
	dir := filepath.Join(base, h[:2])
	os.MkdirAll(dir, 0o700)
	partial := filepath.Join(dir, tmpPrefix+h[:16]+"-999")
	if err := os.WriteFile(partial, value(k, 1000)[:300], 0o600); err != nil {
		t.Fatal(err)
	}
	tr := openTier(t, base, 64<<20)
	if _, err := tr.Get(ctx, k); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("partial write served: %v", err)
	}
	if n, _ := tr.Has(ctx, []string{k}); n != 0 {
		t.Fatal("partial write indexed")
	}
	if len(tempFiles(t, base)) != 0 {
		t.Fatal("partial write not removed")
	}
	// A chunk file whose length no longer matches the index (changed behind
	// our back) is a miss and removed, never served.
	mustPut(t, tr, k, 1000)
	if err := os.Truncate(filepath.Join(dir, h), 999); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Get(ctx, k); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("short file served: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, h)); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("short file not removed")
	}
}

// TestHelperWriter is not a test: run by TestKilledDuringWrites, it writes
// chunks until killed.
func TestHelperWriter(t *testing.T) {
	base := os.Getenv(envHelperBase)
	if base == "" {
		t.Skip("helper process only")
	}
	tr, err := Open(FSConfig{BasePath: base, CapacityBytes: 256 << 20, RecoverOnStart: true}, nil)
	if err != nil {
		fmt.Println("failed", err)
		os.Exit(1)
	}
	vals := make([][]byte, 4)
	for i := range vals {
		vals[i] = value(fmt.Sprint("w", i), 4*ioPiece+i)
	}
	fmt.Println("ready")
	// A pause before each piece keeps the writer inside a value for most of
	// its time, so a kill that follows a write lands inside the next one
	// even when the killing process is slow to wake.
	pace := func() { time.Sleep(20 * time.Millisecond) }
	for i := 0; ; i++ {
		if err := tr.PutParts(context.Background(), fmt.Sprint("w", i%4), nil, vals[i%4], nil, pace); err != nil {
			fmt.Println("failed", err)
			os.Exit(1)
		}
	}
}

// A kvdock killed with SIGKILL in the middle of writes leaves no chunk that
// reads back other than what was stored under its key. The kill is timed by
// inotify: it follows the n-th write(2) into a shard directory, inside a
// value (each value takes 4 writes).
func TestKilledDuringWrites(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	ino, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Skipf("inotify: %v", err)
	}
	defer unix.Close(ino)
	for i := range 4 {
		dir, _ := (&Tier{base: base}).paths(hashKey(fmt.Sprint("w", i)))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if _, err := unix.InotifyAddWatch(ino, dir, unix.IN_MODIFY); err != nil {
			t.Fatal(err)
		}
	}
	// Three rounds always run; more (up to 12) only while no kill has yet
	// landed inside a write, which a very busy machine can cause.
	killedMidWrite := false
	for round := 0; round < 3 || (!killedMidWrite && round < 12); round++ {
		killAfter := []int{6, 9, 15, 7}[round%4]
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWriter$", "-test.count=1")
		cmd.Env = append(os.Environ(), envHelperBase+"="+base)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if line, _ := bufio.NewReader(out).ReadString('\n'); strings.TrimSpace(line) != "ready" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("round %d: writer said %q", round, line)
		}
		drain := func() int { // events since the last call
			n, buf := 0, make([]byte, 64<<10)
			for {
				m, err := unix.Read(ino, buf)
				if m <= 0 || err != nil {
					return n
				}
				for off := 0; off+unix.SizeofInotifyEvent <= m; {
					ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
					off += unix.SizeofInotifyEvent + int(ev.Len)
					n++
				}
			}
		}
		drain()
		for seen := 0; seen < killAfter; {
			fds := []unix.PollFd{{Fd: int32(ino), Events: unix.POLLIN}}
			if n, err := unix.Poll(fds, 10_000); n == 0 || (err != nil && err != unix.EINTR) {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("round %d: no writes seen (%v)", round, err)
			}
			seen += drain()
		}
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		partial := 0
		for _, f := range files(t, base) {
			if fi, err := os.Stat(filepath.Join(base, f)); err == nil && f != lockName && fi.Size() < 4*ioPiece {
				partial++
			}
		}
		killedMidWrite = killedMidWrite || partial > 0
		tr, err := Open(FSConfig{BasePath: base, CapacityBytes: 256 << 20, RecoverOnStart: true}, nil)
		if err != nil {
			t.Fatalf("round %d: reopen after kill: %v", round, err)
		}
		if len(tempFiles(t, base)) != 0 {
			t.Fatalf("round %d: temporary files survive the restart", round)
		}
		hits := 0
		for i := range 4 {
			k := fmt.Sprint("w", i)
			got, err := tr.Get(ctx, k)
			if errors.Is(err, tier.ErrNotFound) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			hits++
			// The helper stores only value(wI, 4 pieces + I) under wI.
			if !bytes.Equal(got, value(k, 4*ioPiece+i)) {
				t.Fatalf("round %d: %s served %d bytes that are not its value", round, k, len(got))
			}
		}
		t.Logf("round %d: killed after %d writes, %d partial files were left, %d hits after the restart", round, killAfter, partial, hits)
		if hits == 0 {
			t.Fatalf("round %d: nothing survived the kill", round)
		}
		tr.Close()
	}
	if !killedMidWrite {
		t.Fatal("no kill landed inside a write: the test proved nothing")
	}
}

func TestSecondOpenRefused(t *testing.T) {
	base := t.TempDir()
	tr, err := Open(FSConfig{BasePath: base, CapacityBytes: 1 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(FSConfig{BasePath: base, CapacityBytes: 1 << 20}, nil)
	if err == nil {
		t.Fatal("second Open of the same base_path succeeded")
	}
	if !strings.Contains(err.Error(), base) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("refusal does not name the path and the holder: %v", err)
	}
	// Also through another spelling of the same directory.
	if _, err := Open(FSConfig{BasePath: base + "/./", CapacityBytes: 1 << 20}, nil); err == nil {
		t.Fatal("second Open through another spelling succeeded")
	}
	tr.Close()
	tr2, err := Open(FSConfig{BasePath: base, CapacityBytes: 1 << 20}, nil)
	if err != nil {
		t.Fatalf("open after the holder closed: %v", err)
	}
	tr2.Close()
}

// A full file system drops writes (counted), degrades the tier with the
// reason, keeps serving reads, and the tier comes back once space frees.
func TestDiskFull(t *testing.T) {
	tmpfs.With(t, 4<<20, func(t *testing.T, dir string) {
		ctx := context.Background()
		base := filepath.Join(dir, "l2")
		tr := openTier(t, base, 1<<30) // the capacity is not what stops us: the disk is
		keep := value("keep", 256<<10)
		if err := tr.Put(ctx, "keep", keep); err != nil {
			t.Fatal(err)
		}
		// Another program fills the file system.
		filler := filepath.Join(dir, "filler")
		f, err := os.Create(filler)
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.Copy(f, io.LimitReader(zeros{}, 8<<20))
		f.Close()
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("filling the tmpfs: %v", err)
		}
		err = tr.Put(ctx, "new", value("new", 512<<10))
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("put on a full disk: %v, want ENOSPC", err)
		}
		st := tr.Stats()
		if st.State != tierstate.Degraded || !strings.Contains(st.Reason, "no space") || !strings.Contains(st.Reason, base) || st.DroppedWrites != 1 {
			t.Fatalf("after a full-disk write: %+v", st)
		}
		// More writes while full: dropped and counted, without piling up.
		for i := range 5 {
			if err := tr.Put(ctx, "new", value("new", 512<<10)); err == nil {
				t.Fatalf("write %d on a full disk succeeded", i)
			}
		}
		if st := tr.Stats(); st.DroppedWrites != 6 || st.State != tierstate.Degraded {
			t.Fatalf("dropped = %d, state %s", st.DroppedWrites, st.State)
		}
		if got, err := tr.Get(ctx, "keep"); err != nil || !bytes.Equal(got, keep) {
			t.Fatalf("read on a full disk: %d bytes, %v", len(got), err)
		}
		if n, _ := tr.Has(ctx, []string{"keep", "new"}); n != 1 {
			t.Fatalf("has = %d, want 1", n)
		}
		if len(tempFiles(t, base)) != 0 {
			t.Fatal("a dropped write left its temporary file")
		}
		// Space frees: the next write lands and the tier is up again.
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		if err := tr.Put(ctx, "new", value("new", 512<<10)); err != nil {
			t.Fatalf("put after space freed: %v", err)
		}
		if st := tr.Stats(); st.State != tierstate.Up || st.Reason != "" {
			t.Fatalf("not up again: %+v", st)
		}
		if got, err := tr.Get(ctx, "new"); err != nil || !bytes.Equal(got, value("new", 512<<10)) {
			t.Fatalf("read after recovery: %v", err)
		}
	})
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// Concurrent Put/Get/Delete/Has of the same few keys, with eviction at
// work: a Get returns either a miss or exactly one of the values stored
// under that key.
func TestConcurrentSameKeys(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	tr := openTier(t, base, 6*(64<<10))
	keys := []string{"a", "b", "c", "d", "e"}
	// Values of key k: 8-byte version, then bytes derived from (k, version).
	mk := func(k string, ver uint64) []byte {
		v := value(fmt.Sprint(k, "/", ver), 16<<10+int(ver%8)*(8<<10))
		binary.LittleEndian.PutUint64(v, ver)
		return v
	}
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				k := keys[(g+i)%len(keys)]
				switch (g + i) % 4 {
				case 0, 1:
					if err := tr.Put(ctx, k, mk(k, uint64(g*1000+i))); err != nil {
						errc <- err
						return
					}
				case 2:
					got, err := tr.Get(ctx, k)
					if errors.Is(err, tier.ErrNotFound) {
						continue
					}
					if err != nil {
						errc <- err
						return
					}
					ver := binary.LittleEndian.Uint64(got)
					if want := mk(k, ver); !bytes.Equal(got, want) {
						errc <- fmt.Errorf("%s: got %d bytes that are no value stored under it", k, len(got))
						return
					}
				case 3:
					if i%3 == 0 {
						if err := tr.Delete(ctx, k); err != nil {
							errc <- err
							return
						}
					} else if _, err := tr.Has(ctx, keys); err != nil {
						errc <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	st := tr.Stats()
	if st.UsedBytes > st.CapacityBytes {
		t.Fatalf("used %d > capacity %d", st.UsedBytes, st.CapacityBytes)
	}
	// The index agrees with the disk.
	if n := int64(len(files(t, base)) - 1); n != st.Objects {
		t.Fatalf("%d chunk files on disk, index has %d", n, st.Objects)
	}
	if len(tempFiles(t, base)) != 0 {
		t.Fatal("temporary files left")
	}
}

// Keys are opaque: whatever bytes they hold, files stay inside base_path
// and each key reads back its own value.
func TestHostileKeys(t *testing.T) {
	ctx := context.Background()
	parent := t.TempDir()
	base := filepath.Join(parent, "l2")
	tr := openTier(t, base, 64<<20)
	keys := []string{
		strings.Repeat("a", 1<<20), strings.Repeat("/..", 5000), "../../../etc/passwd", "/etc/passwd",
		"..", ".", "", "a\x00b", "\x00", "model/with:colon@00000000", "\xff\xfe", ".kvdock.lock", tmpPrefix + "x",
	}
	for i, k := range keys {
		if err := tr.Put(ctx, k, value(fmt.Sprint(i), 1000+i)); err != nil {
			t.Fatalf("put key %d: %v", i, err)
		}
	}
	for i, k := range keys {
		got, err := tr.Get(ctx, k)
		if err != nil || !bytes.Equal(got, value(fmt.Sprint(i), 1000+i)) {
			t.Fatalf("key %d: %d bytes, %v", i, len(got), err)
		}
	}
	if got := files(t, parent); len(got) != len(keys)+1 {
		t.Fatalf("files under the parent: %v", got)
	}
	for _, f := range files(t, parent) {
		if !strings.HasPrefix(f, "l2/") {
			t.Fatalf("file outside base_path: %s", f)
		}
		name := filepath.Base(f)
		if name != lockName && !isHex(name, nameLen) {
			t.Fatalf("unexpected file name %q", name)
		}
	}
	if n, _ := tr.Has(ctx, keys); n != len(keys) {
		t.Fatalf("has = %d", n)
	}
}

func TestClosed(t *testing.T) {
	ctx := context.Background()
	tr := openTier(t, t.TempDir(), 1<<20)
	tr.Close()
	if err := tr.Put(ctx, "k", []byte("v")); err == nil {
		t.Fatal("put after close")
	}
	if _, err := tr.Get(ctx, "k"); err == nil || errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("get after close: %v", err)
	}
	if st := tr.Stats(); st.State != tierstate.Down {
		t.Fatalf("state after close %s", st.State)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestRelativeTmpDir(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	cfg, err := FromAdapter(settings.FSAdapter{BasePath: base, MaxCapacityGB: 0.01, RelativeTmpDir: "staging"})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := Open(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Put(ctx, "k", value("k", 4096)); err != nil {
		t.Fatal(err)
	}
	tr.Close()
	stale := filepath.Join(base, "staging", tmpPrefix+"0123-1")
	os.WriteFile(stale, []byte("partial"), 0o600)
	os.WriteFile(filepath.Join(base, "staging", "theirs"), []byte("x"), 0o600)
	tr2, err := Open(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr2.Close()
	if got, err := tr2.Get(ctx, "k"); err != nil || !bytes.Equal(got, value("k", 4096)) {
		t.Fatalf("get: %v", err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("stale staged write kept")
	}
	if _, err := os.Stat(filepath.Join(base, "staging", "theirs")); err != nil {
		t.Fatal("foreign file in the staging directory removed")
	}
}

func TestFromAdapter(t *testing.T) {
	cfg, err := FromAdapter(settings.FSAdapter{BasePath: "/data/l2"})
	if err != nil || cfg.BasePath != "/data/l2" || cfg.CapacityBytes != DefaultCapacityGB<<30 || !cfg.RecoverOnStart || cfg.RelativeTmpDir != "" {
		t.Fatalf("defaults: %+v, %v", cfg, err)
	}
	off := false
	cfg, err = FromAdapter(settings.FSAdapter{BasePath: "rel/dir", MaxCapacityGB: 1.5, RecoverOnStart: &off, RelativeTmpDir: "tmp//x/"})
	if err != nil || !filepath.IsAbs(cfg.BasePath) || cfg.CapacityBytes != 3<<29 || cfg.RecoverOnStart || cfg.RelativeTmpDir != "tmp/x" {
		t.Fatalf("%+v, %v", cfg, err)
	}
}

// Close while writes and reads are in flight: they end with an error or a
// result, never a panic or a race, and no staged write stays behind.
func TestCloseDuringTraffic(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	tr, err := Open(FSConfig{BasePath: base, CapacityBytes: 8 << 20, RecoverOnStart: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				k := fmt.Sprint(g, "/", i%8)
				if err := tr.Put(ctx, k, value(k, 256<<10)); err != nil {
					return
				}
				if i == 1 {
					started <- struct{}{}
				}
				if _, err := tr.Get(ctx, k); err != nil && !errors.Is(err, tier.ErrNotFound) {
					return
				}
			}
		}()
	}
	for range 4 {
		<-started
	}
	tr.Close()
	wg.Wait()
	if got := tempFiles(t, base); len(got) != 0 {
		t.Fatalf("staged writes left after close: %v", got)
	}
	tr2 := openTier(t, base, 8<<20)
	if st := tr2.Stats(); st.Objects == 0 || st.UsedBytes > 8<<20 {
		t.Fatalf("after reopen: %+v", st)
	}
}

// A Put that replaces or evicts chunk files frees their blocks only after
// it has released the index: lookups (Has) and reads never wait on an
// unlink, which takes milliseconds for a large file. The displaced files are
// gone once the Put returns, and are never served meanwhile.
func TestFreeOutsideIndexLock(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	const size = 64 << 10
	tr := openTier(t, base, 2*size)
	for _, k := range []string{"a", "b"} {
		mustPut(t, tr, k, size)
	}
	held := make(chan []string, 1)
	resume := make(chan struct{})
	tr.beforeFree = func(graves []string) {
		if len(graves) > 0 {
			held <- graves
			<-resume
		}
	}
	put := make(chan error, 1)
	go func() { put <- tr.Put(ctx, "a", value("a2", size)) }() // replaces a
	var graves []string
	select {
	case graves = <-held:
	case err := <-put:
		t.Fatalf("put returned (%v) without displacing a file", err)
	}
	if len(graves) != 1 {
		t.Fatalf("graves %v, want the old value of a", graves)
	}
	// The index is free while the old file waits to be removed.
	has := make(chan int, 1)
	go func() {
		n, _ := tr.Has(ctx, []string{"a", "b"})
		has <- n
	}()
	select {
	case n := <-has:
		if n != 2 {
			t.Fatalf("has = %d, want 2", n)
		}
	case <-time.After(10 * time.Second):
		close(resume)
		t.Fatal("Has waited for the displaced file to be freed")
	}
	if got, err := tr.Get(ctx, "a"); err != nil || !bytes.Equal(got, value("a2", size)) {
		t.Fatalf("get a while its old file waits: %d bytes, %v", len(got), err)
	}
	close(resume)
	if err := <-put; err != nil {
		t.Fatal(err)
	}
	// Eviction: c pushes out b, the least recently used (the hook passes).
	if err := tr.Put(ctx, "c", value("c", size)); err != nil {
		t.Fatal(err)
	}
	graves = <-held
	if len(graves) != 1 {
		t.Fatalf("evicted graves %v, want b's file", graves)
	}
	if _, err := tr.Get(ctx, "b"); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("evicted b: %v", err)
	}
	if left := tempFiles(t, base); len(left) != 0 {
		t.Fatalf("displaced files left: %v", left)
	}
	if n := int64(len(files(t, base)) - 1); n != tr.Stats().Objects {
		t.Fatalf("%d chunk files on disk, index has %d", n, tr.Stats().Objects)
	}
}

// TestCloseLogsNoWarning: closing the tier on a normal stop is not a fault:
// one INFO line says it closed, nothing at WARN or above.
func TestCloseLogsNoWarning(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	tr, err := Open(FSConfig{BasePath: t.TempDir(), CapacityBytes: 1 << 20, RecoverOnStart: true}, log)
	if err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if strings.Contains(out, "level=WARN") || strings.Contains(out, "level=ERROR") || strings.Contains(out, "tier down") {
		t.Fatalf("close logged a fault:\n%s", out)
	}
	if !strings.Contains(out, "level=INFO msg=\"fs tier closed\"") {
		t.Fatalf("close did not say it closed:\n%s", out)
	}
	if st := tr.Stats(); st.State != tierstate.Down || st.Reason != "closed" {
		t.Fatalf("state after close: %s %q", st.State, st.Reason)
	}
}

// TestScanAcrossWorkersKeepsTheNewest: the start scan runs its shards on
// several workers (scanWorkers) and still keeps exactly the newest files
// that fit the capacity, whatever order the workers meet them in, and
// removes the rest.
func TestScanAcrossWorkersKeepsTheNewest(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	tr, err := Open(FSConfig{BasePath: base, CapacityBytes: 64 << 20, RecoverOnStart: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n, keep, size = 600, 200, 8 << 10
	now := time.Now()
	for i := range n {
		k := fmt.Sprint("s", i)
		mustPut(t, tr, k, size)
		h := hashKey(k)
		name := hex.EncodeToString(h[:])
		ts := now.Add(time.Duration(i-n) * time.Second)
		if err := os.Chtimes(filepath.Join(base, name[:2], name), ts, ts); err != nil {
			t.Fatal(err)
		}
	}
	tr.Close()
	tr2, err := Open(FSConfig{BasePath: base, CapacityBytes: keep * charge(size), RecoverOnStart: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr2.Close()
	for i := range n {
		k := fmt.Sprint("s", i)
		if got, _ := tr2.Has(ctx, []string{k}); (got == 1) != (i >= n-keep) {
			t.Fatalf("file %d of %d (newest last): kept %v, want the newest %d kept", i, n, got == 1, keep)
		}
	}
	if st := tr2.Stats(); st.Objects != keep {
		t.Fatalf("%d objects indexed, want %d", st.Objects, keep)
	}
	if got := len(files(t, base)) - 1; got != keep { // and the lock file
		t.Fatalf("%d chunk files left, want %d", got, keep)
	}
}
