package engine

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"kvdock/core/lookup"
	"kvdock/core/protocol"
	"kvdock/core/testkit/fakeclock"
	"kvdock/core/workers"
)

// TestRatesFromCounters: the sampler turns the modules' cumulative counters
// into per-second rates for the server, per context (its own bytes, its
// group's lookups) and tokens saved; a reset counter (pool rebuild) counts
// from zero and a context that goes is dropped.
func TestRatesFromCounters(t *testing.T) {
	clk := fakeclock.New()
	r := newRates()
	ctxA := workers.ContextInfo{InstanceID: 1, Model: "m", WorldSize: 1}
	ctxB := workers.ContextInfo{InstanceID: 2, Model: "n", WorldSize: 2}
	at := func(lookups, asked, hit, tokens int64, a, b workers.ContextInfo, ga, gb lookup.ModelStats, ev, used float64) sample {
		return sample{now: clk.Now(), lookup: lookup.Stats{Lookups: lookups, RequestedChunks: asked, HitChunks: hit, HitTokens: tokens},
			groups: []lookup.ModelStats{ga, gb}, contexts: []workers.ContextInfo{a, b}, evictions: ev, used: used}
	}
	gA := lookup.ModelStats{Model: "m", WorldSize: 1}
	gB := lookup.ModelStats{Model: "n", WorldSize: 2}
	r.add(at(100, 1000, 500, 8000, ctxA, ctxB, gA, gB, 7, 1<<20)) // baseline

	clk.Advance(2 * time.Second)
	ctxA.BytesIn, ctxA.BytesOut = 4<<20, 2<<20
	ctxB.BytesIn = 2 << 20
	gA.Lookups, gA.RequestedChunks, gA.HitChunks, gA.HitTokens = 10, 40, 30, 30*256
	gB.Lookups, gB.RequestedChunks = 10, 60
	r.add(at(120, 1100, 530, 8000+30*256, ctxA, ctxB, gA, gB, 11, 2<<20))

	w := r.window()
	s := w.Server
	for name, got := range map[string]float64{
		"lookups/s": s.Lookups.Last(), "asked/s": s.AskedChunks.Last(), "hit/s": s.HitChunks.Last(),
		"store B/s": s.StoreBytes.Last(), "retrieve B/s": s.RetrieveBytes.Last(), "evictions/s": s.Evictions.Last(),
		"pool used": s.PoolUsed.Last(), "tokens/s": s.TokensSaved.Last(),
	} {
		want := map[string]float64{"lookups/s": 10, "asked/s": 50, "hit/s": 15, "store B/s": 3 << 20,
			"retrieve B/s": 1 << 20, "evictions/s": 2, "pool used": 2 << 20, "tokens/s": 15 * 256}[name]
		if got != want {
			t.Errorf("server %s = %v, want %v", name, got, want)
		}
	}
	if n := len(s.Lookups.Fine); n != 3 {
		t.Errorf("%d fine points after a baseline and a 2 s sample, want 3 (one a second)", n)
	}
	if s.TokensSavedTotal != 30*256 || s.TokensSavedHour != 30*256 {
		t.Errorf("tokens saved total %d, last hour %v; want %d both", s.TokensSavedTotal, s.TokensSavedHour, 30*256)
	}
	a, b := w.Contexts[1], w.Contexts[2]
	if a.StoreBytes.Last() != 2<<20 || a.RetrieveBytes.Last() != 1<<20 || a.Lookups.Last() != 5 || a.HitChunks.Last() != 15 || a.AskedChunks.Last() != 20 {
		t.Errorf("context 1: %+v", a)
	}
	if r, ok := hitRatio(a); !ok || r != 0.75 {
		t.Errorf("context 1 hit ratio %v %v, want 0.75", r, ok)
	}
	if b.StoreBytes.Last() != 1<<20 || b.HitChunks.Last() != 0 || b.AskedChunks.Last() != 30 || b.TokensSavedTotal != 0 {
		t.Errorf("context 2: %+v", b)
	}
	if a.TokensSavedTotal != 30*256 {
		t.Errorf("context 1 tokens saved %d, want %d", a.TokensSavedTotal, 30*256)
	}

	// A rebuild: counters restart from zero, context 2 is gone.
	clk.Advance(time.Second)
	r.add(sample{now: clk.Now(), lookup: lookup.Stats{Lookups: 4, RequestedChunks: 8, HitChunks: 2, HitTokens: 512},
		groups:   []lookup.ModelStats{{Model: "m", WorldSize: 1, Lookups: 4, RequestedChunks: 8, HitChunks: 2, HitTokens: 512}},
		contexts: []workers.ContextInfo{{InstanceID: 1, Model: "m", WorldSize: 1, BytesIn: 1 << 20}}})
	w = r.window()
	if got := w.Server.Lookups.Last(); got != 4 {
		t.Errorf("lookups/s after a reset = %v, want 4 (counted from zero)", got)
	}
	if w.Server.TokensSavedTotal != 30*256+512 {
		t.Errorf("tokens total after a reset = %d, want %d (kept across it)", w.Server.TokensSavedTotal, 30*256+512)
	}
	if _, ok := w.Contexts[2]; ok || len(w.Contexts) != 1 {
		t.Errorf("context 2 still has rates after it went: %v", w.Contexts)
	}
	if got := w.Contexts[1].StoreBytes.Last(); got != 1<<20 {
		t.Errorf("context 1 store B/s after its counter reset = %v, want 1 MiB", got)
	}

	// No time passed: nothing is pushed.
	n := len(r.window().Server.Lookups.Fine)
	r.add(sample{now: clk.Now()})
	if m := len(r.window().Server.Lookups.Fine); m != n {
		t.Errorf("a sample at the same instant pushed a point (%d → %d)", n, m)
	}
}

// TestRatesHistoryOnlyWithTraffic: a registered context costs no history
// until it moves bytes or its model is looked up (a peer registering
// --max-instances contexts makes the sampler hold nothing per context), and
// its first bytes are counted in the second they came.
func TestRatesHistoryOnlyWithTraffic(t *testing.T) {
	r := newRates()
	clk := fakeclock.New()
	s := sample{now: clk.Now()}
	for id := range 1024 {
		s.contexts = append(s.contexts, workers.ContextInfo{InstanceID: int64(id), Model: fmt.Sprint("m", id), WorldSize: 1})
	}
	r.add(s)
	clk.Advance(time.Second)
	s.now = clk.Now()
	r.add(s)
	if n := len(r.window().Contexts); n != 0 {
		t.Fatalf("%d context histories for 1024 contexts without traffic, want 0", n)
	}
	// Context 3 stores 4000 bytes; model m5 is looked up.
	clk.Advance(time.Second)
	s.now = clk.Now()
	s.contexts[3].BytesIn = 4000
	s.groups = []lookup.ModelStats{{Model: "m5", WorldSize: 1, Lookups: 1, RequestedChunks: 2}}
	r.add(s)
	w := r.window()
	if len(w.Contexts) != 2 {
		t.Fatalf("histories for %v, want contexts 3 and 5", w.Contexts)
	}
	if got := w.Contexts[3].StoreBytes.Last(); got != 4000 {
		t.Errorf("context 3's first second: %v bytes/s, want 4000", got)
	}
	if _, ok := w.Contexts[5]; !ok {
		t.Errorf("context 5 (its model looked up) has no history")
	}
	if got := w.Server.StoreBytes.Last(); got != 4000 {
		t.Errorf("server store rate %v, want 4000", got)
	}
}

func hitRatio(c ContextRates) (float64, bool) {
	if a := c.AskedChunks.Last(); a > 0 {
		return c.HitChunks.Last() / a, true
	}
	return 0, false
}

// TestRatesOfARunningEngine: the engine's own sampler reads its plane and
// the wire server's latencies (per request kind, from the observer).
func TestRatesOfARunningEngine(t *testing.T) {
	clk := fakeclock.New()
	cfg, _ := testConfig(t)
	var next countingObserver
	e := New(cfg, Options{Now: clk.Now, Observer: &next})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	register(t, c, 7)
	e.sampleRates()
	storeObjects(t, e, 3, 4096)
	for range 5 {
		if err := noop(t, c); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(time.Second)
	e.sampleRates()
	r := e.Snapshot().Rates
	if !r.Taken.Equal(clk.Now()) {
		t.Errorf("rates taken at %v, want %v", r.Taken, clk.Now())
	}
	if used := r.Server.PoolUsed.Last(); used < 3*4096 {
		t.Errorf("pool used %v, want at least 3 objects of 4 KiB", used)
	}
	l, ok := r.Latency[protocol.Noop]
	if !ok {
		t.Fatalf("no latency for NOOP: %v", r.Latency)
	}
	if got := l.Rate.Last(); got != 5 {
		t.Errorf("NOOP rate %v, want 5/s", got)
	}
	if p50, p99 := l.P50.Last(), l.P99.Last(); p50 <= 0 || p99 < p50 || math.IsNaN(p99) {
		t.Errorf("NOOP p50 %v p99 %v", p50, p99)
	}
	if _, ok := r.Contexts[7]; ok {
		t.Errorf("context 7 has a history without any traffic: %v", r.Contexts)
	}
	if n := next.noops.Load(); n != 5 {
		t.Errorf("the engine's Observer saw %d NOOPs, want 5 (the rates observer passes every call on)", n)
	}
}

type countingObserver struct{ noops atomic.Int64 }

func (c *countingObserver) OnRequest(name, _ string, _ time.Duration) {
	if name == protocol.Noop {
		c.noops.Add(1)
	}
}

// steadySample is a sample of n contexts in two groups with counters that
// grow by i.
func steadySample(now time.Time, n, i int) sample {
	s := sample{now: now, lookup: lookup.Stats{Lookups: int64(i), RequestedChunks: int64(4 * i), HitChunks: int64(3 * i), HitTokens: int64(48 * i)},
		groups:    []lookup.ModelStats{{Model: "a", WorldSize: 1, Lookups: int64(i)}, {Model: "b", WorldSize: 1, HitChunks: int64(i)}},
		evictions: float64(i), used: float64(i)}
	for c := range n {
		s.contexts = append(s.contexts, workers.ContextInfo{InstanceID: int64(c), Model: []string{"a", "b"}[c%2], WorldSize: 1,
			BytesIn: int64(i * 1000), BytesOut: int64(i * 500)})
	}
	return s
}

// TestRatesSampleAllocatesNothing: once its contexts are known, a sample
// costs the histories no memory (the module counters it reads are copied by
// the modules themselves, once a second).
func TestRatesSampleAllocatesNothing(t *testing.T) {
	r := newRates()
	r.kinds([]string{"LOOKUP", "NOOP"})
	clk := fakeclock.New()
	samples := make([]sample, 1100)
	for i := range samples {
		clk.Advance(time.Second)
		samples[i] = steadySample(clk.Now(), 8, i)
	}
	r.add(samples[0])
	i := 1
	if n := testing.AllocsPerRun(1000, func() { r.add(samples[i]); i++ }); n != 0 {
		t.Fatalf("%v allocations per sample of 8 contexts, want 0", n)
	}
}

func BenchmarkRatesSample(b *testing.B) {
	r := newRates()
	r.kinds([]string{"LOOKUP", "NOOP", "PREPARE_STORE", "COMMIT_STORE"})
	clk := fakeclock.New()
	s := steadySample(clk.Now(), 8, 0)
	r.add(s)
	b.ReportAllocs()
	b.ResetTimer() // the histories are made by the first sample
	for i := range b.N {
		clk.Advance(time.Second)
		s.now = clk.Now()
		s.lookup.Lookups = int64(i)
		r.add(s)
	}
}
