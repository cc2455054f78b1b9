package whatif

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"kvdock/core/keys"
)

// naiveStack is the obvious LRU stack, most recent first, to check the
// Fenwick-tree one against.
type naiveStack struct {
	ids   []uint64
	sizes []int64
}

func (n *naiveStack) use(id uint64, size int64) (above int64, found bool) {
	i := slices.Index(n.ids, id)
	if i >= 0 {
		for _, s := range n.sizes[:i] {
			above += s
		}
		n.ids = slices.Delete(n.ids, i, i+1)
		n.sizes = slices.Delete(n.sizes, i, i+1)
		found = true
	}
	n.ids = slices.Insert(n.ids, 0, id)
	n.sizes = slices.Insert(n.sizes, 0, size)
	return above, found
}

func (n *naiveStack) drop(id uint64) {
	if i := slices.Index(n.ids, id); i >= 0 {
		n.ids = slices.Delete(n.ids, i, i+1)
		n.sizes = slices.Delete(n.sizes, i, i+1)
	}
}

// setSize changes id's size in place.
func (n *naiveStack) setSize(id uint64, size int64) {
	n.sizes[slices.Index(n.ids, id)] = size
}

// aboveOf is the bytes above id.
func (n *naiveStack) aboveOf(id uint64) (above int64) {
	for _, s := range n.sizes[:slices.Index(n.ids, id)] {
		above += s
	}
	return above
}

// TestStackMatchesNaiveLRU checks the stack against a naive one.
func TestStackMatchesNaiveLRU(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var s stack
	s.reset(64)
	var n [orders]naiveStack
	// Spatial hashes share their low bits often, so the index probes and
	// its backward-shift deletions are exercised; identities tell apart
	// keys that share a hash.
	key := func(i int) (uint64, uint32) { return uint64(i%40)<<32 | 1, uint32(i / 40) }
	for step := range 20000 {
		i := r.IntN(80)
		sp, id := key(i)
		size := int64(1 + r.IntN(1000))
		j := s.find(sp, id)
		switch {
		case r.IntN(10) == 0 && j >= 0:
			s.remove(j)
			for o := range n {
				n[o].drop(uint64(i))
			}
			continue
		case j >= 0:
			want, found := n[lruOrder].use(uint64(i), size)
			if !found {
				t.Fatalf("step %d: %d in the stack, not in the naive one", step, i)
			}
			if got := s.above(lruOrder, j); got != want {
				t.Fatalf("step %d: bytes above %d = %d, want %d", step, i, got, want)
			}
			s.touch(lruOrder, j)
			s.setSize(j, size)
		case s.live < s.slots():
			for o := range n {
				if _, found := n[o].use(uint64(i), size); found {
					t.Fatalf("step %d: %d lost from the stack", step, i)
				}
			}
			if s.insert(sp, sp, id, size) < 0 {
				t.Fatalf("step %d: insert refused with %d of %d live", step, s.live, s.slots())
			}
		default:
			o := r.IntN(orders)
			b := s.bottom(o)
			last := n[o].ids[len(n[o].ids)-1]
			if bsp, bid := key(int(last)); s.spat[b] != bsp || s.id[b] != bid {
				t.Fatalf("step %d: order %d: bottom is not the least recently used", step, o)
			}
			s.remove(b)
			for o := range n {
				n[o].drop(last)
			}
		}
		if s.live != len(n[lruOrder].ids) {
			t.Fatalf("step %d: %d live, naive %d", step, s.live, len(n[lruOrder].ids))
		}
		var total int64
		for _, z := range n[lruOrder].sizes {
			total += z
		}
		if s.total != total {
			t.Fatalf("step %d: total %d, want %d", step, s.total, total)
		}
		for o := range n {
			for _, c := range n[o].ids {
				csp, cid := key(int(c))
				if got, want := s.above(o, s.find(csp, cid)), n[o].aboveOf(c); got != want {
					t.Fatalf("step %d: order %d: bytes above %d = %d, want %d", step, o, c, got, want)
				}
			}
		}
	}
}

// playLoop probes and stores (10 bytes each) testKey(0) to testKey(n-1) of
// model "m" in order, 20 times over; after, when not nil, runs after each
// store with the key's index.
func playLoop(e *Estimator, n int, after func(i int)) {
	ks := make([]keys.ObjectKey, n)
	for i := range ks {
		ks[i] = testKey(uint64(i), "m")
	}
	for range 20 {
		for i := range ks {
			var p Prefix
			e.Probe(&p, ks[i:i+1], 0)
			e.Stored(&ks[i], 10)
			if after != nil {
				after(i)
			}
		}
	}
}

func testKey(i uint64, model string) keys.ObjectKey {
	var h keys.Hash
	binary.LittleEndian.PutUint64(h[:], i*0x9e3779b97f4a7c15+3)
	binary.LittleEndian.PutUint64(h[8:], i)
	return keys.ObjectKey{Chunk: h, Model: model, KVRank: keys.KVRank(1, 0)}
}

func point(t *testing.T, c Curve, f float64) float64 {
	t.Helper()
	for _, p := range c.Points {
		if p.Factor == f {
			return p.HitRatio
		}
	}
	t.Fatalf("no point at %v in %+v", f, c.Points)
	return 0
}

// With every key sampled (few keys), the estimator is exact LRU: a loop
// over 5 objects of 10 bytes hits in a pool of 50 bytes or more, and never
// in one of 25 (LRU's worst case).
func TestLoopExactAtFullSampling(t *testing.T) {
	e := New(Options{PoolBytes: 100})
	playLoop(e, 5, nil)
	c := e.Curve()
	if c.SampleRate != 1 || c.Tracked != 5 {
		t.Fatalf("rate %v, %d tracked: want every key", c.SampleRate, c.Tracked)
	}
	if got := point(t, c, 0.25); got != 0 {
		t.Errorf("25-byte pool: %v, want 0", got)
	}
	for _, f := range []float64{0.5, 1, 4} {
		// The first pass is all cold misses: 19 of 20 passes hit (less one
		// key, missed while no object size was known yet).
		if got := point(t, c, f); math.Abs(got-0.95) > 0.015 {
			t.Errorf("%v× pool: %v, want 0.95", f, got)
		}
	}
}

// A prefix lookup counts a chunk only when every chunk before it hits: a
// key never stored makes the rest of its lookup miss at every size.
func TestPrefixStopsAtNeverStored(t *testing.T) {
	e := New(Options{PoolBytes: 1 << 20})
	a, b := testKey(1, "m"), testKey(2, "m")
	e.Stored(&b, 100) // b is cached, a never was
	for range 10 {
		var p Prefix
		e.Probe(&p, []keys.ObjectKey{a, b}, 0)
	}
	for _, pt := range e.Curve().Points {
		if pt.HitRatio != 0 {
			t.Errorf("%v× pool: hit ratio %v, want 0: b follows a key never stored", pt.Factor, pt.HitRatio)
		}
	}
	// The other order: b hits from its second lookup on (the pools of the
	// model fill with what lookups missed, so the first one misses it).
	e = New(Options{PoolBytes: 1 << 20})
	e.Stored(&b, 100)
	for range 10 {
		var p Prefix
		e.Probe(&p, []keys.ObjectKey{b, a}, 1)
	}
	if got := point(t, e.Curve(), 1); math.Abs(got-0.45) > 0.01 {
		t.Errorf("b then a: %v, want 0.45 (9 hits of b in 20 keys)", got)
	}
}

// Keys of different models that share a chunk digest are different objects.
func TestModelsAreDistinctObjects(t *testing.T) {
	e := New(Options{PoolBytes: 1 << 20})
	a, b := testKey(1, "model-a"), testKey(1, "model-b")
	e.Stored(&a, 100)
	for range 10 {
		var p Prefix
		e.Probe(&p, []keys.ObjectKey{b}, 0)
	}
	if got := point(t, e.Curve(), 4); got != 0 {
		t.Errorf("model-b found model-a's object: hit ratio %v", got)
	}
}

// The watermark loop: a pool that drops a fifth of what it holds at 80 %
// holds less than its size, so a loop that fills it exactly misses.
func TestTickPlaysTheWatermark(t *testing.T) {
	run := func(tick bool) float64 {
		e := New(Options{PoolBytes: 1000})
		playLoop(e, 100, func(i int) {
			if tick && i%10 == 0 {
				e.Tick(0.8, 0.2)
			}
		})
		return point(t, e.Curve(), 1)
	}
	if got := run(false); got < 0.9 {
		t.Errorf("without ticks a pool of exactly the loop's bytes hits %v, want ~0.95", got)
	}
	if got := run(true); got > 0.5 {
		t.Errorf("with the watermark loop the same pool hits %v, want well below (it never holds the loop)", got)
	}
}

// Hostile traffic: a flood of distinct keys, of any size, never grows the
// estimator past its limit, and the sample rate falls to keep it there.
func TestFloodStaysWithinLimit(t *testing.T) {
	e := New(Options{PoolBytes: 1 << 30, MinSamples: 64, MaxSamples: 64})
	mem := e.Curve().MemoryBytes
	ks := make([]keys.ObjectKey, 64)
	for i := range uint64(200_000) {
		k := &ks[i%64]
		*k = testKey(i, "m")
		e.Stored(k, int64(1+i%(1<<20)))
		if i%64 == 63 {
			var p Prefix
			e.Probe(&p, ks, 7)
		}
	}
	e.Stored(&ks[0], 0)             // ignored
	e.Stored(&ks[0], -5)            // ignored
	e.Stored(&ks[1], math.MaxInt64) // a huge object: deeper than any pool at once
	c := e.Curve()
	if c.Tracked > 64 || c.Limit != 64 || c.MemoryBytes != mem {
		t.Errorf("after the flood: %d tracked, limit %d, %d bytes (was %d)", c.Tracked, c.Limit, c.MemoryBytes, mem)
	}
	if c.SampleRate >= 0.01 {
		t.Errorf("sample rate %v: it should have fallen", c.SampleRate)
	}
	for _, p := range c.Points {
		if p.HitRatio < 0 || p.HitRatio > 1 || math.IsNaN(p.HitRatio) {
			t.Errorf("point %+v out of range", p)
		}
	}
}

// The weights halve every window: the curve follows recent traffic.
func TestWindowForgets(t *testing.T) {
	e := New(Options{PoolBytes: 1 << 20, Window: 1000})
	hot := testKey(1, "m")
	e.Stored(&hot, 100)
	for range 5000 { // hits
		var p Prefix
		e.Probe(&p, []keys.ObjectKey{hot}, 1)
	}
	for i := range uint64(5000) { // then only cold misses
		k := testKey(1000+i, "m")
		var p Prefix
		e.Probe(&p, []keys.ObjectKey{k}, 0)
	}
	c := e.Curve()
	if c.Weight > 1000 {
		t.Errorf("weight %v past the window", c.Weight)
	}
	if got := point(t, c, 1); got > 0.1 {
		t.Errorf("hit ratio %v: the old hits should have faded", got)
	}
}

func TestNilEstimator(t *testing.T) {
	var e *Estimator
	k := testKey(1, "m")
	var p Prefix
	e.Probe(&p, []keys.ObjectKey{k}, 1)
	e.Stored(&k, 10)
	e.Tick(0.8, 0.2)
	e.Cleared()
	if c := e.Curve(); len(c.Points) != 0 {
		t.Errorf("nil estimator curve %+v", c)
	}
}

func TestConcurrentUse(t *testing.T) {
	e := New(Options{PoolBytes: 1 << 24, MinSamples: 64, MaxSamples: 128})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			ks := make([]keys.ObjectKey, 16)
			for i := range uint64(3000) {
				for j := range ks {
					ks[j] = testKey((i*7+uint64(j))%5000+uint64(g), "m")
				}
				var p Prefix
				e.Probe(&p, ks, int(i%16))
				e.Stored(&ks[15], 4096)
				switch i % 500 {
				case 0:
					e.Tick(0.8, 0.2)
				case 250:
					_ = e.Curve()
				case 499:
					e.Cleared()
				}
			}
		})
	}
	wg.Wait()
	if c := e.Curve(); c.Tracked > 128 || len(c.Points) != len(Factors()) {
		t.Errorf("after concurrent use: %+v", c)
	}
}

// After a flood of distinct keys drove the sample rate down, ordinary
// traffic (a hot set and a stream of new prompts) brings it back up once
// the flood is deeper than the curve: it does not rest on a handful of
// samples for good.
func TestRateRecoversAfterFlood(t *testing.T) {
	e := New(Options{PoolBytes: 1 << 20, MinSamples: 64, MaxSamples: 64})
	for i := range uint64(200_000) {
		k := testKey(i, "flood")
		e.Stored(&k, 100)
	}
	low := e.Curve().SampleRate
	hot := make([]keys.ObjectKey, 20)
	for i := range hot {
		hot[i] = testKey(uint64(1_000_000+i), "m")
	}
	for r := range uint64(300) {
		for i := range hot {
			var p Prefix
			e.Probe(&p, hot[i:i+1], 0)
			e.Stored(&hot[i], 1000)
		}
		for i := range uint64(50) {
			k := testKey(2_000_000+r*50+i, "m")
			var p Prefix
			e.Probe(&p, []keys.ObjectKey{k}, 0)
			e.Stored(&k, 1000)
		}
	}
	c := e.Curve()
	t.Logf("rate %v during the flood, %v after; %d/%d tracked", low, c.SampleRate, c.Tracked, c.Limit)
	if c.SampleRate < 4*low {
		t.Errorf("sample rate %v after the flood, %v during it: want it well up again", c.SampleRate, low)
	}
}

// The sample's error is corrected on the pool's own hits over every key:
// when the sampled keys all missed and as many unsampled ones hit, the
// corrected sample still gives the pool's true ratio.
func TestCorrectionAnchorsOnPoolHits(t *testing.T) {
	e := New(Options{PoolBytes: 1 << 20, MinSamples: 32, MaxSamples: 32}) // 20 sampled keys: no shedding, no raising
	half := uint64(math.MaxUint64 / 2)
	e.threshold.Store(half)
	e.rate = 0.5
	var sampled, other []keys.ObjectKey
	for i := uint64(0); len(sampled) < 20 || len(other) < 20; i++ {
		k := testKey(i, "m")
		switch sp := spatial(&k); {
		case sp < half && len(sampled) < 20:
			sampled = append(sampled, k)
		case sp >= half && len(other) < 20:
			other = append(other, k)
		}
	}
	batch := append(slices.Clone(other), sampled...) // 20 pool hits, then 20 misses
	for range 50 {
		var p Prefix
		e.Probe(&p, batch, 20)
	}
	c := e.Curve()
	if math.Abs(c.Measured-0.5) > 0.01 {
		t.Errorf("measured %v, want the pool's 0.5 (its sampled keys all missed)", c.Measured)
	}
}

// Nothing is allocated per access once the sample is sized (sampled keys
// included: every key is sampled here).
func TestNoAllocationPerAccess(t *testing.T) {
	e := New(Options{PoolBytes: 1 << 30})
	ks := make([]keys.ObjectKey, 16)
	for i := range ks {
		ks[i] = testKey(uint64(i), "m")
		e.Stored(&ks[i], 4096)
	}
	i := 0
	allocs := testing.AllocsPerRun(2000, func() {
		var p Prefix
		e.Probe(&p, ks, i%16)
		e.Stored(&ks[i%16], 4096)
		i++
	})
	if allocs != 0 {
		t.Errorf("%v allocations per lookup of 16 keys and a store", allocs)
	}
}

// Prompt sampling keeps prompt families whole: after traffic of far more
// prompts than the sample holds (so the threshold dropped many times), each
// prompt's chunks are in the sample all together or not at all, prompts
// that extend a sampled one included; a chunk stored before any lookup
// asked for it is left out.
func TestPromptSamplingKeepsPromptsWhole(t *testing.T) {
	const prompts, depth = 400, 6
	e := New(Options{PoolBytes: 1 << 30, MinSamples: 64, MaxSamples: 64, SamplePrompts: true})
	// Prompt q's chunk c; prompt q+prompts extends prompt q by depth chunks.
	chunk := func(q, c int) keys.ObjectKey { return testKey(uint64(q)*1000+uint64(c)+1, "m") }
	prompt := func(q int, long bool) []keys.ObjectKey {
		n := depth
		if long {
			n = 2 * depth
		}
		ks := make([]keys.ObjectKey, n)
		for c := range ks {
			ks[c] = chunk(q, c)
		}
		return ks
	}
	stray := testKey(1<<40, "m")
	e.Stored(&stray, 100)
	for round := range 3 {
		for q := range prompts {
			ks := prompt(q, round == 2)
			var p Prefix
			e.Probe(&p, ks[:depth/2], 0)
			e.Probe(&p, ks[depth/2:], 0)
			for i := range ks {
				e.Stored(&ks[i], 100)
			}
		}
	}
	c := e.Curve()
	if c.SampleRate >= 0.5 {
		t.Fatalf("sample rate %v: the threshold never dropped", c.SampleRate)
	}
	whole := 0
	for q := range prompts {
		ks := prompt(q, true)
		in := 0
		for i := range ks {
			if e.st.find(spatial(&ks[i]), identity(&ks[i])) >= 0 {
				in++
			}
		}
		switch in {
		case 0:
		case len(ks):
			whole++
		default:
			t.Errorf("prompt %d: %d of its %d chunks sampled", q, in, len(ks))
		}
	}
	if whole == 0 || whole*2*depth != c.Tracked {
		t.Errorf("%d whole prompts of %d chunks sampled, %d objects tracked", whole, 2*depth, c.Tracked)
	}
	if e.st.find(spatial(&stray), identity(&stray)) >= 0 {
		t.Error("a chunk stored before any lookup is in the sample")
	}
}

// Under prompt sampling Stored skips the mutex for keys no sampled lookup
// asked for, by a filter of the sampled keys' hashes: after traffic that
// sheds, trims and rebuilds it many times, every sampled key must still
// pass it (each tracked object got its stored size), and keys never looked
// up must mostly not (those that do only take the mutex).
func TestPromptSamplingFilterPassesSampledKeys(t *testing.T) {
	e := New(Options{PoolBytes: 1 << 30, MinSamples: 256, MaxSamples: 256, SamplePrompts: true})
	const depth = 8
	for q := range 20_000 {
		ks := make([]keys.ObjectKey, depth)
		for c := range ks {
			ks[c] = testKey(uint64(q%5000)*1000+uint64(c)+1, "m")
		}
		var p Prefix
		e.Probe(&p, ks, 0)
		for i := range ks {
			e.Stored(&ks[i], 100)
		}
	}
	f := e.seen.Load()
	if e.st.live == 0 {
		t.Fatal("nothing sampled")
	}
	for j, sp := range e.st.spat {
		if sp == 0 {
			continue
		}
		if !f.has(sp) {
			t.Fatalf("slot %d: a sampled key fails the filter", j)
		}
		if e.st.size[j] <= 0 {
			t.Errorf("slot %d: a sampled key stored after its lookup has no size", j)
		}
	}
	if f.set >= 2*e.st.slots() {
		t.Errorf("%d bits set for %d slots: the filter was not rebuilt", f.set, e.st.slots())
	}
	passed := 0
	const strangers = 10_000
	for i := range strangers {
		k := testKey(1<<40+uint64(i), "m")
		if f.has(spatial(&k)) {
			passed++
		}
	}
	if passed > strangers/10 {
		t.Errorf("%d of %d keys never looked up pass the filter, want under a tenth", passed, strangers)
	}
	t.Logf("%d tracked, %d bits set, %d of %d strangers pass", e.st.live, f.set, passed, strangers)
}

// BenchmarkStored measures Stored, which the pool calls for every object
// it takes, under its own lock: 16-chunk prompts over 4× a pool of 65,536
// objects, each looked up and then stored, so the sample is at its
// steady state; chunks and prompts are the two sampling modes at the
// default floor.
func BenchmarkStored(b *testing.B) {
	for _, prompts := range []bool{false, true} {
		name := "chunks"
		if prompts {
			name = "prompts"
		}
		b.Run(name, func(b *testing.B) {
			const objects, size, depth = 65536, 4096, 16
			e := New(Options{PoolBytes: objects * size, SamplePrompts: prompts})
			ks := make([]keys.ObjectKey, 4*objects)
			for i := range ks {
				ks[i] = testKey(uint64(i)+1, "meta-llama/Llama-3.1-8B-Instruct")
			}
			for i := 0; i < len(ks); i += depth {
				var p Prefix
				e.Probe(&p, ks[i:i+depth], 0)
				for j := i; j < i+depth; j++ {
					e.Stored(&ks[j], size)
				}
			}
			b.ResetTimer()
			for i := range b.N {
				e.Stored(&ks[i%len(ks)], size)
			}
		})
	}
}

// A key the pool hits but whose store the sample never saw (stored before
// any lookup of its prompt: a producer's store, or before its hash was
// sampled) takes a size on that lookup, so that its reuses have a
// distance: under prompt sampling, a prompt stored first and then looked up
// three times hits on the last two lookups at 1×.
func TestPoolHitOfAnUnseenStore(t *testing.T) {
	e := New(Options{PoolBytes: 1 << 20, MinSamples: 64, MaxSamples: 64, SamplePrompts: true})
	ks := make([]keys.ObjectKey, 4)
	for i := range ks {
		ks[i] = testKey(uint64(i)+1, "m")
		e.Stored(&ks[i], 4096) // no lookup asked for it yet: left out
	}
	for range 3 {
		var p Prefix
		e.Probe(&p, ks, len(ks)) // the pool hits every chunk
	}
	if got := point(t, e.Curve(), 1); got < 0.6 {
		t.Errorf("1× estimated %.3f, want the two reuses of three lookups (0.667)", got)
	}
}
