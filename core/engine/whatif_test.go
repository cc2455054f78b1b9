package engine

import (
	"context"
	"testing"

	"kvdock/transfer/worker"
)

// The what-if curve is fed by the real wire: a worker's stores and the
// scheduler's lookups reach the estimator, and the snapshot carries the
// points for the faces; a pool rebuild starts a curve for the new size.
func TestWhatIfFromWireTraffic(t *testing.T) {
	cfg, _ := testConfig(t)
	e := startEngine(t, cfg)
	if c := e.Snapshot().WhatIf; len(c.Points) != 0 || c.MemoryBytes == 0 {
		t.Fatalf("before traffic: %+v, want no points and the estimator's memory", c)
	}
	ctx := context.Background()
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	w := newWorker(t, c, 7, "whatif")
	n := w.ChunkTokens()
	toks := seqTokens(4 * n)
	chunk := make([]byte, w.Layout().Bytes)
	if res, err := w.Store(ctx, w.Key(toks[:2*n], 2, "s"), [][]byte{chunk, chunk}); err != nil || !res.Committed {
		t.Fatalf("store: %+v %v", res, err)
	}
	sched := worker.Scheduler{C: c}
	for i := range 3 {
		// 4 chunks asked, the 2 stored ones hit.
		if hits, err := sched.Hits(ctx, w.LookupKey(toks, "l"+string(rune('a'+i))), 1); err != nil || hits != 2 {
			t.Fatalf("lookup %d: %d hits, %v", i, hits, err)
		}
	}
	got := e.Snapshot().WhatIf
	if got.Sampled != 12 || len(got.Points) != 8 || len(got.Prefix) != 8 {
		t.Fatalf("after 3 lookups of 4 chunks: %d sampled, %d LRU and %d prefix points", got.Sampled, len(got.Points), len(got.Prefix))
	}
	if got.Measured != 0.5 {
		t.Errorf("measured %v, want the pool's 6 hits of 12", got.Measured)
	}
	if p := got.Points[3]; p.Factor != 1 || p.PoolBytes != cfg.L1.SizeBytes() || p.HitRatio <= 0 {
		t.Errorf("1× point %+v", p)
	}

	next := cfg
	next.L1.SizeGB *= 2
	if _, err := e.Apply(ctx, next, nil); err != nil {
		t.Fatal(err)
	}
	got = e.Snapshot().WhatIf
	if got.Sampled != 0 || len(got.Points) != 0 {
		t.Errorf("after a rebuild the curve still holds the old pool's traffic: %+v", got)
	}
}
