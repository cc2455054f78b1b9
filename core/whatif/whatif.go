// Package whatif estimates, live, the hit ratio the current traffic would get
// from an L1 pool of another size: a miss-ratio curve over 0.25× to 4× the
// pool, so an operator can see what doubling or halving the pool would buy.
//
// It follows SHARDS (Waldspurger et al., FAST 2015) in its fixed-size form:
// a key is sampled when a spatial hash of it falls under a threshold T, the
// sampled keys keep an LRU stack of their own, and the byte-weighted reuse
// distance of a sampled access (the bytes of distinct objects used since its
// last use, its own size included) is the sum of the sizes above it in that
// stack divided by the sampling rate R = T/2^64. Under LRU an object is in
// a pool that holds U bytes when its distance is at most U.
//
// The same samples give a second curve, for the prefix policy. That policy
// (evict leaves of the prefix tree by predicted next use, package
// core/l1/nextuse) is no stack algorithm, so it has no reuse distance:
// the estimator plays it, with the pool's own order, on a miniature pool
// per size on the curve (sim.go). l1's TestWhatIfMatchesRealPools checks
// each curve against real pools of its policy.
//
// Options.SamplePrompts (what kvdock runs, Served) samples prompt families
// instead of chunks: a key is sampled when the hash of its lookup's first
// chunk is under T, so a sampled prompt is in the sample whole, with every
// prompt that extends it. The prefix policy evicts a prompt from its last chunk back, so its
// hits depend on how deep a chunk sits in a prompt the pool is trimming: a
// chunk sampled alone is a leaf of the sampled tree at once and goes as
// readily as a tail, which chunk sampling misses at any rate (l1's
// TestWhatIfPromptSampling: scan-heavy at 0.5× with 2,048 samples, +9.7
// points sampling chunks, +0.2 sampling prompts). Whole prompts play it,
// but a family holds many chunks, so the curve rests on fewer families and
// needs more samples (BenchmarkWhatIfSampling): the floor is 2,048
// (DefaultMinSamples).
//
// When the sample set is full T drops by an eighth and the keys above it
// leave, so memory is fixed: the stack and the miniature pools together
// take the floor's FloorBytes (896 KiB) for any pool, and above it 1 % of
// what the pool's object table holds for a full pool (see
// TableBytesPerObject), capped at 0.1 % of the pool's bytes (PoolShare).
// kvdock's pools are GiBs: the floor is 0.09 % of a pool of 1 GiB; a
// smaller one pays more (1.3 % of 64 MiB, a quarter of l1's 3.3 MiB test
// pool of long-context chat). Entries deeper than 4× the pool in LRU
// order are dropped too, since they miss at every size LRU's curve shows.
//
// A kvdock pool does not stay full: once a second (Tick) its watermark loop
// evicts a share of the objects when the pool is above the watermark, so
// what it holds swings between the two. For each size on the curve and
// each policy the estimator keeps what such a pool would hold now: each
// sampled miss at that size adds the object's bytes (scaled by 1/R) up to
// the size, each Tick applies the watermark rule, and an access hits when
// its distance is within it. That is the pool's own eviction, played at
// every size at once.
//
// kvdock's lookups are prefix lookups: a chunk counts as hit only when every
// chunk before it hit too. A lookup therefore carries the largest distance
// seen so far (Prefix), and each sampled key counts as hit at the sizes that
// hold it and every sampled key before it; a key never stored misses at
// every size, and so does the rest of its lookup. A key the pool hit is
// stored, if the sample never saw its store (stored before any lookup of
// its prompt, or before its hash was sampled): it takes the last stored
// size then.
//
// Accesses are weighted by recency (the weights halve every Window sampled
// keys), so the curve follows the traffic of the last minutes rather than
// all of it. The hot path costs a hash of 8 bytes and a compare per key;
// only sampled keys take the estimator's mutex. Under prompt sampling a
// store cannot tell its key's family, so Stored asks a bitmap of the
// sampled keys' hashes first (filter.go): a bit load a key, and the mutex
// only for sampled keys and a few others in a hundred. Nothing is
// allocated per access (the filter is rebuilt, 8 KiB at the floor, after
// some 4,096 keys entered the sample).
package whatif

import (
	"encoding/binary"
	"math"
	"sync"
	"sync/atomic"
	"unsafe"

	"kvdock/core/keys"
)

// factors are the pool sizes the curve reports, as multiples of the pool.
func factors() [8]float64 { return [8]float64{0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4} }

// Factors returns the pool-size multiples Curve reports, ascending.
func Factors() []float64 {
	f := factors()
	return f[:]
}

// maxFactor is the largest size the curve shows, in pools.
const maxFactor = 4

// nf is the number of sizes on the curve.
const nf = len([8]float64{})

// Defaults for Options.
const (
	// DefaultMinSamples is the sample set's floor, whatever the pool: the
	// smallest power of two at which prompt sampling's curves give every
	// point of l1's TestWhatIfMatchesRealPools within 4 points (run with
	// 1,024 it leaves long-context chat 13–15 points off: a sample of
	// prompts rests on few families). It costs FloorBytes.
	DefaultMinSamples = 2048
	// FloorBytes bounds the estimator's memory at DefaultMinSamples
	// (slotBytes+simSlotBytes, the prompt hash and the filter's bits a
	// sample, and the fixed fields: 882,168 bytes measured by l1's
	// TestWhatIfMemoryBudget): the least any pool pays, 0.09 % of a pool
	// of 1 GiB.
	FloorBytes = 896 << 10
	// DefaultMaxSamples caps the sample set however large the pool.
	DefaultMaxSamples = 8192
	// DefaultWindow is the weight, in sampled keys looked up, after which
	// the weights halve.
	DefaultWindow = 1 << 15
	// TableBytesPerObject is a floor on what the L1 object table holds per
	// object (measured by l1's TestWhatIfMemoryBudget): the sample set is
	// sized so that it stays within BudgetShare of it.
	TableBytesPerObject = 140
	// BudgetShare is the share of the object table's memory the estimator
	// may use above the floor.
	BudgetShare = 0.01
	// PoolShare caps that budget by the pool's own bytes, for pools of
	// many small objects: above the floor the estimator holds at most
	// this share of the pool.
	PoolShare = 0.001
)

// Options configure an Estimator; zero values take the defaults.
type Options struct {
	// PoolBytes is the size of the pool the curve is about; required.
	PoolBytes int64
	// MinSamples and MaxSamples bound the sample set; between them it is
	// sized to BudgetShare of the object table of a full pool, and at
	// most PoolShare of the pool's bytes.
	MinSamples, MaxSamples int
	// Window is the sampled weight after which the weights halve.
	Window float64
	// SamplePrompts samples whole prompt families (by the hash of a
	// lookup's first chunk) instead of chunks. An object stored before any
	// lookup asked for it is then left out (its family is unknown).
	SamplePrompts bool
}

// Estimator is a live miss-ratio-curve estimator. A nil *Estimator does
// nothing, so callers need not check for one. It is safe for concurrent use.
type Estimator struct {
	pool    int64
	maxDist float64
	minS    int
	maxS    int
	window  float64
	prompts bool // Options.SamplePrompts

	// threshold is T: a key is sampled when its spatial hash is below it.
	threshold atomic.Uint64
	// probes counts every key probed (sampled or not), for the expected
	// sample count.
	probes atomic.Int64
	// batches counts the lookup batches probed (sampled or not): the
	// traffic's clock, which the prefix policy's pools tick by as the pool
	// ticks once a request.
	batches atomic.Uint64
	// poolHits counts the keys the pool itself hit, sampled or not: with
	// probes, the pool's true hit ratio that anchors the sample's.
	poolHits atomic.Int64
	// seen holds, under prompt sampling, the spatial hashes that entered
	// the sample, so that Stored of another object returns without the
	// mutex; replaced whole (rebuilt) under mu.
	seen atomic.Pointer[filter]
	// lastSize is the size of the last object stored, sampled or not: the
	// size of a key the pool hit whose store the sample never saw.
	lastSize atomic.Int64

	mu sync.Mutex
	// st is the sampled objects' LRU stack, sized for limit objects
	// (between minS and maxS).
	st    stack
	limit int
	rate  float64
	// meanSize is a running mean of the sampled stored sizes, for the
	// object count of a full pool and so the sample budget.
	meanSize float64

	// held is what an LRU pool of each size on the curve holds now
	// (bytes), and hits the sampled weight it would have hit; simHits is
	// the same for the prefix policy's pools, which sim plays.
	held     [nf]float64
	hits     [nf]float64
	simHits  [nf]float64
	sim      sim
	weight   float64 // sampled keys looked up
	realHits float64 // sampled keys the pool itself hit
	expected float64 // keys probed × rate at the time: the weight SHARDS expects
	expHits  float64 // the pool's hits on them, likewise
	folded   int64   // probes already folded into expected
	foldedH  int64   // pool hits already folded into expHits
	lookups  uint64  // sampled probes, never decayed
}

// Served is the configuration kvdock's engine runs the estimator with for
// a pool of poolBytes bytes: prompt sampling, the default bounds. l1's
// TestWhatIfMatchesRealPools checks this configuration.
func Served(poolBytes int64) Options {
	return Options{PoolBytes: poolBytes, SamplePrompts: true}
}

// New returns an estimator for a pool of opts.PoolBytes bytes.
func New(opts Options) *Estimator {
	opts.PoolBytes = positiveOr(opts.PoolBytes, 1)
	opts.MinSamples = positiveOr(opts.MinSamples, DefaultMinSamples)
	opts.MaxSamples = positiveOr(opts.MaxSamples, DefaultMaxSamples)
	opts.MaxSamples = max(opts.MaxSamples, opts.MinSamples)
	opts.Window = positiveOr(opts.Window, DefaultWindow)
	e := &Estimator{
		pool:    opts.PoolBytes,
		maxDist: maxFactor * float64(opts.PoolBytes),
		minS:    opts.MinSamples,
		maxS:    opts.MaxSamples,
		window:  opts.Window,
		prompts: opts.SamplePrompts,
		limit:   opts.MinSamples,
		rate:    1,
	}
	e.st.reset(e.limit)
	e.sim.reset(e.limit)
	if e.prompts {
		e.seen.Store(newFilter(e.limit, nil))
	}
	e.threshold.Store(math.MaxUint64)
	return e
}

// spatial is the sampling hash of k: the chunk digest is already uniform
// (BLAKE3), so a mix with the rank is enough and no string is hashed on the
// hot path. Keys of different models that share a chunk digest and rank
// share it, and so are sampled together; their identities still differ.
func spatial(k *keys.ObjectKey) uint64 {
	return keys.Mix64(binary.LittleEndian.Uint64(k.Chunk[:8]) ^ uint64(k.KVRank)<<32 ^ uint64(k.KVRank))
}

// identity tells apart sampled keys that share a spatial hash: the model
// and salt (FNV-1a) and more of the digest, only computed for sampled keys.
func identity(k *keys.ObjectKey) uint32 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(k.Model); i++ {
		h = (h ^ uint64(k.Model[i])) * 1099511628211
	}
	h = (h ^ 0xff) * 1099511628211 // separates model "ab"+salt "c" from "a"+"bc"
	for i := 0; i < len(k.Salt); i++ {
		h = (h ^ uint64(k.Salt[i])) * 1099511628211
	}
	h ^= binary.LittleEndian.Uint64(k.Chunk[8:16])
	return uint32(keys.Mix64(h))
}

// Prefix is the state of one lookup across its batches: the largest reuse
// distance of its keys so far (LRU), and for the prefix policy's pools
// (sim) the sizes where one of its keys missed, each size's tick when the
// lookup began (what the store of its prompt pins) and its last sampled
// key (the next one's parent). The zero value starts a lookup.
type Prefix struct {
	worst   float64 // +Inf once a key missed at every size
	broken  uint8   // a bit per size where a key missed
	started bool
	start   [nf]uint64
	prevSp  uint64
	prevID  uint32
	lend    [nf]uint64 // per size: the gap the last sampled key passes on (hit, or stored by this lookup)
	lendM   uint8      // a bit per size where lend is measured
	fresh   uint8      // a bit per size where the last sampled key was stored by this lookup
	due     [nf]uint64 // per size: when the lookup's store would be due back (admission)
	dueSet  uint8      // a bit per size where due is set
	newP    uint8      // a bit per size where the store is a new prompt's (no gap lent: nextuse.Admits)
	refused uint8      // a bit per size where admission refused a key of this lookup (the rest of its tail)
	probed  int        // keys probed so far, sampled or not
	family  uint64     // the spatial hash of the lookup's first key (prompt sampling)
	prevHit bool       // the pool hit the last key probed
}

// Probe records the keys of one lookup batch, in lookup order: the first
// hit of them the pool itself found (and read-locked), the rest it did not.
// Call it for every key the lookup asks for, the ones after the pool's first
// miss included, so the curve sees what a larger pool would have hit.
func (e *Estimator) Probe(p *Prefix, ks []keys.ObjectKey, hit int) {
	if e == nil || len(ks) == 0 {
		return
	}
	e.probes.Add(int64(len(ks)))
	now := e.batches.Add(1)
	e.poolHits.Add(int64(min(max(hit, 0), len(ks))))
	if e.prompts && p.probed == 0 {
		p.family = spatial(&ks[0])
	}
	t := e.threshold.Load()
	locked := false
	for i := range ks {
		if e.prompts && (p.family >= t || p.family == 0) {
			break // the family is out of the sample (or left it now)
		}
		sp := spatial(&ks[i])
		samp := sp
		if e.prompts {
			samp = p.family
		}
		if samp >= t || sp == 0 {
			continue
		}
		if !locked {
			e.mu.Lock()
			locked = true
			e.fold()
			e.sim.begin(now)
		}
		// Whether the pool itself hit the key before this one (its
		// parent's chunk, or another rank of its own, which hits with it).
		after := (i > 0 && i <= hit) || (i == 0 && p.prevHit)
		e.probeLocked(p, identity(&ks[i]), sp, samp, i < hit, after && p.probed+i > 0)
		t = e.threshold.Load() // may have dropped
	}
	if locked {
		e.sim.end()
		e.mu.Unlock()
	}
	p.probed += len(ks)
	p.prevHit = hit >= len(ks)
}

// Stored records that the pool took a new object of size bytes (its
// allocation, rounded to the pool's alignment) under k.
func (e *Estimator) Stored(k *keys.ObjectKey, size int64) {
	if e == nil || size <= 0 {
		return
	}
	if e.lastSize.Load() != size { // a load, not a fenced store, for a size that repeats
		e.lastSize.Store(size)
	}
	sp := spatial(k)
	if sp == 0 {
		return
	}
	if e.prompts {
		// Only a lookup puts a key in the sample: one no sampled lookup
		// asked for is left out without the mutex.
		if !e.seen.Load().has(sp) {
			return
		}
	} else if sp >= e.threshold.Load() {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	id := identity(k)
	switch j := e.st.find(sp, id); {
	case j >= 0:
		e.st.setSize(j, size)
		e.st.touch(lruOrder, j)
		e.sim.setCharge(j, size)
	case e.prompts:
		return // no lookup of its family in the sample asked for it
	default:
		e.insert(sp, sp, id, size)
	}
	if e.meanSize == 0 {
		e.meanSize = float64(size)
	} else {
		e.meanSize += (float64(size) - e.meanSize) / 64
	}
	e.resize()
	e.trim()
}

// fold adds the keys probed since the last fold to the expected sample
// weight at the current rate (it only changes under mu, after a fold).
func (e *Estimator) fold() {
	n, h := e.probes.Load(), e.poolHits.Load()
	e.expected += float64(n-e.folded) * e.rate
	e.expHits += float64(h-e.foldedH) * e.rate
	e.folded, e.foldedH = n, h
}

func (e *Estimator) probeLocked(p *Prefix, id uint32, sp, samp uint64, realHit, afterHit bool) {
	d := math.Inf(1)
	size := e.meanSize
	j := e.st.find(sp, id)
	if j >= 0 {
		if s := e.st.size[j]; s > 0 {
			d = float64(s) + float64(e.st.above(lruOrder, j))/e.rate
			size = float64(s)
		}
		e.st.touch(lruOrder, j)
	} else {
		// Never seen (or dropped): at the top now, with no size until the
		// pool stores it, as a store after this miss would put it. A key
		// the pool hit is stored already, unseen (before any lookup of its
		// prompt, or before its hash was sampled): it takes a size now, so
		// that its next use has a distance.
		var stored int64
		if realHit {
			if size <= 0 {
				size = float64(e.lastSize.Load())
			}
			stored = int64(size)
		}
		j = e.insert(sp, samp, id, stored)
	}
	p.worst = max(p.worst, d)
	for k, f := range factors() {
		switch {
		case p.worst <= e.held[k]:
			e.hits[k]++
		case d > e.held[k]:
			// Absent at this size: the worker stores it after the miss.
			e.held[k] = min(e.held[k]+size/e.rate, f*float64(e.pool))
		}
	}
	if j >= 0 {
		e.simProbe(p, j, int64(min(size, maxCharge)), afterHit)
	}
	p.prevSp, p.prevID = sp, id
	e.weight++
	e.lookups++
	if realHit {
		e.realHits++
	}
	if e.weight >= e.window {
		e.scale(0.5)
	}
	e.trim()
}

// simProbe plays slot j, the next sampled key of p's lookup, of size
// bytes, on the prefix policy's pools: a hit where it is held and every
// key before it hit, used then; else a miss, and the worker's store of it
// after, which evicts in the policy's order with the lookup's prompt
// pinned. A key the pool never stored misses at every size, as for LRU.
func (e *Estimator) simProbe(p *Prefix, j int32, size int64, afterHit bool) {
	s := &e.sim
	if !p.started {
		p.started = true
		for k := range nf {
			p.start[k] = s.clk[k].Now + 1
		}
	}
	if s.in[j] == 0 {
		s.par[j], s.parID[j] = p.prevSp, p.prevID
		s.charge[j] = size
	}
	stored := e.st.size[j] > 0
	// Whether j's parent is the sampled key just before it in this lookup.
	afterPrev := s.par[j] != 0 && s.par[j] == p.prevSp && s.parID[j] == p.prevID
	fresh := p.fresh
	p.fresh = 0
	for k, f := range factors() {
		bit := uint8(1) << k
		if s.in[j]&bit != 0 {
			if p.broken&bit == 0 && stored {
				e.simHits[k]++
				s.use(j, k)
				p.lend[k] = s.ord[int(j)*nf+k].Gap
				p.lendM |= bit
			} else {
				p.broken |= bit
			}
			continue
		}
		// The pool hit the chunk before, and nothing of the lookup missed
		// here before: that chunk is taken as held here too.
		held := afterHit && p.broken&bit == 0
		p.broken |= bit
		if p.refused&bit != 0 {
			continue // a chunk past a refused one is refused too
		}
		if p.dueSet&bit == 0 {
			// The store's chunks are due back a gap from now: the gap of the
			// chunk before them, or the mean (core/l1's admitLeading).
			gap := p.lend[k]
			if gap == 0 {
				gap = s.clk[k].Prior(s.count[k])
				p.newP |= bit
			}
			p.due[k], p.dueSet = s.clk[k].Now+gap, p.dueSet|bit
		}
		ok, refused := s.makeRoom(&e.st, k, s.charge[j], e.simCap(f), p.start[k], p.due[k], p.newP&bit != 0)
		if refused {
			p.refused |= bit
		}
		if ok {
			g, m := s.admit(&e.st, j, k, p.lend[k], p.lendM&bit != 0, held, afterPrev && fresh&bit != 0)
			p.lend[k] = g
			p.lendM &^= bit
			if m {
				p.lendM |= bit
			}
			p.fresh |= bit
		}
	}
}

// simCap is the sampled bytes a pool of f × the pool holds.
func (e *Estimator) simCap(f float64) int64 { return int64(f * float64(e.pool) * e.rate) }

// Tick plays the pool's watermark loop at every size: a pool at or above
// watermark of its size drops ratio of what it holds. The pool calls it on
// each of its own ticks, with its settings then.
func (e *Estimator) Tick(watermark, ratio float64) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, f := range factors() {
		if e.held[k] > 0 && e.held[k] >= watermark*f*float64(e.pool) {
			e.held[k] *= 1 - ratio
		}
		e.sim.tick(&e.st, k, watermark, ratio, e.simCap(f))
	}
}

// Cleared says the pool was emptied: so are the pools of every size.
func (e *Estimator) Cleared() {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.held = [nf]float64{}
	e.sim.clear()
}

// insert puts a new object, sampled by samp, on top and returns its slot,
// making room by lowering the threshold when the stack is full; the object
// is left out (-1) when it falls out of the sample itself.
func (e *Estimator) insert(sp, samp uint64, id uint32, size int64) int32 {
	if e.st.live >= e.st.slots() {
		e.shed(e.st.slots() - 1)
		if samp >= e.threshold.Load() {
			return -1
		}
	}
	j := e.st.insert(sp, samp, id, size)
	if e.prompts && j >= 0 {
		f := e.seen.Load()
		f.add(sp)
		if f.set >= 2*e.st.slots() {
			e.seen.Store(newFilter(e.st.slots(), &e.st)) // drop the stale bits
		}
	}
	return j
}

// shed lowers the threshold until at most n objects are left. Sampled
// hashes are uniform below T, so T×7/8 drops about an eighth of them in
// one pass over the slots (amortised O(1) an insert, where the paper's
// priority queue drops one at a time). The weights gathered at the old
// rate are rescaled to the new one (fixed-size SHARDS).
func (e *Estimator) shed(n int) {
	for e.st.live > n {
		t := e.threshold.Load()
		t -= max(t/8, 1)
		for j := range e.st.spat {
			if e.st.spat[j] != 0 && e.st.sampling(int32(j)) >= t {
				e.remove(int32(j))
			}
		}
		e.setThreshold(t)
	}
}

// setThreshold samples hashes below t from now on, rescaling the weights
// gathered at the old rate to the new one.
func (e *Estimator) setThreshold(t uint64) {
	e.fold()
	old := e.rate
	e.threshold.Store(t)
	e.rate = float64(t) / math.MaxUint64
	e.scale(e.rate / old)
}

// remove drops slot j from the sample, and so from the prefix policy's
// pools.
func (e *Estimator) remove(j int32) {
	e.sim.drop(&e.st, j)
	e.st.remove(j)
}

// trim drops the least recently used objects deeper than maxFactor pools:
// they miss at every size the LRU curve shows, as they will when next
// used (and the prefix policy's pools, which might keep one, lose it). A
// stack left under a quarter full raises the threshold again.
func (e *Estimator) trim() {
	for e.st.live > 1 {
		j := e.st.bottom(lruOrder)
		if j < 0 || float64(e.st.size[j])+float64(e.st.above(lruOrder, j))/e.rate <= e.maxDist {
			break
		}
		e.remove(j)
	}
	e.raise()
}

// raise doubles the threshold when the stack is under a quarter full:
// fixed-size SHARDS only ever lowers it, so one flood of distinct keys
// would leave the curve resting on a handful of samples for good. Keys
// newly sampled look cold on their first use, a bias that fades within a
// reuse; the weights are rescaled to the new rate.
func (e *Estimator) raise() {
	t := e.threshold.Load()
	if t == math.MaxUint64 || e.st.live >= e.st.slots()/4 {
		return
	}
	nt := uint64(math.MaxUint64)
	if t < math.MaxUint64/2 {
		nt = 2 * t
	}
	e.setThreshold(nt)
}

// resize sets the stack's size to BudgetShare of the object table of a
// full pool of objects of the mean stored size (at most PoolShare of the
// pool's bytes), within [minS, maxS]; it
// rebuilds the stack only when that moves by more than a quarter.
func (e *Estimator) resize() {
	if e.meanSize <= 0 {
		return
	}
	objects := float64(e.pool) / e.meanSize
	per := slotBytes + simSlotBytes
	if e.prompts {
		per += 8 + 8 // the stack's samp, the filter's 32 to 64 bits (a power of two)
	}
	budget := min(objects*TableBytesPerObject*BudgetShare, float64(e.pool)*PoolShare) - float64(unsafe.Sizeof(*e))
	n := min(max(int(budget/float64(per)), e.minS), e.maxS)
	if n == e.limit || (n > e.limit*3/4 && n < e.limit*5/4) {
		return
	}
	if e.st.live > n {
		e.shed(n)
	}
	// Re-insert the live objects into a stack of n slots, oldest first in
	// LRU order; each keeps what the prefix policy's pools held of it.
	old := e.st
	e.st.reset(n)
	e.limit = n
	lru := &old.ord[lruOrder]
	for t := lru.oldest; t < lru.clock; t++ {
		if j := lru.rev[t]; j >= 0 {
			e.st.insert(old.spat[j], old.sampling(j), old.id[j], old.size[j])
		}
	}
	e.sim.moved(&old, &e.st)
	if e.prompts {
		e.seen.Store(newFilter(n, &e.st))
	}
}

// scale multiplies every weight by f (decay, or a rate change).
func (e *Estimator) scale(f float64) {
	for k := range e.hits {
		e.hits[k] *= f
		e.simHits[k] *= f
	}
	e.weight *= f
	e.realHits *= f
	e.expected *= f
	e.expHits *= f
}

// Point is the estimated hit ratio at one pool size.
type Point struct {
	Factor    float64 // pool size as a multiple of the current pool
	PoolBytes int64
	HitRatio  float64 // estimated share of looked-up chunks found, 0..1
}

// Curve is the estimator's picture now.
type Curve struct {
	// Points are the estimates at Factors(), ascending, for a pool that
	// evicts least recently used chunks first (policy LRU); empty until a
	// sampled key was looked up.
	Points []Point
	// Prefix are the same for a pool that evicts only leaves of the prefix
	// tree, least recently used first (policy prefix), from the same
	// samples.
	Prefix []Point
	// Measured is the pool's own hit ratio over the same window (on the
	// sampled keys, corrected as the points are: the pool's ratio on every
	// key unless the correction was clamped); Points at 1 should be near it.
	Measured float64
	// Weight is the sampled accesses the curve rests on (decayed); Sampled
	// is every sampled access since the start.
	Weight  float64
	Sampled uint64
	// SampleRate is SHARDS' R: the share of keys sampled.
	SampleRate float64
	// Tracked is the sampled objects in the stack now, Limit its cap.
	Tracked, Limit int
	// MemoryBytes is what the estimator holds: the sample stack as
	// allocated (never past Limit) and its fixed fields.
	MemoryBytes int64
}

// Curve returns the estimates now.
func (e *Estimator) Curve() Curve {
	if e == nil {
		return Curve{}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.fold()
	c := Curve{
		Weight: e.weight, Sampled: e.lookups, SampleRate: e.rate,
		Tracked: e.st.live, Limit: e.limit, MemoryBytes: e.memory(),
	}
	if e.weight <= 0 {
		return c
	}
	// The sample's error is put at distance zero (hits at every size: it
	// is mostly hot keys over- or under-represented), as SHARDS_adj does
	// with the difference between the weight the rate predicts and the
	// weight sampled. Here it is sized so that the sample's own pool hits
	// match the pool's hits on every key, which the lookups report too;
	// SHARDS_adj proper stands in when that ratio says nothing (0 or 1).
	adj := e.expected - e.weight
	if e.expected > 0 {
		if truth := e.expHits / e.expected; truth > 0 && truth < 1 {
			adj = (truth*e.weight - e.realHits) / (1 - truth)
		}
	}
	adj = min(max(adj, -e.weight/2), 2*e.weight)
	ratio := func(h float64) float64 { return min(max((h+adj)/(e.weight+adj), 0), 1) }
	c.Measured = ratio(e.realHits)
	for k, f := range factors() {
		c.Points = append(c.Points, Point{Factor: f, PoolBytes: int64(f * float64(e.pool)), HitRatio: ratio(e.hits[k])})
		c.Prefix = append(c.Prefix, Point{Factor: f, PoolBytes: int64(f * float64(e.pool)), HitRatio: ratio(e.simHits[k])})
	}
	return c
}

// memory is the estimator's footprint in bytes: the stack as allocated
// and the struct's fixed fields.
func (e *Estimator) memory() int64 {
	m := e.st.memory() + e.sim.memory() + int64(unsafe.Sizeof(*e))
	if f := e.seen.Load(); f != nil {
		m += f.memory() + int64(unsafe.Sizeof(*f))
	}
	return m
}

// positiveOr is v, or def where v is not positive: an option left unset
// takes its default. Each core leaf keeps its own, so none imports settings.
func positiveOr[T ~int | ~int64 | ~float64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}
