package fs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/layout"
	"kvdock/core/testkit/chunks"
	"kvdock/core/testkit/testpool"
	"kvdock/transfer/tier"
)

// The files under a chunk name are outside input (DESIGN "Trust"): these
// tests plant what a local process that can write under base_path could,
// and check that kvdock neither reads more than a chunk, nor blocks, nor
// lets a planted file push valid chunks out.

// hostileLayout is a 16 KiB chunk (2 layers × 2 × 16 tokens × 64 × float32).
func hostileLayout(t *testing.T) layout.Layout { return chunks.Layout(t, 2, 16, 64, "float32") }

type oneLayout struct{ l layout.Layout }

func (o oneLayout) LayoutOf(string, int, uint64, uint32) (layout.Layout, bool) { return o.l, true }

func hostileKey(i int) keys.ObjectKey { return chunks.Tagged(i, "hostile/model", 0x5A) }

func hostilePayload(n, seed int) []byte { return chunks.Payload(n, seed, 31, 7, 3) }

// putChunks stores n chunk values of lay in tr and returns their keys.
func putChunks(t *testing.T, tr *Tier, lay layout.Layout, n int) []keys.ObjectKey {
	t.Helper()
	var ks []keys.ObjectKey
	for i := range n {
		k := hostileKey(i)
		v, err := tier.Encode(tier.Key(k, lay), lay, hostilePayload(int(lay.Bytes), i))
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Put(context.Background(), tier.Key(k, lay), v); err != nil {
			t.Fatal(err)
		}
		ks = append(ks, k)
	}
	return ks
}

// chunkPath is the file of chunk k under lay in tr.
func chunkPath(tr *Tier, k keys.ObjectKey, lay layout.Layout) string {
	_, file := tr.paths(hashKey(tier.Key(k, lay)))
	return file
}

func hostilePool(t *testing.T, size int64) *l1.Pool { return testpool.Anon(t, size) }

// hostileSet runs a Set over tr; the returned stop closes it and tells how
// long that took (bounded by limit: a Set whose loads hang never closes).
func hostileSet(t *testing.T, tr *Tier, p *l1.Pool, lay layout.Layout, opts tier.Options) (*tier.Set, func(limit time.Duration) time.Duration) {
	t.Helper()
	s := tier.NewSet([]tier.Backend{tr}, p, oneLayout{lay}, opts)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { s.Run(ctx); close(ran) }()
	closed := false
	stop := func(limit time.Duration) time.Duration {
		if closed {
			return 0
		}
		closed = true
		start := time.Now()
		done := make(chan struct{})
		go func() { cancel(); <-ran; _ = s.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(limit):
		}
		return time.Since(start)
	}
	t.Cleanup(func() { stop(time.Second) })
	return s, stop
}

// sparse makes file a sparse file of size bytes whose start is head.
func sparse(t *testing.T, file string, head []byte, size int64) {
	t.Helper()
	if err := os.WriteFile(file, head, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, size); err != nil {
		t.Fatal(err)
	}
}

// headerEnd is the length of the header at the start of v (a tier value).
func headerEnd(v []byte) int {
	kl := int(binary.LittleEndian.Uint32(v[6:]))
	p := 10 + kl
	dims := int(v[p])
	p += 1 + 8*dims
	return p + 1 + int(v[p]) + 8 + 4
}

// TestHostileFSBigSparseFilesAreNotRead: four 256 MiB sparse files under
// the names of 16 KiB chunks, planted before a start. Two are a chunk file
// with zeros appended (the header says 16 KiB); two carry a forged header
// whose payload length accounts for the whole 256 MiB. None is read past
// its header: the first two never enter the index, the others are rejected
// at load by their length (fstat) and a header read, a miss counted as
// corrupt and removed: read whole, they would cost 1 GiB read and 1 GiB
// allocated for four 16 KiB chunks.
func TestHostileFSBigSparseFilesAreNotRead(t *testing.T) {
	const big = 256 << 20
	lay := hostileLayout(t)
	base := t.TempDir()
	tr, err := Open(FSConfig{BasePath: base, CapacityBytes: 8 << 30, RecoverOnStart: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ks := putChunks(t, tr, lay, 6)
	tr.Close()
	for i := range 4 {
		file := chunkPath(tr, ks[i], lay)
		v, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if i >= 2 { // forged: the header's payload length fills the file
			h := headerEnd(v)
			binary.LittleEndian.PutUint64(v[h-12:], uint64(big-h))
			v = v[:h]
		}
		sparse(t, file, v, big)
	}

	tr2 := openTier(t, base, 8<<30)
	p := hostilePool(t, 4<<20)
	s, _ := hostileSet(t, tr2, p, lay, tier.Options{})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ctx := context.Background()
	hits := 0
	for i := range 6 {
		hits += s.Prefetch(ctx, "m", 1, ks[i:i+1], 1, 1)
	}
	runtime.ReadMemStats(&after)
	st := s.Stats()[0]
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("tier read %d bytes, %d allocated, for 6 lookups of 16 KiB chunks (4 planted as 256 MiB sparse files); %d hits, corrupt %d",
		st.ReadBytes, alloc, hits, st.Corrupt)
	if hits != 2 {
		t.Errorf("%d hits, want 2 (the intact chunks)", hits)
	}
	// Two chunks and a few headers: far below one planted file.
	if limit := uint64(4 * lay.Bytes); st.ReadBytes > limit {
		t.Errorf("the tier read %d bytes, bound %d", st.ReadBytes, limit)
	}
	if limit := uint64(8 << 20); alloc > limit {
		t.Errorf("the loads allocated %d bytes, bound %d", alloc, limit)
	}
	if st.Corrupt != 4 {
		t.Errorf("corrupt %d, want 4 (two removed by the scan, two forged headers at load)", st.Corrupt)
	}
	for i := range 4 {
		if _, err := os.Lstat(chunkPath(tr2, ks[i], lay)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("planted file %d left in the tier (%v)", i, err)
		}
	}
	for i := 4; i < 6; i++ {
		ref, ok := p.HoldRead(ks[i])
		if !ok {
			t.Fatalf("chunk %d not in L1", i)
		}
		dst, release := p.View(ref.Offset, ref.Length)
		same := bytes.Equal(dst, hostilePayload(int(lay.Bytes), i))
		release()
		p.ReleaseRead([]l1.ReadRef{ref})
		if !same {
			t.Fatalf("chunk %d: L1 bytes differ", i)
		}
	}
}

// unblockFIFOs opens each FIFO for writing and closes it: a reader blocked
// in open(2) on it (a load opened without O_NONBLOCK) then returns.
func unblockFIFOs(files []string) {
	for _, f := range files {
		if fd, err := unix.Open(f, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err == nil {
			unix.Close(fd)
		}
	}
}

// TestHostileFSFIFOsDoNotBlockLoads: nine chunk files replaced by FIFOs
// behind the index (more than the eight load slots). Each lookup of one is
// a miss at once (counted corrupt, the FIFO removed), not a wait for its
// load timeout; intact chunks still load; no L1 slot stays reserved; the
// Set closes at once. A load blocked in open(2) would hold its load slot and
// its L1 reservation for good, so that intact chunks missed and Close never
// returned.
func TestHostileFSFIFOsDoNotBlockLoads(t *testing.T) {
	const fifos = 9
	lay := hostileLayout(t)
	tr := openTier(t, t.TempDir(), 64<<20)
	ks := putChunks(t, tr, lay, fifos+3)
	var planted []string
	for i := range fifos {
		file := chunkPath(tr, ks[i], lay)
		if err := os.Remove(file); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mkfifo(file, 0o600); err != nil {
			t.Fatal(err)
		}
		planted = append(planted, file)
	}
	t.Cleanup(func() { unblockFIFOs(planted) })

	// Long enough that "at once" (under half of it) holds on a loaded -race
	// run; a lookup that waited for its load would still show.
	const timeout = 2 * time.Second
	p := hostilePool(t, 4<<20)
	s, stop := hostileSet(t, tr, p, lay, tier.Options{LoadTimeout: timeout})
	ctx := context.Background()
	var slowest time.Duration
	for i := range fifos {
		start := time.Now()
		if n := s.Prefetch(ctx, "m", 1, ks[i:i+1], 1, 1); n != 0 {
			t.Fatalf("FIFO chunk %d: %d hits", i, n)
		}
		slowest = max(slowest, time.Since(start))
	}
	hits := 0
	for i := fifos; i < len(ks); i++ {
		hits += s.Prefetch(ctx, "m", 1, ks[i:i+1], 1, 1)
	}
	// An abandoned load gives its reservation back once it stops; none
	// should be left a moment later.
	var ps l1.Stats
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ps = p.Stats(); ps.WriteLocked == 0 || time.Now().After(deadline) {
			break
		}
	}
	st := s.Stats()[0]
	took := stop(5 * time.Second)
	t.Logf("slowest FIFO lookup %v (load timeout %v); intact hits %d of 3; L1 write-locked %d; corrupt %d, timeouts %d; Close took %v",
		slowest, timeout, hits, ps.WriteLocked, st.Corrupt, st.LoadTimeouts, took)
	if slowest > timeout/2 {
		t.Errorf("a lookup of a FIFO chunk took %v (load timeout %v)", slowest, timeout)
	}
	if hits != 3 {
		t.Errorf("intact chunks: %d hits of 3", hits)
	}
	if ps.WriteLocked != 0 {
		t.Errorf("%d L1 reservations held after the loads ended", ps.WriteLocked)
	}
	if st.Corrupt != fifos {
		t.Errorf("corrupt %d, want %d", st.Corrupt, fifos)
	}
	if took > time.Second {
		t.Errorf("Close took %v", took)
	}
	for _, f := range planted {
		if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("FIFO %s left in the tier (%v)", f, err)
		}
	}
}

// TestHostileFSLinksAndDevicesAreMisses: chunk files replaced behind the
// index by a link to a valid copy outside base_path, a link to /dev/zero
// and a directory are misses at once, never followed; the links are
// removed, never their targets. A shard directory replaced by a link to a
// directory outside holding a valid copy is a miss too, and nothing there
// is removed.
func TestHostileFSLinksAndDevicesAreMisses(t *testing.T) {
	lay := hostileLayout(t)
	parent := t.TempDir()
	tr := openTier(t, filepath.Join(parent, "l2"), 64<<20)
	ks := putChunks(t, tr, lay, 4)
	// A chunk alone in its shard, whose shard becomes a link.
	used := map[string]bool{}
	for _, k := range ks {
		used[filepath.Dir(chunkPath(tr, k, lay))] = true
	}
	lk := hostileKey(300)
	for j := 301; used[filepath.Dir(chunkPath(tr, lk, lay))]; j++ {
		lk = hostileKey(j)
	}
	lv, _ := tier.Encode(tier.Key(lk, lay), lay, hostilePayload(int(lay.Bytes), 300))
	if err := tr.Put(context.Background(), tier.Key(lk, lay), lv); err != nil {
		t.Fatal(err)
	}
	linked := chunkPath(tr, lk, lay)
	elsewhere := filepath.Join(parent, "elsewhere")
	if err := os.Mkdir(elsewhere, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(linked, filepath.Join(elsewhere, filepath.Base(linked))); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Dir(linked)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Dir(linked)); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(parent, "outside")
	v, err := os.ReadFile(chunkPath(tr, ks[0], lay))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(outside, v, 0o600); err != nil {
		t.Fatal(err)
	}
	for i, target := range []string{outside, "/dev/zero"} {
		file := chunkPath(tr, ks[i], lay)
		os.Remove(file)
		if err := os.Symlink(target, file); err != nil {
			t.Fatal(err)
		}
	}
	dir := chunkPath(tr, ks[2], lay)
	os.Remove(dir)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}

	p := hostilePool(t, 4<<20)
	// As in the FIFO test: "at once" is under half a load timeout long
	// enough for a loaded -race run.
	const timeout = 2 * time.Second
	s, _ := hostileSet(t, tr, p, lay, tier.Options{LoadTimeout: timeout})
	for i := range 3 {
		start := time.Now()
		if n := s.Prefetch(context.Background(), "m", 1, ks[i:i+1], 1, 1); n != 0 {
			t.Fatalf("planted chunk %d: %d hits", i, n)
		}
		if d := time.Since(start); d > timeout/2 {
			t.Errorf("planted chunk %d: lookup took %v", i, d)
		}
		if n, _ := tr.Has(context.Background(), []string{tier.Key(ks[i], lay)}); n != 0 {
			t.Errorf("planted chunk %d still indexed", i)
		}
	}
	if n := s.Prefetch(context.Background(), "m", 1, ks[3:4], 1, 1); n != 1 {
		t.Errorf("intact chunk: %d hits", n)
	}
	if n := s.Prefetch(context.Background(), "m", 1, []keys.ObjectKey{lk}, 1, 1); n != 0 {
		t.Errorf("a chunk through a linked shard directory: %d hits", n)
	}
	if got, err := os.ReadFile(filepath.Join(elsewhere, filepath.Base(linked))); err != nil || !bytes.Equal(got, lv) {
		t.Errorf("a chunk file behind a linked shard directory changed: %v", err)
	}
	if got, err := os.ReadFile(outside); err != nil || !bytes.Equal(got, v) {
		t.Errorf("the link's target outside base_path changed: %v", err)
	}
	for i := range 2 {
		if _, err := os.Lstat(chunkPath(tr, ks[i], lay)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("link %d left in the tier (%v)", i, err)
		}
	}
	if st := s.Stats()[0]; st.Corrupt != 3 {
		t.Errorf("corrupt %d, want 3", st.Corrupt)
	}
}

// TestHostileFSScanKeepsValidChunks: before a start, beside four valid
// chunks that fill most of the capacity, base_path gets a 64 GiB sparse
// file with a future mtime, a 2 MiB file of zeros, a truncated chunk, a
// chunk whose header names another key, a FIFO, a link to a valid copy
// outside base_path, and a shard directory replaced by a link to an
// outside directory holding a chunk-named file. The scan indexes the four
// valid chunks and nothing else, evicts none of them, removes the invalid
// files (and links, never their targets) and touches nothing outside
// base_path. A valid chunk with a future mtime ranks oldest, and the 64 GiB
// file, were it counted as the newest, would evict every valid chunk.
func TestHostileFSScanKeepsValidChunks(t *testing.T) {
	lay := hostileLayout(t)
	parent := t.TempDir()
	base := filepath.Join(parent, "l2")
	one := charge(int64(tier.HeaderLen(tier.Key(hostileKey(0), lay), lay)) + lay.Bytes)
	capacity := 5 * one
	tr, err := Open(FSConfig{BasePath: base, CapacityBytes: 64 << 20, RecoverOnStart: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ks := putChunks(t, tr, lay, 11)
	tr.Close()
	now := time.Now()
	for i := range 4 { // the valid ones, older than now
		ts := now.Add(-time.Duration(10-i) * time.Minute)
		if err := os.Chtimes(chunkPath(tr, ks[i], lay), ts, ts); err != nil {
			t.Fatal(err)
		}
	}
	future := now.Add(24 * time.Hour)
	// touch sets a file's times, a link's own (never its target's).
	touch := func(file string, ts time.Time) {
		tv := []unix.Timespec{unix.NsecToTimespec(ts.UnixNano()), unix.NsecToTimespec(ts.UnixNano())}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, file, tv, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
	}
	planted := map[int]string{}
	plant := func(i int, what string, make func(file string) error) {
		file := chunkPath(tr, ks[i], lay)
		if err := os.Remove(file); err != nil {
			t.Fatal(err)
		}
		if err := make(file); err != nil {
			t.Fatal(err)
		}
		touch(file, future)
		planted[i] = what
	}
	valueOf := func(i int) []byte {
		v, err := os.ReadFile(chunkPath(tr, ks[i], lay))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	v4, v6, v8, v9 := valueOf(4), valueOf(6), valueOf(8), valueOf(9)
	plant(4, "64 GiB sparse", func(f string) error { sparse(t, f, v4[:100], 64<<30); return nil })
	plant(5, "2 MiB of zeros", func(f string) error { sparse(t, f, nil, 2<<20); return nil })
	plant(6, "truncated", func(f string) error { return os.WriteFile(f, v6[:len(v6)-1], 0o600) })
	plant(7, "another key's value", func(f string) error { return os.WriteFile(f, v8, 0o600) })
	plant(8, "FIFO", func(f string) error { return unix.Mkfifo(f, 0o600) })
	outside := filepath.Join(parent, "outside")
	if err := os.WriteFile(outside, v9, 0o600); err != nil {
		t.Fatal(err)
	}
	plant(9, "link outside", func(f string) error { return os.Symlink(outside, f) })
	// A valid chunk with a future mtime: indexed, but ranked oldest.
	touch(chunkPath(tr, ks[10], lay), future)
	// A shard directory (one no chunk above uses) that is a link to a
	// directory outside, holding a valid chunk file.
	used := map[string]bool{}
	for _, k := range ks {
		used[filepath.Dir(chunkPath(tr, k, lay))] = true
	}
	lk := hostileKey(200)
	for j := 201; used[filepath.Dir(chunkPath(tr, lk, lay))]; j++ {
		lk = hostileKey(j)
	}
	linkedFile := chunkPath(tr, lk, lay)
	otherDir := filepath.Join(parent, "elsewhere")
	outsideChunk := filepath.Join(otherDir, filepath.Base(linkedFile))
	lv, _ := tier.Encode(tier.Key(lk, lay), lay, hostilePayload(int(lay.Bytes), 200))
	if err := os.Mkdir(otherDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(outsideChunk, lv, 0o600); err != nil {
		t.Fatal(err)
	}
	touch(outsideChunk, future)
	if err := os.Remove(filepath.Dir(linkedFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(otherDir, filepath.Dir(linkedFile)); err != nil {
		t.Fatal(err)
	}

	tr2, err := Open(FSConfig{BasePath: base, CapacityBytes: capacity, RecoverOnStart: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr2.Close()
	ctx := context.Background()
	kept := 0
	for i := range 4 {
		if n, _ := tr2.Has(ctx, []string{tier.Key(ks[i], lay)}); n == 1 {
			kept++
		}
	}
	st := tr2.Stats()
	t.Logf("scan kept %d of 4 valid chunks; index %d objects, %d bytes of %d", kept, st.Objects, st.UsedBytes, capacity)
	if kept != 4 {
		t.Errorf("the scan kept %d of the 4 valid chunks", kept)
	}
	for i, what := range planted {
		if n, _ := tr2.Has(ctx, []string{tier.Key(ks[i], lay)}); n != 0 {
			t.Errorf("%s indexed", what)
		}
		if _, err := os.Lstat(chunkPath(tr2, ks[i], lay)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left under its chunk name (%v)", what, err)
		}
	}
	// Capacity 5 chunks: the four valid ones and the future-dated one
	// fit; with one more valid chunk, the future-dated one goes first.
	if n, _ := tr2.Has(ctx, []string{tier.Key(ks[10], lay)}); n != 1 {
		t.Errorf("valid chunk with a future mtime not indexed")
	}
	if st.Corrupt != uint64(len(planted)) {
		t.Errorf("corrupt %d, want %d (the invalid files removed)", st.Corrupt, len(planted))
	}
	if st.Objects != 5 || st.UsedBytes > capacity {
		t.Errorf("index: %d objects, %d bytes, want 5 within %d", st.Objects, st.UsedBytes, capacity)
	}
	if got, err := os.ReadFile(outside); err != nil || !bytes.Equal(got, v9) {
		t.Errorf("a link's target outside base_path changed (%v)", err)
	}
	if n, _ := tr2.Has(ctx, []string{tier.Key(lk, lay)}); n != 0 {
		t.Errorf("a chunk file through a linked shard directory indexed")
	}
	if got, err := os.ReadFile(outsideChunk); err != nil || !bytes.Equal(got, lv) {
		t.Errorf("a chunk-named file outside base_path changed (%v)", err)
	}
	// The linked shard is replaced by a directory of ours: no write or
	// eviction goes through it.
	if fi, err := os.Lstat(filepath.Dir(linkedFile)); err != nil || !fi.IsDir() {
		t.Errorf("a shard directory that is a link kept (%v)", err)
	}
	tr2.Close()

	// One more valid chunk over the capacity: the future-dated one is
	// the one evicted, not a chunk dated in the past.
	tr3, err := Open(FSConfig{BasePath: base, CapacityBytes: 64 << 20, RecoverOnStart: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	extra := hostileKey(100)
	xv, _ := tier.Encode(tier.Key(extra, lay), lay, hostilePayload(int(lay.Bytes), 100))
	if err := tr3.Put(ctx, tier.Key(extra, lay), xv); err != nil {
		t.Fatal(err)
	}
	tr3.Close()
	touch(chunkPath(tr3, extra, lay), now.Add(-time.Minute))
	tr4, err := Open(FSConfig{BasePath: base, CapacityBytes: capacity, RecoverOnStart: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr4.Close()
	if n, _ := tr4.Has(ctx, []string{tier.Key(ks[10], lay)}); n != 0 {
		t.Errorf("the future-dated chunk outranked chunks dated in the past")
	}
	for i := range 4 {
		if n, _ := tr4.Has(ctx, []string{tier.Key(ks[i], lay)}); n != 1 {
			t.Errorf("valid chunk %d evicted while a future-dated one stayed", i)
		}
	}
}
