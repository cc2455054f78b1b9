package lookup

import (
	"fmt"
	"testing"

	"kvdock/core/keys"
	"kvdock/core/misses"
	"kvdock/core/whatif"
)

// Benchmark lookups (a model named with BenchModelPrefix) are counted in
// Stats.Bench only: the workers' figures, the miss breakdown and the
// what-if estimator do not see them, so a bench run against a live server
// leaves the workers' picture as it was.
func TestBenchTrafficKeptApart(t *testing.T) {
	est := whatif.New(whatif.Options{PoolBytes: 1 << 30, MinSamples: 1024, MaxSamples: 1024})
	store := newStore()
	cl := &presenceClassifier{store: store}
	f := newFixtureStore(t, Options{WhatIf: est, Misses: cl}, store)
	bench := BenchModelPrefix + "llama"
	f.m.layouts = layoutsSet{"m/1": true, bench + "/1": true}
	ts := tokens(10 * cs)
	for _, k := range keysOf(t, ts, 1)[:4] { // the worker's first 4 chunks
		store.present[k] = true
	}
	if err := f.m.Lookup(lookupReq("w", ts, 1), 0); err != nil {
		t.Fatal(err)
	}
	before, curve, miss := f.m.Stats(), est.Curve(), f.m.Misses()
	for range 50 {
		r := keys.KeyRequest{RequestID: "b", Model: bench, WorldSize: 1, Tokens: tokens(10 * cs)}
		if err := f.m.Lookup(r, 0); err != nil {
			t.Fatal(err)
		}
	}
	after := f.m.Stats()
	if after.Lookups != 1 || after.RequestedChunks != 10 || after.HitChunks != 4 || after.RequestedTokens != before.RequestedTokens {
		t.Fatalf("workers' figures moved with bench traffic: before %+v after %+v", before, after)
	}
	if b := after.Bench; b.Lookups != 50 || b.RequestedChunks != 500 || b.HitChunks != 0 {
		t.Fatalf("bench figures %+v, want 50 lookups of 500 chunks, no hit", b)
	}
	if got := est.Curve(); got.Sampled != curve.Sampled || curve.Sampled == 0 {
		t.Fatalf("what-if sampled %d keys after bench traffic, %d before (want equal and not 0)", got.Sampled, curve.Sampled)
	}
	if got := f.m.Misses(); got.Total != miss.Total || miss.Total[misses.NeverStored] != 6 {
		t.Fatalf("miss breakdown %v after bench traffic, %v before (want 6 never stored, unchanged)", got.Total, miss.Total)
	}
	// The per-model figures show the bench apart.
	ms := f.m.ModelStats()
	if len(ms) != 2 || ms[0].Model != bench || ms[0].Lookups != 50 || ms[1].Model != "m" || ms[1].Lookups != 1 {
		t.Fatalf("model stats %+v, want the bench's and m's apart", ms)
	}
}

// A name that merely looks like a benchmark's is a worker's.
func TestIsBench(t *testing.T) {
	for model, want := range map[string]bool{
		BenchModelPrefix + "x": true, BenchModelPrefix: true,
		"bench-llama-3.1-8b": false, "kvdock-bench": false, "meta-llama/Llama-3.1-8B": false, "KVDOCK-BENCH:x": false,
	} {
		if IsBench(model) != want {
			t.Errorf("IsBench(%q) = %v, want %v", model, !want, want)
		}
	}
}

// ResetStats zeroes the counters, the per-model figures, the miss
// breakdown and the unregistered models; jobs stay answerable.
func TestResetStats(t *testing.T) {
	store := newStore()
	f := newFixtureStore(t, Options{Misses: &presenceClassifier{store: store}}, store)
	ts := tokens(6 * cs)
	for _, k := range keysOf(t, ts, 1)[:2] {
		store.present[k] = true
	}
	if err := f.m.Lookup(lookupReq("r", ts, 1), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Lookup(keys.KeyRequest{RequestID: "g", Model: "gone", WorldSize: 1, Tokens: ts}, 0); err != nil {
		t.Fatal(err)
	}
	if st := f.m.Stats(); st.Lookups != 2 || st.HitChunks != 2 || f.m.Misses().Total.Total() != 4 || len(f.m.Unregistered()) != 1 {
		t.Fatalf("before the reset: %+v, misses %v", st, f.m.Misses().Total)
	}
	f.m.ResetStats()
	st := f.m.Stats()
	if st.Lookups != 0 || st.EarlyExits != 0 || st.RequestedChunks != 0 || st.HitChunks != 0 || st.HitTokens != 0 || st.RequestedTokens != 0 {
		t.Fatalf("after the reset: %+v", st)
	}
	if f.m.Misses().Total.Total() != 0 || len(f.m.ModelStats()) != 0 || len(f.m.Unregistered()) != 0 {
		t.Fatalf("after the reset: misses %v, models %+v, unregistered %+v", f.m.Misses().Total, f.m.ModelStats(), f.m.Unregistered())
	}
	if hit, done := f.m.QueryStatus("r"); !done || hit != 2 {
		t.Fatalf("the job was lost by the reset: %d, %v", hit, done)
	}
}

// A model no worker registered is remembered with its lookups (bounded,
// most recent first) until a worker registers it.
func TestUnregisteredModels(t *testing.T) {
	f := newFixture(t, Options{})
	layouts := layoutsSet{"m/1": true}
	f.m.layouts = layouts
	look := func(model string) {
		t.Helper()
		if err := f.m.Lookup(keys.KeyRequest{RequestID: "r", Model: model, WorldSize: 1, Tokens: tokens(2 * cs)}, 0); err != nil {
			t.Fatal(err)
		}
	}
	look("a")
	look("a")
	look("b")
	u := f.m.Unregistered()
	if len(u) != 2 || u[0].Model != "b" || u[1].Model != "a" || u[1].Lookups != 2 {
		t.Fatalf("unregistered %+v, want b then a (2 lookups)", u)
	}
	for i := range 2 * MaxUnregistered {
		look(fmt.Sprint("x", i))
	}
	if u := f.m.Unregistered(); len(u) != MaxUnregistered {
		t.Fatalf("%d unregistered models kept, want the bound %d", len(u), MaxUnregistered)
	}
	look("a")
	layouts["a/1"] = true
	for _, e := range f.m.Unregistered() {
		if e.Model == "a" {
			t.Fatalf("a is registered now but still listed: %+v", e)
		}
	}
	if st := f.m.Stats(); st.Lookups != 3+2*MaxUnregistered+1 || st.EarlyExits != st.Lookups {
		t.Fatalf("stats %+v: every lookup is an early exit", st)
	}
}
