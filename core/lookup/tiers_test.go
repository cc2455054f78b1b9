package lookup

import (
	"context"
	"testing"
	"time"

	"kvdock/core/keys"
)

// fakeTiers "loads" the chunks it holds into the fake store when released:
// each Prefetch call waits on release (or ctx), then makes its leading held
// chunks present and locks them as the real tier set does.
type fakeTiers struct {
	store   *fakeStore
	held    map[keys.ObjectKey]bool
	calls   chan []keys.ObjectKey
	release chan struct{}
}

func newFakeTiers(store *fakeStore) *fakeTiers {
	return &fakeTiers{store: store, held: map[keys.ObjectKey]bool{}, calls: make(chan []keys.ObjectKey, 16), release: make(chan struct{})}
}

// newTierFixture is a fixture whose lookups go on to fake tiers over a new
// store.
func newTierFixture(t *testing.T) (*fixture, *fakeStore, *fakeTiers) {
	t.Helper()
	store := newStore()
	ft := newFakeTiers(store)
	return newFixtureStore(t, Options{Tiers: ft}, store), store, ft
}

func (f *fakeTiers) Prefetch(ctx context.Context, model string, ws int, ks []keys.ObjectKey, per, count int) int {
	f.calls <- ks
	select {
	case <-f.release:
	case <-ctx.Done():
		return 0
	}
	n := 0
	for n < len(ks) && f.held[ks[n]] {
		n++
	}
	n = n / per * per
	f.store.mu.Lock()
	for _, k := range ks[:n] {
		f.store.present[k] = true
	}
	f.store.mu.Unlock()
	locked, _ := f.store.ReserveLookup("", "", ks[:n], count)
	return locked / per
}

func TestLookupTierPhaseNoneUntilLoadedThenCount(t *testing.T) {
	f, store, ft := newTierFixture(t)
	ts := tokens(5 * cs)
	ks := keysOf(t, ts, 1)
	store.present[ks[0]] = true // chunk 0 in L1
	for _, k := range ks[1:4] { // chunks 1..3 in the tier, 4 nowhere
		ft.held[k] = true
	}
	f.lookup(t, "r", ts, 1)
	asked := <-ft.calls
	if len(asked) != 4 || asked[0] != ks[1] {
		t.Fatalf("tiers asked for %d keys starting %v, want the 4 after the L1 prefix", len(asked), asked[0])
	}
	if n, done := f.m.QueryHits("r"); done || n != 0 {
		t.Fatalf("QueryHits while loading = %d, %v; want None", n, done)
	}
	if n, done := f.m.QueryStatus("r"); done || n != 0 {
		t.Fatalf("QueryStatus while loading = %d, %v; want None", n, done)
	}
	close(ft.release)
	f.m.Stop() // waits for the tier phase
	if n, done := f.m.QueryHits("r"); !done || n != 4 {
		t.Fatalf("QueryHits after loading = %d, %v; want 4 (1 L1 + 3 tier)", n, done)
	}
	if n, done := f.m.QueryStatus("r"); !done || n != 4 {
		t.Fatalf("QueryStatus = %d, %v; want 4", n, done)
	}
	if n, done := f.m.QueryStatus("r"); !done || n != 0 {
		t.Fatalf("second QueryStatus = %d, %v; want 0 (job removed)", n, done)
	}
	for i, k := range ks[:4] {
		if store.lockOf(k) != 1 {
			t.Fatalf("chunk %d holds %d locks, want 1", i, store.lockOf(k))
		}
	}
	if st := f.m.Stats(); st.TierHitChunks != 3 || st.HitChunks != 4 || st.TierJobs != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLookupTierPhaseReplacedJobReleasesTierLocks(t *testing.T) {
	f, store, ft := newTierFixture(t)
	ts := tokens(2 * cs)
	ks := keysOf(t, ts, 1)
	ft.held[ks[0]], ft.held[ks[1]] = true, true
	f.lookup(t, "r", ts, 1)
	<-ft.calls
	// A new LOOKUP of the same id replaces the running job (L1-only now:
	// it finds nothing in L1 and starts its own tier phase).
	f.lookup(t, "r", tokens(cs-1), 1)
	close(ft.release)
	f.m.Stop()
	if n := store.totalLocks(); n != 0 {
		t.Fatalf("%d locks left by a replaced job's tier phase", n)
	}
}

func TestLookupTierPhaseStopEndsHungTier(t *testing.T) {
	f, _, ft := newTierFixture(t)
	ts := tokens(2 * cs)
	f.lookup(t, "r", ts, 1)
	<-ft.calls
	done := make(chan struct{})
	go func() { f.m.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not end a hung tier phase")
	}
	if n, ok := f.m.QueryStatus("r"); !ok || n != 0 {
		t.Fatalf("after stop: %d, %v", n, ok)
	}
	// No tier phase starts after Stop: the job answers its L1 hits at once.
	f.lookup(t, "r2", ts, 1)
	if n, ok := f.m.QueryStatus("r2"); !ok || n != 0 {
		t.Fatalf("lookup after stop: %d, %v", n, ok)
	}
}

func TestLookupTierPhaseBounded(t *testing.T) {
	store := newStore()
	ft := newFakeTiers(store)
	f := newFixtureStore(t, Options{Tiers: ft, MaxTierJobs: 2}, store)
	ts := tokens(cs)
	for _, id := range []string{"a", "b", "c"} {
		f.lookup(t, id, ts, 1)
	}
	if n, done := f.m.QueryStatus("c"); !done || n != 0 {
		t.Fatalf("third lookup past the bound: %d, %v; want 0 at once", n, done)
	}
	if st := f.m.Stats(); st.TierSkipped != 1 || st.TierRunning != 2 {
		t.Fatalf("stats %+v", st)
	}
	close(ft.release)
	f.m.Stop()
}

// A lookup with a full L1 hit never asks the tiers.
func TestLookupFullL1HitSkipsTiers(t *testing.T) {
	f, store, ft := newTierFixture(t)
	ts := tokens(2 * cs)
	for _, k := range keysOf(t, ts, 1) {
		store.present[k] = true
	}
	f.lookup(t, "r", ts, 1)
	if n, done := f.m.QueryStatus("r"); !done || n != 2 {
		t.Fatalf("%d, %v", n, done)
	}
	if len(ft.calls) != 0 {
		t.Fatal("tiers asked for a full L1 hit")
	}
}

// TestWaitStatusBlocksUntilTheTierPhaseEnds: WAIT_PREFETCH_STATUS answers
// None after its timeout while the job loads, then the count as soon as the
// tier phase ends (woken, not polled), and 0 for an unknown id at once.
func TestWaitStatusBlocksUntilTheTierPhaseEnds(t *testing.T) {
	f, store, ft := newTierFixture(t)
	ts := tokens(3 * cs)
	ks := keysOf(t, ts, 1)
	store.present[ks[0]] = true
	ft.held[ks[1]], ft.held[ks[2]] = true, true
	f.lookup(t, "r", ts, 1)
	<-ft.calls
	if n, done := f.m.WaitStatus(context.Background(), "r", time.Millisecond); done || n != 0 {
		t.Fatalf("WaitStatus while loading = %d, %v; want None", n, done)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, done := f.m.WaitStatus(ctx, "r", time.Hour); done {
		t.Fatal("WaitStatus with an ended context waited for the job")
	}
	type answer struct {
		n    int
		done bool
	}
	got := make(chan answer, 1)
	go func() {
		n, done := f.m.WaitStatus(context.Background(), "r", time.Hour)
		got <- answer{n, done}
	}()
	close(ft.release)
	select {
	case a := <-got:
		if !a.done || a.n != 3 {
			t.Fatalf("WaitStatus after loading = %d, %v; want 3", a.n, a.done)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("WaitStatus not woken by the end of the tier phase")
	}
	if n, done := f.m.WaitStatus(context.Background(), "unknown", time.Hour); !done || n != 0 {
		t.Fatalf("unknown id = %d, %v; want 0 at once", n, done)
	}
}

// knownAbsentTiers are fakeTiers that know from memory which chunks they
// lack.
type knownAbsentTiers struct {
	*fakeTiers
	asked chan []keys.ObjectKey
}

func (k knownAbsentTiers) KnownAbsent(model string, ws int, ks []keys.ObjectKey, per int) bool {
	k.asked <- ks
	return !k.held[ks[0]]
}

// TestLookupKnownAbsentAnswersAtOnce: when the tiers know from memory that
// they lack the chunk after the L1 prefix, the lookup runs no tier phase:
// the first status query has the answer. When they may hold it, the tier
// phase runs as before.
func TestLookupKnownAbsentAnswersAtOnce(t *testing.T) {
	store := newStore()
	kt := knownAbsentTiers{newFakeTiers(store), make(chan []keys.ObjectKey, 4)}
	f := newFixtureStore(t, Options{Tiers: kt}, store)
	ts := tokens(3 * cs)
	ks := keysOf(t, ts, 1)
	store.present[ks[0]] = true // chunk 0 in L1, 1 and 2 nowhere
	f.lookup(t, "r", ts, 1)
	select {
	case asked := <-kt.asked:
		if len(asked) != 1 || asked[0] != ks[1] {
			t.Fatalf("asked about %v, want the first chunk after the L1 prefix", asked)
		}
	default:
		t.Fatal("the lookup did not ask the tiers whether they know the chunk absent")
	}
	if n, done := f.m.QueryStatus("r"); !done || n != 1 {
		t.Fatalf("QueryStatus = %d, %v; want 1 at once", n, done)
	}
	select {
	case ks := <-kt.calls:
		t.Fatalf("a tier phase ran for %d keys the tiers know they lack", len(ks))
	default:
	}
	kt.held[ks[1]] = true // now a tier may hold chunk 1
	f.lookup(t, "r2", ts, 1)
	<-kt.asked
	<-kt.calls
	if _, done := f.m.QueryStatus("r2"); done {
		t.Fatal("the lookup skipped the tier phase of a chunk a tier may hold")
	}
	close(kt.release)
	f.m.Stop()
}
