package engine

import (
	"context"
	"strings"
	"testing"

	"kvdock/transfer/worker"
)

// TestLookupLockCapRefusalIsAnEvent: a LOOKUP whose read locks a lock cap
// refuses has no reply that could say so; the operator learns it from an
// event naming the cap.
func TestLookupLockCapRefusalIsAnEvent(t *testing.T) {
	e, cfg, c := startDialed(t)
	ctx := context.Background()
	w := newWorker(t, c, 7, "capped")
	n := w.ChunkTokens()
	toks := seqTokens(2 * n)
	chunk := make([]byte, w.Layout().Bytes)
	if res, err := w.Store(ctx, w.Key(toks, 2, "s"), [][]byte{chunk, chunk}); err != nil || !res.Committed {
		t.Fatalf("store: %+v %v", res, err)
	}
	// Then the cap drops below one chunk (a live key): the chunks stay
	// cached, but no lookup may lock them.
	next := cfg
	next.L1.MaxLockedShare = 0.001
	if _, err := e.Apply(ctx, next, nil); err != nil {
		t.Fatal(err)
	}
	sched := worker.Scheduler{C: c}
	if hits, err := sched.Hits(ctx, w.LookupKey(toks, "l"), 1); err != nil || hits != 0 {
		t.Fatalf("lookup under a cap below one chunk: %d hits, %v", hits, err)
	}
	for _, ev := range e.Snapshot().Events {
		if ev.Kind == EventRefused && strings.Contains(ev.Message, "lookup locks refused, the chunks count as refused") && strings.Contains(ev.Message, "cap") {
			return
		}
	}
	t.Fatalf("no event says a lock cap refused the lookup: %+v", e.Snapshot().Events)
}
