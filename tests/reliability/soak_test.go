package reliability

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kvdock/tests/harness"
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
// in-process engine whose pool holds a sixth of what they store: 0
// mismatches, 0 errors, a hit ratio no lower than the pool size allows, and
// after Stop the goroutine count and the heap are back at their baseline.
func TestSoak(t *testing.T) {
	ops := soakOps(t)
	const nw, per = 16, 2
	baseHeap, baseG := settle()
	// The pool holds a sixth of what the run stores, so every run, CI's
	// included, evicts and the hit-ratio floor below is exercised.
	cb := 2 * harness.WorkerLayers * 16 * harness.WorkerHidden * 4 // chunk bytes at engineConfig's chunk size
	sizeMiB := max(4, nw*ops*per*cb/6>>20)
	cfg := harness.EngineConfig(t, sizeMiB)
	if cfg.Server.ChunkSize != 16 {
		t.Fatalf("chunk size %d: update the chunk bytes above", cfg.Server.ChunkSize)
	}
	e := harness.StartEngine(t, cfg)
	live := watchLive(e)
	start := time.Now()
	var mismatches, errs, misses, hits, stores atomic.Int64
	published := make([]atomic.Int64, nw) // sequences worker i has stored
	var wg sync.WaitGroup
	var workers []*harness.GoWorker
	var mu sync.Mutex
	for i := range nw {
		c := harness.DialPort(t, cfg.Server.Port, 10*time.Second)
		w := harness.NewWorker(t, c, int64(1000+i), "soak", i%2 == 1)
		mu.Lock()
		workers = append(workers, w)
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(uint64(i), 99))
			chunk, cb := w.Chunk, w.ChunkBytes
			seqOf := func(owner, n int) int { return owner*1_000_000 + n }
			for n := range ops {
				s := seqOf(i, n)
				data := [][]byte{harness.ChunkData(s, 0, cb), harness.ChunkData(s, 1, cb)}
				r, err := w.Store(ctx, harness.Tokens(s, per, chunk), data, fmt.Sprintf("s%d", s))
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
				got, err := w.Retrieve(ctx, harness.Tokens(rs, per, chunk), per, fmt.Sprintf("r%d-%d", i, n))
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
						if harness.Sum(g) != harness.Sum(harness.ChunkData(rs, j, cb)) {
							mismatches.Add(1)
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	over, maxLive := live()
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
	ratio := float64(hits.Load()) / float64(hits.Load()+misses.Load())
	floor := minHitRatio(p.Size/int64(cb), stores.Load()*per)
	t.Logf("pool %d MiB: hit ratio %.3f (floor %.3f); max live %d of %d bytes", p.Size>>20, ratio, floor, maxLive, p.Size)
	if ratio < floor {
		t.Fatalf("hit ratio %.3f under the floor %.3f for a %d-chunk pool and %d chunks stored", ratio, floor, p.Size/int64(cb), stores.Load()*per)
	}
	if over > 0 || p.LiveBytes > p.Size || p.LiveBytes != p.UsedBytes {
		t.Fatalf("live objects over the pool's size in %d samples (max %d); after the run live %d, allocated %d, size %d",
			over, maxLive, p.LiveBytes, p.UsedBytes, p.Size)
	}

	// Back to baseline: stop the engine, close the clients and mappings.
	if err := e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		_ = w.C.Close()
		w.Close()
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

// minHitRatio is the lowest hit ratio the soak accepts from a pool of
// capacity chunks after stored chunks, when every read picks uniformly among
// the sequences stored so far. A pool that keeps R of the T chunks stored
// hits a uniform read with probability min(1, R/T); with T growing evenly to
// S that averages (R/S)(1+ln(S/R)) once S > R. R is taken as 0.6 of the
// capacity (the eviction loop brings the pool down to watermark−ratio, 0.6
// by default), and the floor is two thirds of that estimate so scheduling
// never makes it flake, while a cache that stops serving after its first
// eviction, or keeps a fraction of what it could, fails.
func minHitRatio(capacity, stored int64) float64 {
	r, s := 0.6*float64(capacity), float64(stored)
	if s <= r {
		return 2.0 / 3
	}
	return r / s * (1 + math.Log(s/r)) * 2 / 3
}
