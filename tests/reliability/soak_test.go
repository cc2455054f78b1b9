package reliability

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// soakOps is the operations per worker: 200 in CI, KVDOCK_SOAK_OPS for the
// long run (docs/RELIABILITY.md).
func soakOps(t *testing.T) int {
	if v := os.Getenv("KVDOCK_SOAK_OPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("KVDOCK_SOAK_OPS=%q: want a positive integer", v)
		}
		return n
	}
	return 200
}

// settle runs the GC until the heap stops shrinking and returns the live
// heap and the goroutine count.
func settle() (heap uint64, goroutines int) {
	var ms runtime.MemStats
	for range 3 {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, runtime.NumGoroutine()
}

// TestSoak: 16 workers (8 SHM with their own mmap, 8 pickle) each run
// store / lookup / retrieve operations with checksums against one
// in-process engine: 0 mismatches, 0 errors, and after Stop the goroutine
// count and the heap are back at their baseline.
func TestSoak(t *testing.T) {
	ops := soakOps(t)
	const nw, per = 16, 2
	baseHeap, baseG := settle()
	cfg := engineConfig(t, 64)
	e := startEngine(t, cfg)
	start := time.Now()
	var mismatches, errs, misses, hits, stores atomic.Int64
	published := make([]atomic.Int64, nw) // sequences worker i has stored
	var wg sync.WaitGroup
	var workers []*gworker
	var mu sync.Mutex
	for i := range nw {
		c := dialPort(t, cfg.Server.Port, 10*time.Second)
		w := newWorker(t, c, int64(1000+i), "soak", i%2 == 1)
		mu.Lock()
		workers = append(workers, w)
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(uint64(i), 99))
			chunk, cb := w.chunk, w.chunkBytes
			seqOf := func(owner, n int) int { return owner*1_000_000 + n }
			for n := range ops {
				s := seqOf(i, n)
				data := [][]byte{chunkData(s, 0, cb), chunkData(s, 1, cb)}
				r, err := w.store(ctx, tokensFor(s, per, chunk), data, fmt.Sprintf("s%d", s))
				if err != nil || r != "true" {
					errs.Add(1)
					t.Errorf("worker %d store %d: %q %v", i, n, r, err)
					return
				}
				stores.Add(1)
				published[i].Store(int64(n + 1))
				// Read back one of anyone's published sequences.
				owner := rng.IntN(nw)
				m := int(published[owner].Load())
				if m == 0 {
					owner, m = i, n+1
				}
				rs := seqOf(owner, rng.IntN(m))
				got, err := w.retrieve(ctx, tokensFor(rs, per, chunk), per, fmt.Sprintf("r%d-%d", i, n))
				switch {
				case err != nil:
					errs.Add(1)
					t.Errorf("worker %d retrieve %d: %v", i, rs, err)
					return
				case got == nil:
					misses.Add(1)
				default:
					hits.Add(1)
					for j, g := range got {
						if sum(g) != sum(chunkData(rs, j, cb)) {
							mismatches.Add(1)
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	p := e.Snapshot().Pool
	t.Logf("soak: %d workers × %d ops in %v: %d stores, %d retrieves (%d hits, %d misses), %d mismatches, %d errors, %d evictions",
		nw, ops, elapsed.Round(time.Millisecond), stores.Load(), hits.Load()+misses.Load(), hits.Load(), misses.Load(),
		mismatches.Load(), errs.Load(), p.Evictions)
	if mismatches.Load() != 0 || errs.Load() != 0 {
		t.Fatalf("%d mismatches, %d errors", mismatches.Load(), errs.Load())
	}
	if p.Evictions == 0 && misses.Load() != 0 {
		t.Fatalf("%d misses without any eviction", misses.Load())
	}
	if p.UsedBytes > p.Size {
		t.Fatalf("pool used %d > size %d", p.UsedBytes, p.Size)
	}

	// Back to baseline: stop the engine, close the clients and mappings.
	if err := e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		_ = w.c.Close()
		w.unmap()
	}
	var heap uint64
	var g int
	deadline := time.Now().Add(10 * time.Second)
	for {
		heap, g = settle()
		if (g <= baseG+2 && heap <= baseHeap+16<<20) || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("baseline: %d goroutines, heap %d KiB; after: %d goroutines, heap %d KiB", baseG, baseHeap>>10, g, heap>>10)
	if g > baseG+2 {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines %d after stop, baseline %d\n%s", g, baseG, buf[:runtime.Stack(buf, true)])
	}
	if heap > baseHeap+16<<20 {
		t.Fatalf("heap %d KiB after stop, baseline %d KiB", heap>>10, baseHeap>>10)
	}
}
