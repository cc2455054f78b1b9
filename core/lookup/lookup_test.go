package lookup

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"kvdock/core/keys"
	"kvdock/core/layout"
	"kvdock/core/testkit/fakeclock"
)

var _ Layouts = (*layout.Registry)(nil)

// fakeStore models L1 read locks: present keys are readable; locks counts
// held locks per key.
type fakeStore struct {
	mu       sync.Mutex
	present  map[keys.ObjectKey]bool
	locks    map[keys.ObjectKey]int
	reserves int
	touched  []keys.ObjectKey
}

func newStore() *fakeStore {
	return &fakeStore{present: map[keys.ObjectKey]bool{}, locks: map[keys.ObjectKey]int{}}
}

func (f *fakeStore) ReserveLookup(_, _ string, ks []keys.ObjectKey, count int) (int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reserves++
	for i, k := range ks {
		if !f.present[k] {
			return i, false
		}
		f.locks[k] += count
	}
	return len(ks), false
}

func (f *fakeStore) FinishRead(ks []keys.ObjectKey, count int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range ks {
		f.locks[k] -= count
	}
}

func (f *fakeStore) Touch(ks []keys.ObjectKey) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.touched = append(f.touched, ks...)
}

func (f *fakeStore) lockOf(k keys.ObjectKey) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.locks[k]
}

func (f *fakeStore) totalLocks() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.locks {
		n += c
	}
	return n
}

type layoutsSet map[string]bool

func (l layoutsSet) Registered(model string, ws int) ([]uint64, []int) {
	if l[fmt.Sprint(model, "/", ws)] {
		return []uint64{0}, []int{1}
	}
	return nil, nil
}

const cs = 4

type fixture struct {
	m     *Module
	s     *keys.Sessions
	store *fakeStore
	clk   *fakeclock.Clock
}

// lookup sends LOOKUP of ts under request id for world size ws (worker 1)
// and fails t when it errs.
func (f *fixture) lookup(t *testing.T, id string, ts []uint32, ws int) {
	t.Helper()
	if err := f.m.Lookup(lookupReq(id, ts, ws), 1); err != nil {
		t.Fatal(err)
	}
}

// inL1 marks every full chunk of ts (world size 1) present in the store.
func (f *fixture) inL1(t *testing.T, ts []uint32) {
	t.Helper()
	for _, k := range keysOf(t, ts, 1) {
		f.store.present[k] = true
	}
}

func newFixture(t *testing.T, opts Options) *fixture {
	t.Helper()
	return newFixtureStore(t, opts, newStore())
}

// newFixtureStore is newFixture over a given store.
func newFixtureStore(t *testing.T, opts Options, store *fakeStore) *fixture {
	t.Helper()
	h, err := keys.NewHasher(cs, "blake3")
	if err != nil {
		t.Fatal(err)
	}
	clk := fakeclock.New()
	s := keys.NewSessions(h, 0, clk.Now)
	opts.Now = clk.Now
	m := New(s, store, layoutsSet{"m/1": true, "m/2": true}, opts)
	return &fixture{m: m, s: s, store: store, clk: clk}
}

func tokens(n int) []uint32 {
	ts := make([]uint32, n)
	for i := range ts {
		ts[i] = uint32(i*7 + 3)
	}
	return ts
}

// keysOf returns the all-rank keys of the full chunks of ts.
func keysOf(t *testing.T, ts []uint32, ws int) []keys.ObjectKey {
	h, err := keys.NewHasher(cs, "blake3")
	if err != nil {
		t.Fatal(err)
	}
	return keys.ObjectKeys(h.Hashes(ts), "m", ws, nil, "")
}

func lookupReq(id string, ts []uint32, ws int) keys.KeyRequest {
	return keys.KeyRequest{RequestID: id, Model: "m", WorldSize: ws, Tokens: ts}
}

func TestExtraCount(t *testing.T) {
	for _, c := range []struct{ tp, ws, want int }{
		{1, 1, 0}, {2, 2, 0}, {4, 1, 3}, {8, 2, 7}, {0, 2, 0}, {1, 4, 0}, {2, 4, 0},
	} {
		if got := ExtraCount(c.tp, c.ws); got != c.want {
			t.Errorf("ExtraCount(tp %d, ws %d) = %d, want %d", c.tp, c.ws, got, c.want)
		}
	}
}

func TestLookupLeadingPrefix(t *testing.T) {
	f := newFixture(t, Options{})
	ts := tokens(4*cs + 2) // 4 full chunks
	ks := keysOf(t, ts, 2) // 8 keys, chunk-major
	// chunks 0, 1 on both ranks; chunk 2 on rank 0 only; chunk 3 on both.
	for _, i := range []int{0, 1, 2, 3, 4, 6, 7} {
		f.store.present[ks[i]] = true
	}
	f.lookup(t, "r", ts, 2)
	for i, want := range []int{1, 1, 1, 1, 0, 0, 0, 0} {
		if got := f.store.lockOf(ks[i]); got != want {
			t.Errorf("key %d holds %d locks, want %d", i, got, want)
		}
	}
	if n, ok := f.m.QueryHits("r"); n != 2 || !ok {
		t.Fatalf("QueryHits = %d, %v; want 2", n, ok)
	}
	st := f.m.Stats()
	if st.Lookups != 1 || st.RequestedChunks != 4 || st.RequestedTokens != int64(len(ts)) || st.HitChunks != 2 || st.HitTokens != 2*cs || st.ActiveJobs != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLookupMLAExtraLocks(t *testing.T) {
	f := newFixture(t, Options{})
	ts := tokens(3 * cs)
	ks := keysOf(t, ts, 1)
	f.store.present[ks[0]] = true
	f.store.present[ks[1]] = true
	if err := f.m.Lookup(lookupReq("mla", ts, 1), 4); err != nil {
		t.Fatal(err)
	}
	if a, b, c := f.store.lockOf(ks[0]), f.store.lockOf(ks[1]), f.store.lockOf(ks[2]); a != 4 || b != 4 || c != 0 {
		t.Fatalf("locks %d %d %d, want 4 4 0", a, b, c)
	}
	if n, _ := f.m.QueryStatus("mla"); n != 2 {
		t.Fatalf("hit chunks %d, want 2", n)
	}
	// FREE_LOOKUP_LOCKS with the same tp releases 4 per key.
	if err := f.m.FreeLocks(keys.KeyRequest{RequestID: "mla", Model: "m", WorldSize: 1, Tokens: ts, Start: 0, End: 2 * cs}, 4); err != nil {
		t.Fatal(err)
	}
	if n := f.store.totalLocks(); n != 0 {
		t.Fatalf("%d locks left after FreeLocks", n)
	}
}

func TestLookupNoLocksAfterFirstMiss(t *testing.T) {
	f := newFixture(t, Options{})
	ts := tokens(3 * cs)
	ks := keysOf(t, ts, 1)
	f.store.present[ks[1]] = true
	f.store.present[ks[2]] = true
	f.lookup(t, "miss0", ts, 1)
	if n := f.store.totalLocks(); n != 0 {
		t.Fatalf("%d locks taken after a first-chunk miss", n)
	}
	if n, done := f.m.QueryStatus("miss0"); n != 0 || !done {
		t.Fatalf("status %d, %v", n, done)
	}
}

func TestQueryStatusOnce(t *testing.T) {
	f := newFixture(t, Options{})
	ts := tokens(2 * cs)
	f.inL1(t, ts)
	f.lookup(t, "q", ts, 1)
	for range 2 {
		if n, ok := f.m.QueryHits("q"); n != 2 || !ok {
			t.Fatalf("QueryHits = %d, %v", n, ok)
		}
	}
	if n, done := f.m.QueryStatus("q"); n != 2 || !done {
		t.Fatalf("first status %d, %v; want 2", n, done)
	}
	if n, done := f.m.QueryStatus("q"); n != 0 || !done {
		t.Fatalf("second status %d, %v; want 0", n, done)
	}
	if n, ok := f.m.QueryHits("q"); n != 0 || !ok {
		t.Fatalf("hits after status = %d, %v", n, ok)
	}
	if n, done := f.m.QueryStatus("never"); n != 0 || !done {
		t.Fatalf("unknown id: %d, %v", n, done)
	}
	if st := f.m.Stats(); st.ActiveJobs != 0 || st.AnsweredJobs != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLookupEarlyExits(t *testing.T) {
	f := newFixture(t, Options{})
	ts := tokens(2 * cs)
	f.inL1(t, ts)
	// Unregistered world size, then a prompt shorter than one chunk.
	f.lookup(t, "nolayout", ts, 4)
	f.lookup(t, "short", ts[:cs-1], 1)
	if f.store.reserves != 0 {
		t.Fatal("an early exit reached the store")
	}
	if f.s.Len() != 0 {
		t.Fatal("an early exit created a session")
	}
	if f.m.ActiveJobs() != 2 {
		t.Fatalf("ActiveJobs = %d, want 2 (jobs with 0)", f.m.ActiveJobs())
	}
	for _, id := range []string{"nolayout", "short"} {
		if n, _ := f.m.QueryStatus(id); n != 0 {
			t.Fatalf("%s: %d hits", id, n)
		}
	}
	if st := f.m.Stats(); st.EarlyExits != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLookupInvalidKeyRecordsZero(t *testing.T) {
	f := newFixture(t, Options{})
	ts := tokens(2 * cs)
	f.inL1(t, ts)
	f.lookup(t, "x", ts, 1)
	bad := lookupReq("x", ts, 1)
	bad.Salt = "a/b"
	err := f.m.Lookup(bad, 1)
	if err == nil || !strings.Contains(err.Error(), "cache_salt") {
		t.Fatalf("err = %v", err)
	}
	if n, _ := f.m.QueryStatus("x"); n != 0 {
		t.Fatalf("invalid lookup left the stale answer %d", n)
	}
}

func TestLookupReplaceKeepsOldLocks(t *testing.T) {
	f := newFixture(t, Options{})
	ts := tokens(2 * cs)
	ks := keysOf(t, ts, 1)
	for _, k := range ks {
		f.store.present[k] = true
	}
	for range 2 {
		f.lookup(t, "same", ts, 1)
	}
	if f.m.ActiveJobs() != 1 {
		t.Fatalf("ActiveJobs = %d, want 1", f.m.ActiveJobs())
	}
	if n := f.store.lockOf(ks[0]); n != 2 {
		t.Fatalf("key 0 holds %d locks, want 2 (the replaced job's lock stays)", n)
	}
	if st := f.m.Stats(); st.ReplacedJobs != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestFreeLocks(t *testing.T) {
	f := newFixture(t, Options{})
	ts := tokens(3 * cs)
	ks := keysOf(t, ts, 2) // 6 keys
	for _, k := range ks {
		f.store.present[k] = true
	}
	f.lookup(t, "f", ts, 2)
	// Worker 1 frees chunk 1 only: one key.
	w := 1
	if err := f.m.FreeLocks(keys.KeyRequest{RequestID: "f", Model: "m", WorldSize: 2, Worker: &w, Tokens: ts, Start: cs, End: 2 * cs}, 1); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{1, 1, 1, 0, 1, 1} {
		if got := f.store.lockOf(ks[i]); got != want {
			t.Errorf("after worker free: key %d holds %d, want %d", i, got, want)
		}
	}
	// The scheduler frees chunk 2 on every rank.
	if err := f.m.FreeLocks(keys.KeyRequest{RequestID: "f", Model: "m", WorldSize: 2, Tokens: ts, Start: 2 * cs, End: 3 * cs}, 1); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{1, 1, 1, 0, 0, 0} {
		if got := f.store.lockOf(ks[i]); got != want {
			t.Errorf("after scheduler free: key %d holds %d, want %d", i, got, want)
		}
	}
	if st := f.m.Stats(); st.FreedKeys != 3 {
		t.Fatalf("FreedKeys = %d", st.FreedKeys)
	}
	if err := f.m.FreeLocks(keys.KeyRequest{RequestID: "f", Model: "m", WorldSize: 2, Tokens: ts, Start: 1, End: cs}, 1); err == nil {
		t.Fatal("misaligned start accepted")
	}
}

func TestEndSessionTouches(t *testing.T) {
	f := newFixture(t, Options{})
	ts := tokens(3*cs + 1)
	f.lookup(t, "e", ts, 2)
	f.m.EndSession("e")
	want := keysOf(t, ts, 2)
	if fmt.Sprint(f.store.touched) != fmt.Sprint(want) || len(want) != 6 {
		t.Fatalf("touched %d keys, want the 6 lookup keys", len(f.store.touched))
	}
	f.m.EndSession("e")       // gone: no touch, no error
	f.m.EndSession("unknown") // never existed
	if len(f.store.touched) != 6 {
		t.Fatalf("touched %d keys after repeated ends", len(f.store.touched))
	}
	if f.s.Len() != 0 {
		t.Fatal("session survived EndSession")
	}
	if st := f.m.Stats(); st.TouchedKeys != 6 {
		t.Fatalf("TouchedKeys = %d", st.TouchedKeys)
	}
}

func TestJobBounds(t *testing.T) {
	f := newFixture(t, Options{JobTTL: time.Minute, MaxJobs: 3})
	ts := tokens(cs)
	for i := range 4 {
		f.lookup(t, fmt.Sprint("j", i), ts, 1)
	}
	if n := f.m.ActiveJobs(); n != 3 {
		t.Fatalf("ActiveJobs = %d, want MaxJobs 3", n)
	}
	if _, ok := f.m.jobs["j0"]; ok {
		t.Fatal("oldest job kept past MaxJobs")
	}
	f.clk.Advance(59 * time.Second)
	if n := f.m.ActiveJobs(); n != 3 {
		t.Fatalf("ActiveJobs = %d before the TTL", n)
	}
	f.clk.Advance(time.Second)
	if n := f.m.Sweep(); n != 3 {
		t.Fatalf("Sweep dropped %d, want 3", n)
	}
	if st := f.m.Stats(); st.ExpiredJobs != 3 || st.EvictedJobs != 1 || st.ActiveJobs != 0 || st.JobBytes != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestConcurrentLookups(t *testing.T) {
	f := newFixture(t, Options{})
	ts := tokens(8 * cs)
	for _, k := range keysOf(t, ts, 2)[:10] { // chunks 0..4 on both ranks
		f.store.present[k] = true
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				id := fmt.Sprint(g, "-", i)
				if err := f.m.Lookup(lookupReq(id, ts, 2), 1); err != nil {
					t.Error(err)
					return
				}
				if n, _ := f.m.QueryStatus(id); n != 5 {
					t.Errorf("%s: %d hits, want 5", id, n)
				}
				f.m.EndSession(id)
			}
		}()
	}
	wg.Wait()
	if n := f.store.totalLocks(); n != 160*10 {
		t.Fatalf("%d locks, want %d", n, 160*10)
	}
}
