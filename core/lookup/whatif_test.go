package lookup

import (
	"testing"

	"kvdock/core/whatif"
)

// The what-if estimator sees every key a lookup asks for, the ones after
// the pool's first miss included and past the first lock batch, with the
// pool's own hits: a larger pool might have held them.
func TestLookupShowsEveryKeyToWhatIf(t *testing.T) {
	est := whatif.New(whatif.Options{PoolBytes: 1 << 30, MinSamples: 1024, MaxSamples: 1024})
	f := newFixture(t, Options{WhatIf: est})
	const chunks = 3*lockBatch + 5
	ts := tokens(chunks * cs)
	ks := keysOf(t, ts, 2)
	// The pool holds the first 10 chunks only (both ranks).
	for _, k := range ks[:20] {
		f.store.present[k] = true
	}
	if err := f.m.Lookup(lookupReq("r1", ts, 2), 0); err != nil {
		t.Fatal(err)
	}
	if hit, _ := f.m.QueryStatus("r1"); hit != 10 {
		t.Fatalf("hit %d chunks, want 10", hit)
	}
	// Every key is sampled at first (rate 1): all of them were shown, and
	// the pool's hits on them measured.
	c := est.Curve()
	if c.SampleRate != 1 || c.Sampled != uint64(len(ks)) {
		t.Fatalf("estimator saw %d keys at rate %v, want all %d", c.Sampled, c.SampleRate, len(ks))
	}
	if want := 20.0 / float64(len(ks)); c.Measured < want-1e-9 || c.Measured > want+1e-9 {
		t.Errorf("measured %v, want the pool's 20 hit keys of %d", c.Measured, len(ks))
	}
}
