package l1

import (
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"kvdock/core/keys"
	"kvdock/core/whatif"
)

// tableOverhead fills a pool with n objects and returns the Go heap the
// object table holds per object (records, index, LRU links, interned
// names; the pool's bytes are mapped memory, not heap).
func tableOverhead(t *testing.T, n int) float64 {
	t.Helper()
	p, err := Open(Options{Size: int64(n) * 4096, Align: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ks := make([]keys.ObjectKey, 256)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < n; i += len(ks) {
		ks = ks[:min(len(ks), n-i)]
		for j := range ks {
			var h keys.Hash
			binary.LittleEndian.PutUint64(h[:], uint64(i+j)*0x9e3779b97f4a7c15)
			ks[j] = keys.ObjectKey{Chunk: h, Model: "meta-llama/Llama-3.1-8B-Instruct", KVRank: keys.KVRank(1, 0)}
		}
		res, err := p.ReserveWrite(InstanceOwner(1), ks, 4096)
		if err != nil {
			t.Fatal(err)
		}
		p.FinishWrite(res)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if got := p.Stats().Objects; got != n {
		t.Fatalf("%d objects in the pool, want %d", got, n)
	}
	runtime.KeepAlive(p)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
}

// TestWhatIfMemoryBudget checks the estimator's bound, as the engine runs
// it (whatif.Served): at most whatif.FloorBytes (the sample floor's), or
// above it whatif.BudgetShare (1 %) of the object table's own memory for a
// pool full of objects, and never more than whatif.PoolShare (0.1 %) of
// the pool's bytes where the floor fits in that share (pools of 1 GiB and
// more). The table's per-object overhead is measured here, at the object
// counts of realistic pools, and must be at least the
// whatif.TableBytesPerObject the estimator sizes itself by.
func TestWhatIfMemoryBudget(t *testing.T) {
	for _, n := range []int{16384, 65536, 262144} {
		per := tableOverhead(t, n)
		if per < whatif.TableBytesPerObject {
			t.Errorf("%d objects: the table holds %.0f bytes per object, below the %d the estimator assumes", n, per, whatif.TableBytesPerObject)
		}
		// The estimator of such a pool, after traffic that fills its sample
		// set to the limit.
		const size = 4096
		pool := int64(n) * size
		e := whatif.New(whatif.Served(pool))
		fillEstimator(e, 4*n, size)
		c := e.Curve()
		table := per * float64(n)
		t.Logf("%d objects (%d MiB): table %.0f B/object (%.1f MiB), estimator %d B (%.2f %% of the table, %.3f %% of the pool), %d/%d samples, rate %.4f",
			n, pool>>20, per, table/(1<<20), c.MemoryBytes, 100*float64(c.MemoryBytes)/table, 100*float64(c.MemoryBytes)/float64(pool), c.Tracked, c.Limit, c.SampleRate)
		if c.Limit < whatif.DefaultMinSamples {
			t.Errorf("%d objects: %d samples, below the floor of %d", n, c.Limit, whatif.DefaultMinSamples)
		}
		if bound := max(whatif.BudgetShare*table, whatif.FloorBytes); float64(c.MemoryBytes) > bound {
			t.Errorf("%d objects: estimator holds %d bytes, more than the floor's %d and %.0f %% of the table's %.0f", n, c.MemoryBytes, whatif.FloorBytes, 100*whatif.BudgetShare, table)
		}
		if share := whatif.PoolShare * float64(pool); share >= whatif.FloorBytes && float64(c.MemoryBytes) > share {
			t.Errorf("%d objects: estimator holds %d bytes, more than %.1f %% of the pool's %d", n, c.MemoryBytes, 100*whatif.PoolShare, pool)
		}
	}
	// A pool of 2 GiB of small objects (256 bytes): 1 % of its table would
	// be 0.5 % of the pool; the pool's share caps it.
	const pool, small = 2 << 30, 256
	e := whatif.New(whatif.Served(pool))
	fillEstimator(e, 1<<17, small)
	c := e.Curve()
	t.Logf("%d MiB of %d-byte objects: estimator %d B (%.3f %% of the pool), %d/%d samples", pool>>20, small, c.MemoryBytes, 100*float64(c.MemoryBytes)/pool, c.Tracked, c.Limit)
	if c.Limit <= whatif.DefaultMinSamples {
		t.Errorf("%d samples: the budget of a pool of small objects did not rise above the floor", c.Limit)
	}
	if float64(c.MemoryBytes) > whatif.PoolShare*pool {
		t.Errorf("estimator holds %d bytes, more than %.1f %% of the pool's %d", c.MemoryBytes, 100*whatif.PoolShare, pool)
	}
}

// fillEstimator stores and looks up n distinct keys of size bytes, twice,
// so that every sample slot the budget allows is used.
func fillEstimator(e *whatif.Estimator, n int, size int64) {
	ks := make([]keys.ObjectKey, 1)
	var pre whatif.Prefix
	for round := range 2 {
		for i := range n {
			var h keys.Hash
			binary.LittleEndian.PutUint64(h[:], uint64(i)*0x9e3779b97f4a7c15+1)
			ks[0] = keys.ObjectKey{Chunk: h, Model: "m", KVRank: 1}
			e.Probe(&pre, ks, 0) // before the store: prompt sampling takes a key from its lookup
			if round == 0 {
				e.Stored(&ks[0], size)
			}
		}
	}
}

// benchLookupsPerSecond and benchPromptChunks are the bench's lookup rate
// (docs/bench-baseline.json: lookup_status_pairs_per_s, the faster mode,
// and lookup_prompt_chunks): the load the CPU bound is judged at.
const (
	benchLookupsPerSecond = 1725.0742
	benchPromptChunks     = 16
)

// BenchmarkWhatIfCost measures the estimator's cost per looked-up key and
// per stored object on a pool-sized key population with a Zipf-like
// popularity, against the pool's own cost for the same lookups
// (ReserveReadPrefix and FinishRead of the same 16-key prompts) measured in
// the same run. %core@bench is the share of one core the estimator
// takes at the bench's lookup rate; the bound is 2 %.
func BenchmarkWhatIfCost(b *testing.B) {
	// steady: 4096 prompts over 4× a pool of 65536 objects (the sample
	// rate falls to about 1 %); all-sampled: 16 prompts, few enough that
	// every key is sampled and takes the estimator's mutex (the worst case).
	b.Run("steady", func(b *testing.B) { benchWhatIf(b, 4096) })
	b.Run("all-sampled", func(b *testing.B) { benchWhatIf(b, 16) })
}

func benchWhatIf(b *testing.B, nPrompts int) {
	const objects = 65536
	const size = 4096
	p, err := Open(Options{Size: objects * size, Align: size})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	e := whatif.New(whatif.Served(objects * size))
	key := func(i uint64) keys.ObjectKey {
		var h keys.Hash
		binary.LittleEndian.PutUint64(h[:], i*0x9e3779b97f4a7c15+7)
		return keys.ObjectKey{Chunk: h, Model: "meta-llama/Llama-3.1-8B-Instruct", KVRank: keys.KVRank(1, 0)}
	}
	// Prompts of 16 chunks over 4× the pool's objects, popular ones often.
	prompts := make([][]keys.ObjectKey, nPrompts)
	for i := range prompts {
		base := uint64(i*i) % (4 * objects / benchPromptChunks)
		ks := make([]keys.ObjectKey, benchPromptChunks)
		for j := range ks {
			ks[j] = key(base*benchPromptChunks + uint64(j))
		}
		prompts[i] = ks
	}
	for _, ks := range prompts[:min(len(prompts), objects/benchPromptChunks/2)] { // up to half full
		res, err := p.ReserveWrite(InstanceOwner(1), ks, size)
		if err != nil {
			b.Fatal(err)
		}
		p.FinishWrite(res)
		for k := range ks {
			e.Stored(&ks[k], size)
		}
	}
	var estNs, poolNs, storeNs time.Duration
	stores := 0
	b.ResetTimer()
	for i := range b.N {
		ks := prompts[i%len(prompts)]
		t0 := time.Now()
		n := p.ReserveReadPrefix(ks, 1)
		p.FinishRead(ks[:n], 1)
		t1 := time.Now()
		var pre whatif.Prefix
		e.Probe(&pre, ks, n)
		if i%8 == 0 { // a store now and then, as after a miss
			t2 := time.Now()
			e.Stored(&ks[len(ks)-1], size)
			storeNs += time.Since(t2)
			stores++
		}
		estNs += time.Since(t1)
		poolNs += t1.Sub(t0)
	}
	b.StopTimer()
	perKey := float64(estNs.Nanoseconds()) / float64(b.N*benchPromptChunks)
	b.ReportMetric(perKey, "ns/key")
	b.ReportMetric(float64(storeNs.Nanoseconds())/float64(stores), "ns/store")
	b.ReportMetric(float64(estNs)/float64(poolNs), "vs-pool-lookup")
	b.ReportMetric(100*perKey*benchLookupsPerSecond*benchPromptChunks/1e9, "%core@bench")
}
