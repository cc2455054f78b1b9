package lookup

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"kvdock/core/keys"
)

// batchStore finds every key when hit is true and none otherwise, and
// records the largest key slice any call was handed and the locks held.
type batchStore struct {
	hit bool

	mu       sync.Mutex
	maxBatch int
	calls    int
	locks    int64 // read locks held: sum of count over locked keys
}

func (b *batchStore) note(n int) {
	b.calls++
	b.maxBatch = max(b.maxBatch, n)
}

func (b *batchStore) ReserveLookup(_, _ string, ks []keys.ObjectKey, count int) (int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.note(len(ks))
	if !b.hit {
		return 0, false
	}
	b.locks += int64(len(ks)) * int64(count)
	return len(ks), false
}

func (b *batchStore) FinishRead(ks []keys.ObjectKey, count int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.note(len(ks))
	b.locks -= int64(len(ks)) * int64(count)
}

func (b *batchStore) Touch(ks []keys.ObjectKey) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.note(len(ks))
}

// allocated returns the bytes fn allocated on the heap (cumulative, so it is
// an upper bound of what fn held at its peak).
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// retained returns how much the live heap grew across fn, after a GC.
func retained(fn func()) int64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.GC()
	runtime.ReadMemStats(&after)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}

// A LOOKUP of the largest legal prompt over 255 ranks names 2 M keys
// (~150 MiB as ObjectKeys); the module must hand them to the store a batch at
// a time, stop at the first miss, and do the same for FREE_LOOKUP_LOCKS and
// END_SESSION.
func TestLookupKeyExpansionBounded(t *testing.T) {
	const (
		chunk = 256
		ws    = keys.MaxWorldSize
	)
	h, err := keys.NewHasher(chunk, "blake3")
	if err != nil {
		t.Fatal(err)
	}
	ts := make([]uint32, keys.DefaultMaxRequestTokens)
	for i := range ts {
		ts[i] = uint32(i*2654435761) >> 15
	}
	chunks := len(ts) / chunk
	allKeysBytes := uint64(chunks) * ws * uint64(unsafe.Sizeof(keys.ObjectKey{}))
	sessionBytes := uint64(len(ts))*4 + uint64(chunks)*2*32 // token copy, cached and lookup digests
	maxBatch := lockBatch * ws

	for _, hit := range []bool{false, true} {
		t.Run(fmt.Sprintf("hit=%v", hit), func(t *testing.T) {
			store := &batchStore{hit: hit}
			m := New(keys.NewSessions(h, 0, nil), store, allLayouts{}, Options{})
			r := keys.KeyRequest{RequestID: "big", Model: "m", WorldSize: ws, Tokens: ts}
			var lerr error
			got := allocated(func() { lerr = m.Lookup(r, 1) })
			if lerr != nil {
				t.Fatal(lerr)
			}
			t.Logf("LOOKUP of %d tokens × %d ranks (%d keys, %d MiB materialised): %.1f MiB allocated, largest store call %d keys",
				len(ts), ws, chunks*ws, allKeysBytes>>20, float64(got)/(1<<20), store.maxBatch)
			if store.maxBatch > maxBatch {
				t.Fatalf("the store was handed %d keys in one call; at most %d (%d chunks × %d ranks) allowed", store.maxBatch, maxBatch, lockBatch, ws)
			}
			// The session's own copy of the prompt is the floor; the keys
			// must add no more than a few batches on top of it.
			if limit := sessionBytes + 8<<20; got > limit {
				t.Fatalf("LOOKUP allocated %d bytes; bound %d (session %d + 8 MiB)", got, limit, sessionBytes)
			}
			hits, _ := m.QueryHits("big")
			if !hit {
				if hits != 0 || store.calls != 1 {
					t.Fatalf("miss: %d hits after %d store calls; want 0 after 1 (stop at the first miss)", hits, store.calls)
				}
				return
			}
			if hits != chunks || store.locks != int64(chunks*ws) {
				t.Fatalf("hit: %d chunks, %d locks; want %d, %d", hits, store.locks, chunks, chunks*ws)
			}
			store.maxBatch = 0
			free := allocated(func() {
				lerr = m.FreeLocks(keys.KeyRequest{RequestID: "big", Model: "m", WorldSize: ws, Tokens: ts, End: len(ts)}, 1)
			})
			if lerr != nil {
				t.Fatal(lerr)
			}
			if store.locks != 0 || store.maxBatch > maxBatch {
				t.Fatalf("FREE_LOOKUP_LOCKS left %d locks, largest call %d keys", store.locks, store.maxBatch)
			}
			if free > 8<<20 {
				t.Fatalf("FREE_LOOKUP_LOCKS of a cached prompt allocated %d bytes, want ≤ 8 MiB", free)
			}
			store.maxBatch = 0
			end := allocated(func() { m.EndSession("big") })
			if store.maxBatch > maxBatch || end > 8<<20 {
				t.Fatalf("END_SESSION: largest call %d keys, %d bytes allocated", store.maxBatch, end)
			}
			if st := m.Stats(); st.FreedKeys != int64(chunks*ws) || st.TouchedKeys != int64(chunks*ws) {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

func TestLookupRejectsOutOfRangeTPSize(t *testing.T) {
	f := newFixture(t, Options{})
	ts := tokens(2 * cs)
	ks := keysOf(t, ts, 2)
	for _, k := range ks {
		f.store.present[k] = true
	}
	for _, tp := range []int{1 << 31, 256, -1} {
		err := f.m.Lookup(lookupReq("tp", ts, 2), tp)
		if err == nil || !strings.Contains(err.Error(), "tp_size") {
			t.Fatalf("tp_size %d: err = %v, want a tp_size error", tp, err)
		}
		if n := f.store.totalLocks(); n != 0 {
			t.Fatalf("tp_size %d took %d read locks", tp, n)
		}
		if n, _ := f.m.QueryHits("tp"); n != 0 {
			t.Fatalf("tp_size %d recorded %d hits", tp, n)
		}
		free := keys.KeyRequest{RequestID: "tp", Model: "m", WorldSize: 2, Tokens: ts, End: len(ts)}
		if err := f.m.FreeLocks(free, tp); err == nil {
			t.Fatalf("FREE_LOOKUP_LOCKS accepted tp_size %d", tp)
		}
	}
	// The upper end of the range: 255 workers sharing each of 2 ranks.
	if err := f.m.Lookup(lookupReq("tp", ts, 2), MaxTPSize); err != nil {
		t.Fatal(err)
	}
	if n := f.store.lockOf(ks[0]); n != MaxTPSize {
		t.Fatalf("tp_size %d took %d locks per key, want %d", MaxTPSize, n, MaxTPSize)
	}
	free := keys.KeyRequest{RequestID: "tp", Model: "m", WorldSize: 2, Tokens: ts, End: len(ts)}
	if err := f.m.FreeLocks(free, MaxTPSize); err != nil {
		t.Fatal(err)
	}
	if n := f.store.totalLocks(); n != 0 {
		t.Fatalf("%d locks left after FREE_LOOKUP_LOCKS", n)
	}
	if st := f.m.Stats(); st.Failures != 3 {
		t.Fatalf("Failures = %d, want 3", st.Failures)
	}
}

// Request ids are held per job until queried; a peer must not make them cost
// more than the byte bound, whatever their length or number.
func TestLookupJobsBoundedInBytes(t *testing.T) {
	f := newFixture(t, Options{})
	ts := tokens(cs)
	const huge = 8 << 20
	// 8 MiB ids: rejected, never kept, whether or not the model is
	// registered (the early exit records nothing unchecked).
	grew := retained(func() {
		for i := range 16 {
			id := strings.Repeat(string(rune('a'+i)), huge)
			for _, model := range []string{"m", "unregistered"} {
				r := lookupReq(id, ts, 1)
				r.Model = model
				err := f.m.Lookup(r, 1)
				if err == nil || !strings.Contains(err.Error(), "request_id") {
					t.Fatalf("8 MiB id: err = %v", err)
				}
				if len(err.Error()) > 200 {
					t.Fatalf("the error quotes %d bytes of the id", len(err.Error()))
				}
			}
		}
	})
	t.Logf("16 LOOKUPs × 2 with 8 MiB request ids: heap grew %d KiB", grew>>10)
	if grew > 4<<20 || f.m.ActiveJobs() != 0 {
		t.Fatalf("8 MiB ids: heap grew %d bytes, %d jobs kept", grew, f.m.ActiveJobs())
	}
	if n := f.s.Len(); n != 0 {
		t.Fatalf("8 MiB ids left %d sessions", n)
	}

	// 200k distinct ids of the largest legal length.
	const n = 200_000
	pad := strings.Repeat("x", keys.MaxRequestIDLen-8)
	grew = retained(func() {
		for i := range n {
			r := lookupReq(fmt.Sprintf("%s%08d", pad, i), ts, 1)
			r.Model = "unregistered" // no session: this measures the jobs alone
			if err := f.m.Lookup(r, 1); err != nil {
				t.Fatal(err)
			}
		}
	})
	st := f.m.Stats()
	t.Logf("%d LOOKUPs with distinct 256-byte ids: %d jobs kept, %d KiB counted, heap grew %d KiB, %d evicted",
		n, st.ActiveJobs, st.JobBytes>>10, grew>>10, st.EvictedJobs)
	if st.JobBytes > DefaultMaxJobBytes || st.ActiveJobs > DefaultMaxJobs {
		t.Fatalf("jobs over their bounds: %+v", st)
	}
	if st.EvictedJobs != int64(n-st.ActiveJobs) {
		t.Fatalf("EvictedJobs = %d, want %d", st.EvictedJobs, n-st.ActiveJobs)
	}
	// The count is an estimate of the real heap; it must not be far below it.
	if grew > 2*DefaultMaxJobBytes {
		t.Fatalf("heap grew %d bytes for jobs counted as %d", grew, st.JobBytes)
	}
	// The newest job is answered, the oldest gone.
	if h, _ := f.m.QueryHits(fmt.Sprintf("%s%08d", pad, 0)); h != 0 {
		t.Fatal("oldest job kept")
	}
	if _, ok := f.m.jobs[fmt.Sprintf("%s%08d", pad, n-1)]; !ok {
		t.Fatal("newest job dropped")
	}
}

func TestJobByteBoundOption(t *testing.T) {
	f := newFixture(t, Options{MaxJobBytes: 3 * (jobOverhead + 2)})
	for i := range 5 {
		if err := f.m.Lookup(lookupReq(fmt.Sprint("j", i), tokens(cs), 1), 1); err != nil {
			t.Fatal(err)
		}
	}
	st := f.m.Stats()
	if st.ActiveJobs != 3 || st.EvictedJobs != 2 || st.JobBytes != 3*(jobOverhead+2) {
		t.Fatalf("stats %+v", st)
	}
	if _, ok := f.m.jobs["j1"]; ok {
		t.Fatal("an evicted job is still kept")
	}
}

// Lookups, frees, status queries and session ends of one request id, over
// 255 ranks, racing: every lock taken is released and nothing is left over.
func TestLookupSameIDConcurrent(t *testing.T) {
	h, err := keys.NewHasher(16, "blake3")
	if err != nil {
		t.Fatal(err)
	}
	store := &batchStore{hit: true}
	m := New(keys.NewSessions(h, 0, nil), store, allLayouts{}, Options{})
	ts := make([]uint32, 16*200) // 200 chunks: several batches
	for i := range ts {
		ts[i] = uint32(i)
	}
	r := keys.KeyRequest{RequestID: "same", Model: "m", WorldSize: 255, Tokens: ts}
	free := r
	free.End = len(ts)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 4 {
				if err := m.Lookup(r, 1+g%3); err != nil {
					errs <- err
					return
				}
				if err := m.FreeLocks(free, 1+g%3); err != nil {
					errs <- err
					return
				}
				m.QueryHits("same")
				if g%4 == 0 {
					m.EndSession("same")
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if store.locks != 0 || store.maxBatch > lockBatch*255 {
		t.Fatalf("%d read locks left, largest call %d keys", store.locks, store.maxBatch)
	}
}
