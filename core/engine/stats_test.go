package engine

import (
	"context"
	"strings"
	"testing"

	"kvdock/core/lookup"
	"kvdock/core/protocol"
	"kvdock/transfer/worker"
)

// A bench worker's lookups (model "kvdock-bench:…") leave the workers'
// figures, miss breakdown and what-if as they were; ResetStats zeroes them
// and the rates' lookup histories, keeps the cache, and says when.
func TestBenchApartAndResetStats(t *testing.T) {
	e, _, c := startDialed(t)
	ctx := context.Background()
	sched := worker.Scheduler{C: c}
	reg := func(id int64, model string) *worker.Worker { return newWorker(t, c, id, model) }
	e.sampleRates() // the first reading is the counters' baseline
	w := reg(7, "real")
	b := reg(8, lookup.BenchModelPrefix+"small")
	n := w.ChunkTokens()
	toks := seqTokens(4 * n)
	chunk := make([]byte, w.Layout().Bytes)
	if res, err := w.Store(ctx, w.Key(toks[:2*n], 2, "s"), [][]byte{chunk, chunk}); err != nil || !res.Committed {
		t.Fatalf("store: %+v %v", res, err)
	}
	if hits, err := sched.Hits(ctx, w.LookupKey(toks, "w"), 1); err != nil || hits != 2 {
		t.Fatalf("worker lookup: %d hits, %v", hits, err)
	}
	e.sampleRates()
	before := e.Snapshot()
	for i := range 20 {
		if hits, err := sched.Hits(ctx, b.LookupKey(toks, "b"+string(rune('a'+i))), 1); err != nil || hits != 0 {
			t.Fatalf("bench lookup: %d hits, %v", hits, err)
		}
	}
	e.sampleRates()
	after := e.Snapshot()
	if after.Lookup.Lookups != 1 || after.Lookup.HitChunks != 2 || after.Lookup.Bench.Lookups != 20 || after.Lookup.Bench.RequestedChunks != 80 {
		t.Fatalf("lookup figures after bench traffic: %+v", after.Lookup)
	}
	if after.WhatIf.Sampled != before.WhatIf.Sampled || after.Misses.Total != before.Misses.Total {
		t.Fatalf("bench traffic reached the what-if (%d → %d sampled) or the misses (%v → %v)",
			before.WhatIf.Sampled, after.WhatIf.Sampled, before.Misses.Total, after.Misses.Total)
	}
	if after.Rates.Server.TokensSavedTotal != 2*int64(n) {
		t.Fatalf("tokens saved %d, want the worker's 2 chunks of %d", after.Rates.Server.TokensSavedTotal, n)
	}

	at, err := e.ResetStats(ClearByCtl)
	if err != nil {
		t.Fatal(err)
	}
	e.sampleRates()
	s := e.Snapshot()
	if s.Lookup.Lookups != 0 || s.Lookup.Bench.Lookups != 0 || s.Misses.Total.Total() != 0 || s.WhatIf.Sampled != 0 || len(s.WhatIf.Points) != 0 {
		t.Fatalf("after the reset: lookup %+v, misses %v, what-if %d sampled", s.Lookup, s.Misses.Total, s.WhatIf.Sampled)
	}
	if hit := sum(s.Rates.Server.HitChunks.Fine); s.Rates.Server.TokensSavedTotal != 0 || hit != 0 {
		t.Fatalf("after the reset the rates still hold %d tokens saved, %v hit chunks", s.Rates.Server.TokensSavedTotal, hit)
	}
	if !s.Stats.ResetAt.Equal(at) || !s.Stats.Since.Equal(at) {
		t.Fatalf("stats window %+v, want since the reset at %v", s.Stats, at)
	}
	if s.Pool.Objects != before.Pool.Objects || s.Pool.Objects == 0 {
		t.Fatalf("the reset changed the cache: %d objects, %d before", s.Pool.Objects, before.Pool.Objects)
	}
	found := false
	for _, ev := range s.Events {
		found = found || strings.Contains(ev.Message, "statistics reset by kvdock ctl")
	}
	if !found {
		t.Fatal("no event says the statistics were reset")
	}
	// Lookups after the reset count from zero, the stored chunks still hit.
	if hits, err := sched.Hits(ctx, w.LookupKey(toks, "w2"), 1); err != nil || hits != 2 {
		t.Fatalf("worker lookup after the reset: %d hits, %v", hits, err)
	}
	e.sampleRates()
	if s := e.Snapshot(); s.Lookup.Lookups != 1 || s.Rates.Server.TokensSavedTotal != 2*int64(n) {
		t.Fatalf("after the reset and one lookup: %d lookups, %d tokens saved", s.Lookup.Lookups, s.Rates.Server.TokensSavedTotal)
	}
}

// A lookup of a model no worker registered is named in the snapshot.
func TestUnregisteredModelInSnapshot(t *testing.T) {
	e, _, c := startDialed(t)
	sched := worker.Scheduler{C: c}
	key := protocol.Key{ModelName: "gone-model", WorldSize: 1, TokenIDs: make([]uint32, 512), End: 512, RequestID: "r"}
	if hits, err := sched.Hits(context.Background(), key, 1); err != nil || hits != 0 {
		t.Fatalf("lookup: %d hits, %v", hits, err)
	}
	u := e.Snapshot().Unregistered
	if len(u) != 1 || u[0].Model != "gone-model" || u[0].Lookups != 1 {
		t.Fatalf("unregistered %+v", u)
	}
	if got := UnregisteredMessage(u[0].Model, u[0].WorldSize); got != "no worker registered for model gone-model (world size 1): lookups answer 0" {
		t.Fatalf("message %q", got)
	}
	// The events say it once, not every second.
	e.sampleRates()
	e.sampleRates()
	n := 0
	for _, ev := range e.Snapshot().Events {
		if strings.Contains(ev.Message, `no worker registered for model "gone-model" (world size 1): lookups answer 0`) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d events name the unregistered model, want 1: %+v", n, e.Snapshot().Events)
	}
}

func sum(v []float64) float64 {
	var t float64
	for _, x := range v {
		t += x
	}
	return t
}

// A pool above 80 % of the available memory starts with a warning event.
func TestStartWarnsOfAPoolThatLeavesLittleMemory(t *testing.T) {
	cfg, _ := testConfig(t)
	e := New(cfg, Options{Memory: fixedMemory(cfg.L1.SizeBytes() * 11 / 10)})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	found := ""
	for _, ev := range e.Snapshot().Events {
		if strings.Contains(ev.Message, "MemAvailable, 91 %") {
			found = ev.Message
		}
	}
	if !strings.Contains(found, "above 80 %") {
		t.Fatalf("no memory warning among the events: %+v", e.Snapshot().Events)
	}
}
