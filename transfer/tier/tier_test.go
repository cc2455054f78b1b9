package tier_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"sync"
	"testing"
	"time"

	"log/slog"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/layout"
	"kvdock/core/testkit/chunks"
	"kvdock/core/testkit/testpool"
	"kvdock/core/tierstate"
	"kvdock/settings"
	"kvdock/transfer/tier"
	"kvdock/transfer/tier/memtier"
)

// testLayout is a 256-byte chunk (2 layers × 2 × 4 tokens × 8 × float16).
func testLayout(t *testing.T) layout.Layout { return chunks.Layout(t, 2, 4, 8, "float16") }

func testKey(i int) keys.ObjectKey { return chunks.Tagged(i, "org/model:v1", 0xAB) }

func payload(n, seed int) []byte { return chunks.Payload(n, seed, 7, 13, 1) }

func TestKeyHoldsFullHashModelRankLayoutSalt(t *testing.T) {
	lay := testLayout(t)
	k := testKey(3)
	k.Salt = "s@lt"
	got := tier.Key(k, lay)
	// The fingerprint as documented: CRC-32C of the format version u16 LE,
	// dims u8, dims × i64 LE, dtype length u8, dtype.
	enc := []byte{byte(tier.Version), byte(tier.Version >> 8), byte(len(lay.Shape))}
	for _, d := range lay.Shape {
		enc = binary.LittleEndian.AppendUint64(enc, uint64(d))
	}
	enc = append(append(enc, byte(len(lay.Dtype))), lay.Dtype...)
	fp := fmt.Sprintf("%08x", crc32.Checksum(enc, crc32.MakeTable(crc32.Castagnoli)))
	if tier.Fingerprint(lay) != fp {
		t.Fatalf("tier.Fingerprint = %q, want %q", tier.Fingerprint(lay), fp)
	}
	want := fmt.Sprintf("%x@org/model:v1@%08x@%s@s@lt", k.Chunk[:], k.KVRank, fp)
	if got != want {
		t.Fatalf("tier.Key = %q, want %q", got, want)
	}
	k2 := k
	k2.Chunk[31] ^= 1 // differs only past the log prefix
	if tier.Key(k2, lay) == got {
		t.Fatal("keys differing in the last hash byte collide")
	}
}

// TestKeyDiffersPerLayout: the same chunk of the same model under another
// dtype, hidden size, layer count, chunk size or MLA is another key; the
// same layout built again is the same key (hosts share).
func TestKeyDiffersPerLayout(t *testing.T) {
	lay := testLayout(t)
	k := testKey(5)
	same, _ := layout.New(2, 4, 8, "float16", false)
	if tier.Key(k, same) != tier.Key(k, lay) {
		t.Fatal("the same layout gives another key")
	}
	seen := map[string]string{tier.Key(k, lay): "base"}
	for name, args := range map[string]struct {
		layers, chunk, hidden int
		dtype                 string
		mla                   bool
	}{
		"bfloat16":       {2, 4, 8, "bfloat16", false},
		"hidden 16":      {2, 4, 16, "float16", false},
		"layers 4":       {4, 4, 8, "float16", false},
		"chunk 8":        {2, 8, 8, "float16", false},
		"mla":            {2, 4, 8, "float16", true},
		"same bytes":     {4, 2, 8, "float16", false},
		"float32 half h": {2, 4, 4, "float32", false},
	} {
		l, err := layout.New(args.layers, args.chunk, args.hidden, args.dtype, args.mla)
		if err != nil {
			t.Fatal(err)
		}
		key := tier.Key(k, l)
		if prev, ok := seen[key]; ok {
			t.Fatalf("layouts %s and %s share key %q", name, prev, key)
		}
		seen[key] = name
	}
}

func TestHeaderRoundTripAndRejections(t *testing.T) {
	lay := testLayout(t)
	key := tier.Key(testKey(1), lay)
	p := payload(int(lay.Bytes), 1)
	v, err := tier.Encode(key, lay, p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tier.Verify(v, key, lay)
	if err != nil || !bytes.Equal(got, p) {
		t.Fatalf("round trip: err %v, equal %v", err, bytes.Equal(got, p))
	}
	other, _ := layout.New(2, 4, 8, "bfloat16", false)
	shape, _ := layout.New(4, 2, 8, "float16", false) // same bytes, other shape
	if shape.Bytes != lay.Bytes {
		t.Fatalf("test layouts: %d vs %d bytes", shape.Bytes, lay.Bytes)
	}
	mutate := func(f func([]byte) []byte) []byte { return f(append([]byte(nil), v...)) }
	cases := []struct {
		name    string
		v       []byte
		key     string
		lay     layout.Layout
		foreign bool
	}{
		{"foreign key", v, tier.Key(testKey(2), lay), lay, true},
		{"foreign dtype", v, key, other, true},
		{"foreign shape same size", v, key, shape, true},
		{"foreign dtype, flipped byte", func() []byte {
			f, _ := tier.Encode(key, other, p)
			f[len(f)-1] ^= 0x01
			return f
		}(), key, lay, false},
		{"flipped payload byte", mutate(func(b []byte) []byte { b[len(b)-5] ^= 0x10; return b }), key, lay, false},
		{"flipped header byte", mutate(func(b []byte) []byte { b[12] ^= 0x01; return b }), key, lay, false},
		{"flipped dims byte", mutate(func(b []byte) []byte { b[10+len(key)] ^= 0x02; return b }), key, lay, false},
		{"flipped checksum", mutate(func(b []byte) []byte { b[len(b)-len(p)-1] ^= 0x80; return b }), key, lay, false},
		{"truncated payload", v[:len(v)-1], key, lay, false},
		{"truncated header", v[:10], key, lay, false},
		{"header only", v[:len(v)-len(p)-1], key, lay, false},
		{"huge key length", mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[6:], 1<<31); return b }), key, lay, false},
		{"extra byte", append(append([]byte(nil), v...), 0), key, lay, false},
		{"empty", nil, key, lay, false},
		{"wrong version", mutate(func(b []byte) []byte { b[4] = 2; return b }), key, lay, false},
		{"wrong magic", mutate(func(b []byte) []byte { b[0] = 'X'; return b }), key, lay, false},
	}
	for _, c := range cases {
		_, err := tier.Verify(c.v, c.key, c.lay)
		if !errors.Is(err, tier.ErrCorrupt) {
			t.Errorf("%s: tier.Verify err = %v, want ErrCorrupt", c.name, err)
		}
		// Intact values of another key or layout are foreign (kept); all
		// else is damage under our key (deleted).
		if errors.Is(err, tier.ErrForeign) != c.foreign {
			t.Errorf("%s: tier.Verify err = %v, foreign want %v", c.name, err, c.foreign)
		}
	}
}

// fakeLayouts answers one layout for every group.
type fakeLayouts struct{ l layout.Layout }

func (f fakeLayouts) LayoutOf(string, int, uint64, uint32) (layout.Layout, bool) { return f.l, true }

func openPool(t *testing.T, size int64) *l1.Pool {
	t.Helper()
	return openPoolB(t, size)
}

func openPoolB(t testing.TB, size int64) *l1.Pool {
	t.Helper()
	return testpool.Anon(t, size)
}

// store publishes data under k in p.
func store(t *testing.T, p *l1.Pool, k keys.ObjectKey, data []byte) {
	t.Helper()
	res, err := p.ReserveWrite(l1.InstanceOwner(1), []keys.ObjectKey{k}, int64(len(data)))
	if err != nil || len(res) != 1 {
		t.Fatalf("reserve %v: %v (%d)", k, err, len(res))
	}
	dst, release := p.View(res[0].Offset, res[0].Length)
	copy(dst, data)
	release()
	if !p.FinishWrite(res) {
		t.Fatal("finish write")
	}
}

// read returns k's bytes from p through the lookup-then-hold path a worker uses.
func read(t *testing.T, p *l1.Pool, k keys.ObjectKey) []byte {
	t.Helper()
	ref, ok := p.HoldRead(k)
	if !ok {
		t.Fatalf("%v: no read lock to hold", k)
	}
	defer p.ReleaseRead([]l1.ReadRef{ref})
	src, release := p.View(ref.Offset, ref.Length)
	defer release()
	return append([]byte(nil), src...)
}

func newSet(t *testing.T, p *l1.Pool, lay layout.Layout, opts tier.Options, bs ...tier.Backend) *tier.Set {
	t.Helper()
	s := tier.NewSet(bs, p, fakeLayouts{lay}, opts)
	runSet(t, s)
	return s
}

// runSet runs s until the test ends, then closes it.
func runSet(t *testing.T, s *tier.Set) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; _ = s.Close() })
}

// waitQueue waits until tier i's queue is empty.
func waitQueue(t *testing.T, s *tier.Set, i int) tier.QueueStats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		q := s.Queue(i)
		if q.Depth == 0 {
			return q
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue of tier %d not drained: %+v", i, q)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestWriteBehindStoresPublishedBytes(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	mt := memtier.New()
	s := newSet(t, p, lay, tier.Options{}, mt)
	ks := storeN(t, p, lay, 10)
	s.Enqueue(ks, lay)
	q := waitQueue(t, s, 0)
	if q.Written != 10 || q.Dropped != 0 {
		t.Fatalf("queue %+v, want 10 written", q)
	}
	for i, k := range ks {
		v := mt.Values()[tier.Key(k, lay)]
		got, err := tier.Verify(v, tier.Key(k, lay), lay)
		if err != nil || !bytes.Equal(got, payload(int(lay.Bytes), i)) {
			t.Fatalf("chunk %d in the tier: %v", i, err)
		}
		if p.IsLocked(k) {
			t.Fatalf("chunk %d still locked after its tier write", i)
		}
	}
}

// TestWriteBehindChecksumsEverySlice: a chunk larger than a writer's copy
// slice (1 MiB) is checksummed slice by slice as it is copied; the value in
// the tier verifies, so every slice went into the checksum.
func TestWriteBehindChecksumsEverySlice(t *testing.T) {
	lay, err := layout.New(4, 64, 1536, "float32", false) // 2*4*64*1536*4 = 3 MiB
	if err != nil {
		t.Fatal(err)
	}
	p := openPool(t, 16<<20)
	mt := memtier.New()
	s := newSet(t, p, lay, tier.Options{}, mt)
	ks := []keys.ObjectKey{testKey(0), testKey(1)}
	for i, k := range ks {
		store(t, p, k, payload(int(lay.Bytes), i))
	}
	s.Enqueue(ks, lay)
	if q := waitQueue(t, s, 0); q.Written != 2 {
		t.Fatalf("queue %+v, want 2 written", q)
	}
	holdsPayloads(t, mt.Values(), ks, lay)
}

// holdsPayloads fails t unless vals holds, under each key of ks, a value
// that verifies as the payload of the key's index.
func holdsPayloads(t *testing.T, vals map[string][]byte, ks []keys.ObjectKey, lay layout.Layout) {
	t.Helper()
	for i, k := range ks {
		got, err := tier.Verify(vals[tier.Key(k, lay)], tier.Key(k, lay), lay)
		if err != nil || !bytes.Equal(got, payload(int(lay.Bytes), i)) {
			t.Fatalf("chunk %d in the tier: %v", i, err)
		}
	}
}

// TestWriteBehindFailedWritesCountAsDropped: writes the tier refuses (a
// full filesystem, a server down) show in the snapshot's DroppedWrites, the
// figure /status and /metrics carry.
func TestWriteBehindFailedWritesCountAsDropped(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	mt := memtier.New()
	mt.SetDown("no space left")
	s := newSet(t, p, lay, tier.Options{}, mt)
	ks := storeN(t, p, lay, 4)
	s.Enqueue(ks, lay)
	if q := waitQueue(t, s, 0); q.Failed != 4 || q.Dropped != 0 {
		t.Fatalf("queue %+v, want 4 failed", q)
	}
	if st := s.Stats()[0]; st.DroppedWrites != 4 {
		t.Fatalf("DroppedWrites %d for 4 refused writes: %+v", st.DroppedWrites, st)
	}
}

// TestStateChangeBetweenWatchTicksIsReported: a tier that goes down and
// comes back up before the watcher looks (a short outage, or one between
// NewSet and Run) still gets its events: down with the reason, then up,
// when the backend tells its changes (StateNotifier); at least the up
// again (a new Since) when the watcher only polls.
func TestStateChangeBetweenWatchTicksIsReported(t *testing.T) {
	for _, tc := range []struct {
		name   string
		wrap   func(*memtier.Tier) tier.Backend
		events string
	}{
		{"notifier", func(mt *memtier.Tier) tier.Backend { return mt }, "down(connection reset) up()"},
		{"poll only", func(mt *memtier.Tier) tier.Backend { return struct{ tier.Backend }{mt} }, "up()"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lay := testLayout(t)
			p := openPool(t, 1<<20)
			mt := memtier.New()
			changed := make(chan tierstate.Tier, 4)
			s := tier.NewSet([]tier.Backend{tc.wrap(mt)}, p, fakeLayouts{lay}, tier.Options{
				StateChanged: func(st tierstate.Tier) { changed <- st },
			})
			mt.SetDown("connection reset")
			mt.SetDown("")
			runSet(t, s)
			var got []string
			for len(strings.Join(got, " ")) < len(tc.events) {
				select {
				case st := <-changed:
					got = append(got, fmt.Sprintf("%s(%s)", st.State, st.Reason))
				case <-time.After(10 * time.Second):
					t.Fatalf("events %q, want %q: a down-and-up spell between two watcher ticks went unreported", got, tc.events)
				}
			}
			if strings.Join(got, " ") != tc.events {
				t.Fatalf("events %q, want %q", got, tc.events)
			}
		})
	}
}

func TestWriteBehindFullQueueDropsAndNeverBlocks(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	mt := memtier.New()
	mt.Block() // a hung tier: every write waits
	entered := mt.Entered(64)
	s := newSet(t, p, lay, tier.Options{QueueItems: 4, QueueBytes: 1 << 30, WorkersPerTier: 1, WriteTimeout: time.Minute}, mt)
	ks := storeN(t, p, lay, 20)
	s.Enqueue(ks[:1], lay)
	<-entered // the worker is stuck in Put with the first chunk
	done := make(chan struct{})
	go func() { s.Enqueue(ks[1:], lay); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Enqueue blocked on a hung tier")
	}
	q := s.Queue(0)
	if q.Dropped != 15 || q.Depth != 5 {
		t.Fatalf("queue %+v, want 15 dropped and 5 queued (4 waiting + 1 writing)", q)
	}
	if st := s.Stats()[0]; st.DroppedWrites != 15 || st.QueueDepth != 5 || st.QueueBytes != 5*lay.Bytes {
		t.Fatalf("stats %+v", st)
	}
	mt.Unblock()
	go func() {
		for range entered {
		}
	}()
	if q := waitQueue(t, s, 0); q.Written != 5 {
		t.Fatalf("after unblocking: %+v, want 5 written", q)
	}
}

func TestWriteBehindQueueBytesBound(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	mt := memtier.New()
	mt.Block()
	entered := mt.Entered(64)
	s := newSet(t, p, lay, tier.Options{QueueItems: 1000, QueueBytes: 3 * lay.Bytes, WorkersPerTier: 1, WriteTimeout: time.Minute}, mt)
	ks := storeN(t, p, lay, 10)
	s.Enqueue(ks, lay)
	<-entered
	if q := s.Queue(0); q.Dropped != 7 || q.Bytes != 3*lay.Bytes {
		t.Fatalf("queue %+v, want 7 dropped and %d bytes", q, 3*lay.Bytes)
	}
	mt.Unblock()
	go func() {
		for range entered {
		}
	}()
	waitQueue(t, s, 0)
}

func TestWriteBehindSkipsEvictedChunk(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	mt := memtier.New()
	mt.Block()
	entered := mt.Entered(64)
	s := newSet(t, p, lay, tier.Options{WorkersPerTier: 1}, mt)
	store(t, p, testKey(0), payload(int(lay.Bytes), 0))
	store(t, p, testKey(1), payload(int(lay.Bytes), 1))
	s.Enqueue([]keys.ObjectKey{testKey(0), testKey(1)}, lay)
	<-entered // chunk 0 is being written; chunk 1 waits in the queue
	p.Clear() // chunk 0 was copied out already; chunk 1 goes before its copy
	mt.Unblock()
	go func() {
		for range entered {
		}
	}()
	q := waitQueue(t, s, 0)
	if q.Written != 1 || q.Skipped != 1 {
		t.Fatalf("queue %+v, want chunk 0 written, chunk 1 skipped", q)
	}
	if _, ok := mt.Values()[tier.Key(testKey(1), lay)]; ok {
		t.Fatal("a cleared chunk reached the tier")
	}
}

// A clear or eviction between pinning and copying must not change the bytes
// copied: the hold keeps the published object's slot.
func TestWriteBehindClearDuringCopyWritesPublishedBytes(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 4*lay.Bytes) // room for 4 objects: the rewrite below must evict or reuse
	mt := memtier.New()
	s := tier.NewSet([]tier.Backend{mt}, p, fakeLayouts{lay}, tier.Options{WorkersPerTier: 1})
	want := payload(int(lay.Bytes), 7)
	store(t, p, testKey(0), want)
	var once sync.Once
	tier.SetBeforeCopy(s, func(keys.ObjectKey) {
		once.Do(func() {
			p.Clear()
			// Fill the pool with other bytes: a freed slot would be rewritten.
			refill(p, lay, 1, 4)
		})
	})
	runSet(t, s)
	s.Enqueue([]keys.ObjectKey{testKey(0)}, lay)
	if q := waitQueue(t, s, 0); q.Written != 1 {
		t.Fatalf("queue %+v, want 1 written", q)
	}
	got, err := tier.Verify(mt.Values()[tier.Key(testKey(0), lay)], tier.Key(testKey(0), lay), lay)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("tier holds other bytes than the published chunk (err %v)", err)
	}
	if st := p.Stats(); st.Doomed != 0 {
		t.Fatalf("the held object was not freed after the copy: %+v", st)
	}
}

// storeN publishes testKey(i) with payload i in p for i in [0, n) and
// returns the keys.
func storeN(t *testing.T, p *l1.Pool, lay layout.Layout, n int) []keys.ObjectKey {
	t.Helper()
	var ks []keys.ObjectKey
	for i := range n {
		k := testKey(i)
		store(t, p, k, payload(int(lay.Bytes), i))
		ks = append(ks, k)
	}
	return ks
}

// encoded is testKey(i) and its payload i encoded as a tier value of lay.
func encoded(t *testing.T, lay layout.Layout, i int) (keys.ObjectKey, []byte) {
	t.Helper()
	k := testKey(i)
	v, err := tier.Encode(tier.Key(k, lay), lay, payload(int(lay.Bytes), i))
	if err != nil {
		t.Fatal(err)
	}
	return k, v
}

// putTier stores chunks 0..n-1 in mt as the write-behind path would.
func putTier(t *testing.T, mt *memtier.Tier, lay layout.Layout, from, n int) []keys.ObjectKey {
	t.Helper()
	var ks []keys.ObjectKey
	for i := from; i < from+n; i++ {
		k, v := encoded(t, lay, i)
		mt.Set(tier.Key(k, lay), v)
		ks = append(ks, k)
	}
	return ks
}

func TestPrefetchLoadsTierChunksIntoL1Locked(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	a, b := memtier.New(), memtier.New()
	s := newSet(t, p, lay, tier.Options{MaxInFlight: 2}, a, b)
	ks := putTier(t, a, lay, 0, 3)
	ks = append(ks, putTier(t, b, lay, 3, 2)...) // the second tier continues the prefix
	ks = append(ks, testKey(99))                 // absent everywhere
	n := s.Prefetch(context.Background(), "m", 1, ks, 1, 1)
	if n != 5 {
		t.Fatalf("prefetched %d chunks, want 5", n)
	}
	for i, k := range ks[:5] {
		if got := read(t, p, k); !bytes.Equal(got, payload(int(lay.Bytes), i)) {
			t.Fatalf("chunk %d: L1 bytes differ from the tier's", i)
		}
	}
	st := s.Stats()
	if st[0].Loads != 3 || st[1].Loads != 2 || st[0].Hits != 3 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPrefetchMultiRankChunk(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	mt := memtier.New()
	s := newSet(t, p, lay, tier.Options{}, mt)
	ks := putTier(t, mt, lay, 0, 5) // read as 2 chunks of 2 ranks, the 5th key a partial chunk
	ks = append(ks, testKey(50))
	if n := s.Prefetch(context.Background(), "m", 2, ks, 2, 2); n != 2 {
		t.Fatalf("prefetched %d chunks, want 2", n)
	}
	if !p.IsLocked(ks[3]) || p.IsLocked(ks[4]) {
		t.Fatal("locks: chunk 1 must be locked, the partial chunk must not be loaded")
	}
	p.FinishRead(ks[:4], 2)
	if p.IsLocked(ks[0]) {
		t.Fatal("count = 2 read locks per key expected")
	}
}

func TestPrefetchDownTierAnswersWithinTimeout(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	down, hung := memtier.New(), memtier.New()
	putTier(t, hung, lay, 0, 3)
	down.SetDown("connection refused")
	hung.Block()
	s := newSet(t, p, lay, tier.Options{LoadTimeout: 200 * time.Millisecond}, down, hung)
	start := time.Now()
	n := s.Prefetch(context.Background(), "m", 1, []keys.ObjectKey{testKey(0), testKey(1), testKey(2)}, 1, 1)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("prefetch over a hung tier took %v, load timeout 200ms", took)
	}
	if n != 0 {
		t.Fatalf("prefetched %d from a down and a hung tier", n)
	}
	hung.Unblock()
}

func TestPrefetchHungLoadIsUndoneAfterTimeout(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	mt := memtier.New()
	ks := putTier(t, mt, lay, 0, 2)
	// A backend that ignores ctx: its Get returns only when released.
	sg := &stuckGets{Tier: mt, release: make(chan struct{})}
	s := tier.NewSet([]tier.Backend{sg}, p, fakeLayouts{lay}, tier.Options{LoadTimeout: 200 * time.Millisecond})
	start := time.Now()
	if n := s.Prefetch(context.Background(), "m", 1, ks, 1, 1); n != 0 {
		t.Fatalf("prefetched %d", n)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("a backend ignoring ctx held the lookup %v", took)
	}
	close(sg.release) // the abandoned loads now end
	tier.Stop(s)      // and are waited for
	if st := p.Stats(); st.ReadLocked != 0 || st.WriteLocked != 0 {
		t.Fatalf("abandoned loads left locks: %+v", st)
	}
}

// stuckGets is a tier whose Get ignores ctx and waits for release.
type stuckGets struct {
	*memtier.Tier
	release chan struct{}
}

func (g *stuckGets) Get(ctx context.Context, key string) ([]byte, error) {
	<-g.release
	return g.Tier.Get(context.Background(), key)
}

// TestPrefetchCorruptValueIsMissCountedDeleted: a value under our real key
// that fails its checksum is a miss, counted, and deleted (it is ours); a
// value of another layout written by hand under our real key is a miss,
// counted, never served, and left alone (it is not ours to destroy).
func TestPrefetchCorruptValueIsMissCountedDeleted(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	mt := memtier.New()
	s := newSet(t, p, lay, tier.Options{}, mt)
	ks := putTier(t, mt, lay, 0, 4)
	v := mt.Values()[tier.Key(ks[1], lay)]
	v[len(v)-3] ^= 0xFF
	mt.Set(tier.Key(ks[1], lay), v)
	other, _ := layout.New(2, 4, 8, "bfloat16", false)
	if other.Bytes != lay.Bytes {
		t.Fatalf("test layouts: %d vs %d bytes", other.Bytes, lay.Bytes)
	}
	foreign, _ := tier.Encode(tier.Key(ks[3], lay), other, payload(int(other.Bytes), 3))
	mt.Set(tier.Key(ks[3], lay), foreign)
	if n := s.Prefetch(context.Background(), "m", 1, ks, 1, 1); n != 1 {
		t.Fatalf("prefetched %d, want 1 (chunk 1 is corrupt)", n)
	}
	// Every chunk's load runs, so chunk 3 is asked for (and rejected) too.
	if st := s.Stats()[0]; st.Corrupt != 2 {
		t.Fatalf("corrupt = %d, want 2 (chunks 1 and 3): %+v", st.Corrupt, st)
	}
	if _, ok := mt.Values()[tier.Key(ks[1], lay)]; ok {
		t.Fatal("the corrupt value was not deleted")
	}
	if p.IsLocked(ks[2]) {
		t.Fatal("a chunk after the failed one is still locked")
	}
	// Asked for on its own, the kept foreign value is rejected again.
	if n := s.Prefetch(context.Background(), "m", 1, ks[3:], 1, 1); n != 0 {
		t.Fatalf("foreign layout served: %d", n)
	}
	if st := s.Stats()[0]; st.Corrupt != 3 || st.Hits != 2 {
		t.Fatalf("corrupt = %d, hits = %d, want 3 and 2 (chunks 0 and 2)", st.Corrupt, st.Hits)
	}
	if p.ReserveReadPrefix(ks[3:4], 1) != 0 {
		t.Fatal("the foreign value reached L1")
	}
	if got := mt.Values()[tier.Key(ks[3], lay)]; !bytes.Equal(got, foreign) {
		t.Fatal("the intact foreign value was deleted or changed")
	}
}

// TestTwoLayoutsShareOneTier: two hosts register the same model name with
// other layouts (float16 and bfloat16, the same chunk bytes) and store the
// same chunks into one shared tier. Both hosts' values survive side by
// side, each host gets hits with its own bytes, nothing is rejected or
// deleted.
func TestTwoLayoutsShareOneTier(t *testing.T) {
	layA := testLayout(t)
	layB, _ := layout.New(2, 4, 8, "bfloat16", false)
	shared := memtier.New()
	const n = 6
	type host struct {
		lay  layout.Layout
		pool *l1.Pool
		set  *tier.Set
		seed int
	}
	hosts := []*host{{lay: layA, seed: 0}, {lay: layB, seed: 100}}
	var ks []keys.ObjectKey
	for i := range n {
		ks = append(ks, testKey(i))
	}
	for _, h := range hosts {
		h.pool = openPool(t, 1<<20)
		h.set = newSet(t, h.pool, h.lay, tier.Options{}, shared)
		for i, k := range ks {
			store(t, h.pool, k, payload(int(h.lay.Bytes), h.seed+i))
		}
		h.set.Enqueue(ks, h.lay)
		if q := waitQueue(t, h.set, 0); q.Written != n {
			t.Fatalf("%s host: queue %+v, want %d written", h.lay.Dtype, q, n)
		}
	}
	if got := len(shared.Values()); got != 2*n {
		t.Fatalf("shared tier holds %d values, want %d: the hosts overwrote each other", got, 2*n)
	}
	for _, h := range hosts {
		h.pool.Clear() // as after a restart: only the tier has the chunks
		if got := h.set.Prefetch(context.Background(), "m", 1, ks, 1, 1); got != n {
			t.Fatalf("%s host: prefetched %d, want %d", h.lay.Dtype, got, n)
		}
		for i, k := range ks {
			if got := read(t, h.pool, k); !bytes.Equal(got, payload(int(h.lay.Bytes), h.seed+i)) {
				t.Fatalf("%s host: chunk %d has other bytes than it stored", h.lay.Dtype, i)
			}
		}
		if st := h.set.Stats()[0]; st.Corrupt != 0 || st.Hits != n {
			t.Fatalf("%s host: stats %+v, want %d hits and nothing corrupt", h.lay.Dtype, st, n)
		}
	}
	if got := len(shared.Values()); got != 2*n {
		t.Fatalf("shared tier holds %d values after the reads, want %d", got, 2*n)
	}
}

func TestPrefetchBoundsLoadsInFlight(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	mt := memtier.New()
	ks := putTier(t, mt, lay, 0, 16)
	c := &countingTier{Tier: mt}
	s := newSet(t, p, lay, tier.Options{MaxInFlight: 3}, c)
	if n := s.Prefetch(context.Background(), "m", 1, ks, 1, 1); n != 16 {
		t.Fatalf("prefetched %d", n)
	}
	if c.peak > 3 {
		t.Fatalf("%d loads in flight, bound 3", c.peak)
	}
}

type countingTier struct {
	*memtier.Tier
	mu        sync.Mutex
	cur, peak int
}

func (c *countingTier) Get(ctx context.Context, key string) ([]byte, error) {
	c.mu.Lock()
	c.cur++
	c.peak = max(c.peak, c.cur)
	c.mu.Unlock()
	defer func() { c.mu.Lock(); c.cur--; c.mu.Unlock() }()
	return c.Tier.Get(ctx, key)
}

func TestOpenAllUnknownTypeClosesOpened(t *testing.T) {
	var opened []*memtier.Tier
	openers := map[string]tier.Opener{"mem": func(context.Context, settings.Adapter, *slog.Logger) (tier.Backend, error) {
		m := memtier.New()
		opened = append(opened, m)
		return m, nil
	}}
	_, err := tier.OpenAll(context.Background(), []settings.Adapter{{Type: "mem"}, {Type: "nope"}}, openers, nil)
	if err == nil {
		t.Fatal("unknown type accepted")
	}
	if len(opened) != 1 {
		t.Fatalf("opened %d", len(opened))
	}
	if err := opened[0].Put(context.Background(), "k", nil); err == nil {
		t.Fatal("the opened tier was not closed")
	}
}

// With every load slot taken by a hung load, the rest of the chunks give up
// at the load timeout without starting (no goroutine per waiting chunk).
func TestPrefetchSlotsTakenGiveUpAtTimeout(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	mt := memtier.New()
	ks := putTier(t, mt, lay, 0, 3)
	h := &hungGets{Tier: mt, started: make(chan struct{}, 8)}
	s := newSet(t, p, lay, tier.Options{MaxInFlight: 1, LoadTimeout: 200 * time.Millisecond}, h)
	start := time.Now()
	if n := s.Prefetch(context.Background(), "m", 1, ks, 1, 1); n != 0 {
		t.Fatalf("prefetched %d through a hung tier", n)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("took %v, load timeout 200ms", took)
	}
	if n := len(h.started); n != 1 {
		t.Fatalf("%d loads started with 1 slot", n)
	}
	// The chunk that never got a slot is counted before Prefetch returns;
	// the hung load counts its own timeout when it notices its ctx ended,
	// which may be just after.
	deadline := time.Now().Add(5 * time.Second)
	for s.Stats()[0].LoadTimeouts < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("timeouts not counted: %+v", s.Stats()[0])
		}
		time.Sleep(time.Millisecond)
	}
}

// hungGets is a tier whose Get hangs until its ctx ends.
type hungGets struct {
	*memtier.Tier
	started chan struct{}
}

func (h *hungGets) Get(ctx context.Context, key string) ([]byte, error) {
	h.started <- struct{}{}
	<-ctx.Done()
	return nil, ctx.Err()
}

// recordingPuts is a whole-value backend that remembers where each value
// it was given lay, and holds its first Put until release is closed.
type recordingPuts struct {
	*memtier.Tier
	release chan struct{}
	mu      sync.Mutex
	at      []*byte
}

func (r *recordingPuts) Put(ctx context.Context, key string, value []byte) error {
	r.mu.Lock()
	r.at = append(r.at, &value[0])
	first := len(r.at) == 1
	r.mu.Unlock()
	if first {
		<-r.release
	}
	return r.Tier.Put(ctx, key, value)
}

// TestWriteBehindReusesItsValueBuffer: a writer with more queued behind the
// chunk it writes builds the next value in the same buffer (no fresh 3 MiB
// per chunk), and every value stored is still its own chunk's bytes.
func TestWriteBehindReusesItsValueBuffer(t *testing.T) {
	lay, err := layout.New(4, 64, 1536, "float32", false) // 3 MiB
	if err != nil {
		t.Fatal(err)
	}
	p := openPool(t, 16<<20)
	rec := &recordingPuts{Tier: memtier.New(), release: make(chan struct{})}
	s := newSet(t, p, lay, tier.Options{WorkersPerTier: 1}, rec)
	ks := []keys.ObjectKey{testKey(0), testKey(1), testKey(2)}
	for i, k := range ks {
		store(t, p, k, payload(int(lay.Bytes), i))
	}
	s.Enqueue(ks, lay)
	close(rec.release)
	if q := waitQueue(t, s, 0); q.Written != 3 {
		t.Fatalf("queue %+v, want 3 written", q)
	}
	holdsPayloads(t, rec.Values(), ks, lay)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.at) != 3 || rec.at[1] != rec.at[0] || rec.at[2] != rec.at[0] {
		t.Fatalf("value buffers %v: want one buffer for the three back-to-back writes", rec.at)
	}
}

// pacedParts is a PartsPutter that calls pace once per MiB of payload, as
// the fs tier does per piece it writes.
type pacedParts struct{ *memtier.Tier }

func (p pacedParts) PutParts(ctx context.Context, key string, head, payload []byte, valid func() bool, pace func()) error {
	if pace == nil {
		return errors.New("no pace given")
	}
	for off := 0; off < len(payload); off += 1 << 20 {
		pace()
	}
	if !valid() {
		return tier.ErrSourceChanged
	}
	return p.Tier.Put(ctx, key, append(append([]byte(nil), head...), payload...))
}

// TestWriteBehindYieldsToRequests: while requests keep coming (the request
// path's last message is always now), a writer waits its longest (10 ms)
// before each MiB it copies, checksums or writes, and still writes the
// chunk, whole; with the request path quiet it does not wait.
func TestWriteBehindYieldsToRequests(t *testing.T) {
	lay, err := layout.New(4, 64, 1536, "float32", false) // 3 MiB
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		wrap   func(*memtier.Tier) tier.Backend
		pieces int // the MiB yields of one write: copy, or checksum then file write
	}{
		{"whole value", func(mt *memtier.Tier) tier.Backend { return mt }, 3},
		{"parts", func(mt *memtier.Tier) tier.Backend { return pacedParts{mt} }, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, busy := range []bool{true, false} {
				last := func() time.Time { return time.Time{} }
				if busy {
					last = time.Now
				}
				took := timeOneWrite(t, lay, last, tc.wrap, nil)
				if min := time.Duration(tc.pieces) * 10 * time.Millisecond; busy && took < min {
					t.Errorf("requests coming: the write took %v, want at least %v (%d yields of 10 ms)", took, min, tc.pieces)
				}
			}
		})
	}
}

// TestWriteBehindYieldsToTierLookups: with no message coming (the request
// path looks idle) but a lookup in its tier phase, waiting on a tier, a
// writer still waits its longest before each piece, so its writes do not
// queue ahead of the lookup's call at the tier; once the lookup is done it
// writes at once.
func TestWriteBehindYieldsToTierLookups(t *testing.T) {
	lay, err := layout.New(4, 64, 1536, "float32", false) // 3 MiB
	if err != nil {
		t.Fatal(err)
	}
	for _, lookup := range []bool{true, false} {
		idle := func() time.Time { return time.Time{} }
		var before func(*tier.Set)
		release := func() {}
		if lookup {
			// Held for the whole write: a release on a timer could come
			// before a loaded machine even started writing.
			before = func(s *tier.Set) { release = tier.HoldTierPhase(s) }
		}
		took := timeOneWrite(t, lay, idle, func(mt *memtier.Tier) tier.Backend { return pacedParts{mt} }, before)
		release()
		if want := 6 * 10 * time.Millisecond; lookup && took < want {
			t.Errorf("a lookup in its tier phase: the write took %v, want at least %v (6 yields of 10 ms)", took, want)
		}
	}
}

// timeOneWrite stores one chunk of lay in a fresh pool, has a one-writer
// Set (LastRequest last, over wrap of a memtier) write it to its tier, and
// returns how long the write took once the tier holds the chunk's bytes.
// before, when set, runs on the Set before the chunk is queued.
func timeOneWrite(t *testing.T, lay layout.Layout, last func() time.Time, wrap func(*memtier.Tier) tier.Backend, before func(*tier.Set)) time.Duration {
	t.Helper()
	p := openPool(t, 16<<20)
	mt := memtier.New()
	s := newSet(t, p, lay, tier.Options{WorkersPerTier: 1, LastRequest: last}, wrap(mt))
	if before != nil {
		before(s)
	}
	k := testKey(0)
	store(t, p, k, payload(int(lay.Bytes), 0))
	start := time.Now()
	s.Enqueue([]keys.ObjectKey{k}, lay)
	if q := waitQueue(t, s, 0); q.Written != 1 {
		t.Fatalf("queue %+v, want 1 written", q)
	}
	took := time.Since(start)
	holdsPayloads(t, mt.Values(), []keys.ObjectKey{k}, lay)
	return took
}
