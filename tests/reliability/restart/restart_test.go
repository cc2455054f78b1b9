package restart

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/core/testkit/poll"
	"kvdock/settings"
	"kvdock/tests/harness"
)

// TestRestartKeepsCacheAndContexts applies a port change (restart class)
// while four workers keep reading: afterwards the same instances, on the
// new port, get every chunk back byte-correct; during the switch a worker
// may see errors (its endpoint went away) but never wrong bytes.
func TestRestartKeepsCacheAndContexts(t *testing.T) {
	cfg := harness.EngineConfig(t, 16)
	e := harness.StartEngine(t, cfg)
	const nw, nseq = 4, 8
	ws := make([]*harness.GoWorker, nw)
	for i := range ws {
		ws[i] = harness.NewWorker(t, harness.DialPort(t, cfg.Server.Port, 2*time.Second), int64(100+i), "restart", i%2 == 1)
	}
	chunk, cb := ws[0].Chunk, ws[0].ChunkBytes
	for s := range nseq {
		data := [][]byte{harness.ChunkData(s, 0, cb), harness.ChunkData(s, 1, cb)}
		if r, err := ws[s%nw].Store(context.Background(), harness.Tokens(s, 2, chunk), data, fmt.Sprint("s", s)); err != nil || r != "true" {
			t.Fatalf("store %d: %q %v", s, r, err)
		}
	}
	var port atomic.Int64
	port.Store(int64(cfg.Server.Port))
	var mismatches, errs, hits, misses atomic.Int64
	stop := make(chan struct{})
	// Each worker reports its first hit: the switch happens under load.
	warm := make(chan struct{}, nw)
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			myPort := int64(cfg.Server.Port)
			reported := false
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				if p := port.Load(); p != myPort {
					// Reconnect, as a worker told of the new endpoint would.
					c, err := client.Dial(fmt.Sprintf("tcp://127.0.0.1:%d", p), w.C.Profile(), client.Options{Timeout: 2 * time.Second})
					if err == nil {
						_ = w.C.Close()
						w.C = c
						myPort = p
					}
				}
				s := (i + n) % nseq
				got, err := w.Retrieve(context.Background(), harness.Tokens(s, 2, chunk), 2, fmt.Sprintf("w%d-%d", i, n))
				switch {
				case err != nil:
					errs.Add(1)
				case got == nil:
					misses.Add(1)
				case harness.Sum(got[0]) != harness.Sum(harness.ChunkData(s, 0, cb)) || harness.Sum(got[1]) != harness.Sum(harness.ChunkData(s, 1, cb)):
					mismatches.Add(1)
				default:
					hits.Add(1)
					if !reported {
						reported = true
						warm <- struct{}{}
					}
				}
			}
		}()
	}
	for range nw {
		select {
		case <-warm:
		case <-time.After(10 * time.Second):
			close(stop)
			wg.Wait()
			t.Fatalf("workers not all reading before the restart (hits %d, misses %d, errors %d)", hits.Load(), misses.Load(), errs.Load())
		}
	}
	next := cfg
	next.Server.Port = harness.FreePort(t)
	res, err := e.Apply(context.Background(), next, nil)
	if err != nil || res.Class != settings.Restart {
		t.Fatalf("apply restart: %+v %v", res, err)
	}
	port.Store(int64(next.Server.Port))
	before := hits.Load()
	// Calls in flight at the switch time out (2 s, and END_SESSION another
	// 2 s); then the workers move to the new port and hit again.
	poll.Until(t, 15*time.Second, "hits after the restart", func() bool { return hits.Load() > before+4*nw })
	close(stop)
	wg.Wait()
	for _, w := range ws {
		// A worker stopped mid-call may not have moved yet: move it now.
		_ = w.C.Close()
		w.C = harness.DialPort(t, next.Server.Port, 2*time.Second)
	}
	if mismatches.Load() != 0 {
		t.Fatalf("%d wrong chunks across a restart", mismatches.Load())
	}
	if hits.Load() == before {
		t.Fatalf("no hits after the restart (hits %d, misses %d, errors %d)", hits.Load(), misses.Load(), errs.Load())
	}
	s := e.Snapshot()
	if len(s.Contexts) != nw || s.Pool.Objects != 2*nseq {
		t.Fatalf("after restart: %d contexts, %d objects", len(s.Contexts), s.Pool.Objects)
	}
	// Every chunk, through every worker (SHM and pickle), on the new port.
	for i, w := range ws {
		for s := range nseq {
			got, err := w.Retrieve(context.Background(), harness.Tokens(s, 2, chunk), 2, fmt.Sprintf("final-%d-%d", i, s))
			if err != nil || len(got) != 2 || harness.Sum(got[0]) != harness.Sum(harness.ChunkData(s, 0, cb)) || harness.Sum(got[1]) != harness.Sum(harness.ChunkData(s, 1, cb)) {
				t.Fatalf("worker %d (%s) seq %d after restart: %d chunks, %v", i, w.Mode(), s, len(got), err)
			}
		}
	}
	t.Logf("restart under load: %d hits, %d errors during the switch, 0 mismatches", hits.Load(), errs.Load())
}

// TestRebuildDropsCacheAndOldContexts applies an L1 size change (rebuild
// class) with the same segment name: the cache and contexts go; the old
// instance gets no slots (no answer) for PREPARE_STORE, so a worker still
// mapping the old segment is never handed offsets into the new one; a
// re-registered worker maps the new segment and works.
func TestRebuildDropsCacheAndOldContexts(t *testing.T) {
	cfg := harness.EngineConfig(t, 16)
	e := harness.StartEngine(t, cfg)
	c := harness.DialPort(t, cfg.Server.Port, 500*time.Millisecond)
	old := harness.NewWorker(t, c, 7, "rebuild", false)
	chunk, cb := old.Chunk, old.ChunkBytes
	toks := harness.Tokens(42, 2, chunk)
	data := [][]byte{harness.ChunkData(42, 0, cb), harness.ChunkData(42, 1, cb)}
	if r, err := old.Store(context.Background(), toks, data, "s"); err != nil || r != "true" {
		t.Fatalf("store: %q %v", r, err)
	}
	next := cfg
	next.L1.SizeGB = 8.0 / 1024
	res, err := e.Apply(context.Background(), next, nil)
	if err != nil || res.Class != settings.Rebuild {
		t.Fatalf("apply rebuild: %+v %v", res, err)
	}
	s := e.Snapshot()
	if len(s.Contexts) != 0 || s.Pool.Objects != 0 || s.Shm.PoolSize != next.L1.SizeBytes() {
		t.Fatalf("after rebuild: %d contexts, %d objects, pool %d", len(s.Contexts), s.Pool.Objects, s.Shm.PoolSize)
	}
	// The old instance, still mapping the old (unlinked) segment.
	k := old.Key(harness.Tokens(43, 1, chunk), 1, "old")
	r, err := c.Call(context.Background(), protocol.PrepareStore, k, old.ID)
	if err == nil && r.Present {
		var ps harness.PrepStore
		_ = r.Decode(&ps)
		if len(ps.Context.Slots) > 0 {
			t.Fatalf("the dropped instance was handed %d slots in the new segment", len(ps.Context.Slots))
		}
	}
	if got, err := old.Retrieve(context.Background(), toks, 2, "old-r"); err == nil && got != nil {
		t.Fatalf("a dropped instance read %d chunks after the rebuild", len(got))
	}
	if n, err := harness.Lookup(context.Background(), c, "rebuild", toks, "l"); err != nil || n != 0 {
		t.Fatalf("cache survived a rebuild: %d hits, %v", n, err)
	}
	// Re-registering maps the new segment; everything works again.
	fresh := harness.NewWorker(t, c, 7, "rebuild", false)
	if fresh.PoolSize != next.L1.SizeBytes() || fresh.Shm == nil {
		t.Fatalf("re-register: pool %d mode %s", fresh.PoolSize, fresh.Mode())
	}
	if r, err := fresh.Store(context.Background(), toks, data, "s2"); err != nil || r != "true" {
		t.Fatalf("store after rebuild: %q %v", r, err)
	}
	got, err := fresh.Retrieve(context.Background(), toks, 2, "r2")
	if err != nil || len(got) != 2 || harness.Sum(got[0]) != harness.Sum(data[0]) || harness.Sum(got[1]) != harness.Sum(data[1]) {
		t.Fatalf("retrieve after rebuild: %d %v", len(got), err)
	}
}
