package lookup

import (
	"testing"

	"kvdock/core/keys"
	"kvdock/core/misses"
)

// presenceClassifier judges chunks by the fake store: every key present is
// AfterMiss, else NeverStored; it records the keys it was asked about.
type presenceClassifier struct {
	store *fakeStore
	asked []keys.ObjectKey
}

func (p *presenceClassifier) ClassifyMisses(ks []keys.ObjectKey, per int, stored misses.Reason, c *misses.Counts) {
	p.asked = append(p.asked, ks...)
	p.store.mu.Lock()
	defer p.store.mu.Unlock()
	for from := 0; from+per <= len(ks); from += per {
		r := stored
		for _, k := range ks[from : from+per] {
			if !p.store.present[k] {
				r = misses.NeverStored
			}
		}
		c[r]++
	}
}

// Every chunk a lookup asked for and did not hit is classified once, per
// context: the tally sums to RequestedChunks - HitChunks.
func TestLookupClassifiesEveryMissedChunk(t *testing.T) {
	store := newStore()
	cl := &presenceClassifier{store: store}
	f := newFixtureStore(t, Options{Misses: cl}, store)
	ts := tokens(200 * cs) // more chunks than one batch
	ks := keysOf(t, ts, 2)
	for _, k := range ks[:2*2] { // chunks 0, 1 on both ranks
		store.present[k] = true
	}
	store.present[ks[2*2]] = true // chunk 2 on rank 0 only
	for _, k := range ks[3*2 : 5*2] {
		store.present[k] = true // chunks 3, 4: behind the gap
	}
	f.lookup(t, "r", ts, 2)
	if err := f.m.Lookup(lookupReq("s", ts[:3*cs], 1), 1); err != nil { // another context
		t.Fatal(err)
	}
	st := f.m.Stats()
	rep := f.m.Misses()
	if got, want := rep.Total.Total(), uint64(st.RequestedChunks-st.HitChunks); got != want || want != 198+3 {
		t.Fatalf("classified %d missed chunks, want %d (stats %+v)", got, want, st)
	}
	if len(cl.asked) != 198*2+3 || cl.asked[0] != ks[2*2] {
		t.Fatalf("classifier asked %d keys, want the 198 missed chunks × 2 ranks + 3", len(cl.asked))
	}
	c2, ok := rep.For(misses.Context{Model: "m", WorldSize: 2})
	if !ok || c2.Missed[misses.AfterMiss] != 2 || c2.Missed[misses.NeverStored] != 196 {
		t.Fatalf("context m/2: %+v", c2)
	}
	if c1, ok := rep.For(misses.Context{Model: "m", WorldSize: 1}); !ok || c1.Missed[misses.NeverStored] != 3 {
		t.Fatalf("context m/1: %+v", c1)
	}
	// A full hit classifies nothing; an unregistered pair exits early.
	cl.asked = nil
	f.lookup(t, "t", ts[:2*cs], 2)
	f.lookup(t, "u", ts, 3)
	if len(cl.asked) != 0 || f.m.Misses().Total != rep.Total {
		t.Fatalf("a full hit or an early exit was classified: %d keys", len(cl.asked))
	}
}

// With tiers, chunks the tiers loaded are hits, the rest are classified
// after the tier phase and counted as tier misses too.
func TestLookupTierPhaseClassifiesTheRest(t *testing.T) {
	store := newStore()
	ft := newFakeTiers(store)
	cl := &presenceClassifier{store: store}
	f := newFixtureStore(t, Options{Tiers: ft, Misses: cl}, store)
	ts := tokens(6 * cs)
	ks := keysOf(t, ts, 1)
	store.present[ks[0]] = true
	for _, k := range ks[1:3] {
		ft.held[k] = true
	}
	f.lookup(t, "r", ts, 1)
	<-ft.calls
	if rep := f.m.Misses(); rep.Total.Total() != 0 {
		t.Fatalf("%d chunks classified before the tier phase ended", rep.Total.Total())
	}
	close(ft.release)
	f.m.Stop()
	rep := f.m.Misses()
	st := f.m.Stats()
	if rep.Total.Total() != 3 || rep.TierMissed != 3 || st.HitChunks != 3 {
		t.Fatalf("misses %+v, hits %d; want 3 missed (chunks 3..5), all tier misses", rep, st.HitChunks)
	}
}
