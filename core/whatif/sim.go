package whatif

import "kvdock/core/l1/nextuse"

// sim plays the prefix policy on the sampled objects at every size on the
// curve at once (miniature simulation: Waldspurger et al., ATC 2017): a
// pool of f × the pool's bytes × R per size, holding sampled objects, run
// by the order the pool runs (package nextuse). The policy is no stack
// algorithm (a larger pool need not hold what a smaller one does), so it
// has no reuse distance; each size keeps what it holds. What the pool does
// around the order, the sim does too: it evicts only leaves of the prefix
// tree, a lookup uses only the run of chunks that hit, a store pins the
// prompt it extends, and the watermark loop evicts a share of the objects
// at each Tick. The sampled tree stands for the pool's: a sampled chunk's
// parent is the sampled chunk before it in the lookup that first placed it
// (its nearest sampled ancestor, since digests chain).
//
// State is per slot of the stack and per size (slot*nf + size), so its
// memory is fixed with the stack's (simSlotBytes a slot).
type sim struct {
	ord    []nextuse.Order // per slot and size
	kids   []uint16        // resident children, per slot and size
	in     []uint8         // per slot: a bit per size that holds it
	linked []uint8         // per slot: a bit per size where it counts in its parent's kids
	charge []int64         // per slot: the bytes it takes where held
	par    []uint64        // per slot: the parent's spatial hash (0: none)
	parID  []uint32        // per slot: the parent's identity

	heaps [nf]nextuse.Heaps
	clk   [nf]nextuse.Clock
	held  [nf]int64  // sampled bytes each size holds
	count [nf]int    // sampled objects each size holds
	gone  [nf]uint32 // evictions at each size (wrapping), the ghosts' clock
	pins  []int32    // scratch: pinned victims set aside
}

// simSlotBytes is the sim's memory per slot of the stack: per size an
// order, a kid count and two heap entries; per slot the masks, the charge
// and the parent, and the scratch of pinned victims.
const simSlotBytes = nf*(32+2+2*4) + 1 + 1 + 8 + 8 + 4 + 4

// view is one size's objects as nextuse.Items.
type view struct {
	s *sim
	k int
}

func (v view) Order(j int32) *nextuse.Order { return &v.s.ord[int(j)*nf+v.k] }

func (s *sim) reset(n int) {
	*s = sim{
		ord: make([]nextuse.Order, n*nf), kids: make([]uint16, n*nf),
		in: make([]uint8, n), linked: make([]uint8, n), charge: make([]int64, n),
		par: make([]uint64, n), parID: make([]uint32, n), pins: make([]int32, 0, n),
	}
	for k := range s.heaps {
		s.heaps[k].Grow(n)
	}
	for i := range s.ord {
		s.ord[i] = nextuse.New(0)
	}
}

func (s *sim) memory() int64 {
	m := int64(cap(s.ord))*32 + int64(cap(s.kids))*2 + int64(cap(s.in)+cap(s.linked)) + int64(cap(s.charge))*8 +
		int64(cap(s.par))*8 + int64(cap(s.parID))*4 + int64(cap(s.pins))*4
	for k := range s.heaps {
		m += int64(s.heaps[k].Cap()) * 2 * 4
	}
	return m
}

// candidate reports whether slot j is an evictable leaf at size k (pins
// aside, which the victim loop sets apart).
func (s *sim) candidate(j int32, k int) bool {
	return s.in[j]&(1<<k) != 0 && s.kids[int(j)*nf+k] == 0
}

func (s *sim) reheap(j int32, k int) {
	v := view{s, k}
	in, want := s.ord[int(j)*nf+k].InHeaps(), s.candidate(j, k)
	switch {
	case want && !in:
		nextuse.Push(&s.heaps[k], v, j, s.clk[k].Prior(s.count[k]))
	case !want && in:
		nextuse.Remove(&s.heaps[k], v, j)
	}
}

// parent is slot j's parent slot in st, -1 when none is sampled.
func (s *sim) parent(st *stack, j int32) int32 {
	if s.par[j] == 0 {
		return -1
	}
	return st.find(s.par[j], s.parID[j])
}

// evict takes slot j out of size k.
func (s *sim) evict(st *stack, j int32, k int) {
	bit := uint8(1) << k
	nextuse.Remove(&s.heaps[k], view{s, k}, j)
	s.ord[int(j)*nf+k].Left = s.gone[k]
	s.gone[k]++
	s.in[j] &^= bit
	s.held[k] -= s.charge[j]
	s.count[k]--
	if s.linked[j]&bit != 0 {
		s.linked[j] &^= bit
		if pj := s.parent(st, j); pj >= 0 && s.in[pj]&bit != 0 && s.kids[int(pj)*nf+k] > 0 {
			s.kids[int(pj)*nf+k]--
			s.reheap(pj, k)
		}
	}
}

// makeRoom evicts at size k until need more sampled bytes fit under
// capacity, leaving alone the objects used at or after pinFrom (the prompt
// of the lookup being stored); it reports whether they fit. As the pool
// admits (nextuse.Admits), a victim due back before due, the new object's
// due time, or a hot one when newPrompt (the lookup's store has no gap to
// lend), refuses it (refused) and evicts nothing more. The pool it
// stands for fills to within an object of its size, a share R of an
// object here; evicting whole sampled objects to fit under capacity would
// hold half a sampled object less on average, 7 % of a miniature pool of
// 7 objects. So the store may pass capacity by half its own size: what
// the miniature pool holds is centred on its size.
func (s *sim) makeRoom(st *stack, k int, need, capacity int64, pinFrom, due uint64, newPrompt bool) (ok, refused bool) {
	capacity += need / 2
	v := view{s, k}
	s.pins = s.pins[:0]
	for s.held[k]+need > capacity {
		j := nextuse.Victim(&s.heaps[k], v, s.clk[k].Now)
		if j < 0 {
			break
		}
		o := &s.ord[int(j)*nf+k]
		if o.Stamp >= pinFrom {
			nextuse.Remove(&s.heaps[k], v, j)
			s.pins = append(s.pins, j)
			continue
		}
		if !nextuse.Admits(o, s.clk[k].Now, due, newPrompt) {
			refused = true
			break
		}
		s.evict(st, j, k)
	}
	for _, j := range s.pins {
		s.reheap(j, k)
	}
	return !refused && s.held[k]+need <= capacity, refused
}

// admit stores slot j at size k, a leaf under its parent when that is
// held there, and lends it a gap as the pool does: a store's new chunks
// take, down the chain, the gap of the chunk before its first (the last one
// the lookup hit), none when the prompt missed from its start; a new chunk
// with none is given the prior when it is first a leaf, not before (the
// pool chains a store's chunks while they are write-locked, out of the
// heaps). lend (measured or not) is the gap a chunk before this one in the
// lookup passes on at this size (0: none): the last sampled chunk that hit,
// or the sampled chunk stored just before, as fresh says. Most sampled
// chunks have no sampled chunk before them in their lookup; with
// parentHeld (taken as held at this size) the chunk before's gap, the gap
// of a chunk used whenever this one is, is this chunk's own: the ticks
// since its last use here. It returns the gap the chunk passes on down the
// chain, and whether it is measured.
//
// A slot held here before (its order kept from then: last use and gap)
// is the pool's ghost (core/l1's ghost.go) while it left within 1.5 ×
// the objects held of the last evictions here (the pool's table keeps a
// ghost until another takes its entry, about as many evictions as it has
// entries, 1 to 2 × its objects): linked under a held parent, it takes its
// own history back (nextuse.Resume), strictly when its parent has no gap
// to lend.
func (s *sim) admit(st *stack, j int32, k int, lend uint64, lendMeasured, parentHeld, fresh bool) (uint64, bool) {
	bit := uint8(1) << k
	i := int(j)*nf + k
	old := s.ord[i]
	last := old.Stamp
	s.ord[i] = nextuse.Stored(s.clk[k].Tick())
	switch {
	case lend > 0:
		s.ord[i].Gap, s.ord[i].Measured = lend, lendMeasured
	case parentHeld && last > 0:
		s.ord[i].Gap, s.ord[i].Measured = s.ord[i].Stamp-last, true
	}
	s.kids[i] = 0
	s.in[j] |= bit
	s.held[k] += s.charge[j]
	s.count[k]++
	linked, strict := parentHeld, false
	if pj := s.parent(st, j); pj >= 0 && s.in[pj]&bit != 0 {
		s.linked[j] |= bit
		pi := int(pj)*nf + k
		s.kids[pi]++
		s.reheap(pj, k)
		linked = true
		switch {
		case !fresh && s.kids[pi] > 1: // it branches off (the pool's inherit)
			nextuse.Branch(&s.ord[i])
			strict = s.ord[pi].Gap == 0
		case !fresh:
			s.ord[i].Gap = 0
			strict = s.ord[pi].Gap == 0
			nextuse.Inherit(&s.ord[i], &s.ord[pi])
		case lend == 0:
			// Stored by this lookup with no gap to pass on: its prior was
			// only a leaf's, and it is none now (out of the heaps).
			s.ord[pi].Gap, s.ord[pi].Measured = 0, false
			strict = true
		}
	}
	if linked && last > 0 && uint64(s.gone[k]-old.Left) <= uint64(s.count[k])*3/2 {
		var g uint64
		if old.Measured {
			g = old.Gap
		}
		if gap, ok := nextuse.Resume(s.ord[i].Stamp, last, g, strict); ok {
			s.ord[i].Gap, s.ord[i].Measured = gap, true
		}
	}
	g, m := s.ord[i].Gap, s.ord[i].Measured
	s.reheap(j, k)
	return g, m
}

// begin opens the request of a lookup batch, at tick now of the traffic's
// clock, at every size: its uses and stores share the tick, as they do in
// the pool (nextuse.Clock.Begin).
func (s *sim) begin(now uint64) {
	for k := range s.clk {
		s.clk[k].Now = max(s.clk[k].Now, now-1)
		s.clk[k].Begin()
	}
}

// end closes the request begin opened.
func (s *sim) end() {
	for k := range s.clk {
		s.clk[k].End()
	}
}

// use marks slot j, held at size k, as used by a lookup.
func (s *sim) use(j int32, k int) {
	s.clk[k].Use(&s.ord[int(j)*nf+k])
	nextuse.Fix(&s.heaps[k], view{s, k}, j)
}

// maxCharge bounds an object's charge, so that the sums of a full stack
// cannot wrap (a peer chooses sizes).
const maxCharge = 1 << 40

// setCharge changes what slot j takes where it is held.
func (s *sim) setCharge(j int32, c int64) {
	c = min(c, maxCharge)
	for k := range nf {
		if s.in[j]&(1<<k) != 0 {
			s.held[k] += c - s.charge[j]
		}
	}
	s.charge[j] = c
}

// drop takes slot j out of every size, as it leaves the stack.
func (s *sim) drop(st *stack, j int32) {
	for k := range nf {
		if s.in[j]&(1<<k) != 0 {
			s.evict(st, j, k)
		}
	}
	for k := range nf {
		s.kids[int(j)*nf+k] = 0
		s.ord[int(j)*nf+k] = nextuse.New(0) // no ghost for the next key of the slot
	}
	s.in[j], s.linked[j], s.charge[j], s.par[j], s.parID[j] = 0, 0, 0, 0, 0
}

// tick plays the watermark loop at size k of capacity sampled bytes.
func (s *sim) tick(st *stack, k int, watermark, ratio float64, capacity int64) {
	if s.count[k] == 0 || float64(s.held[k]) < watermark*float64(capacity) {
		return
	}
	v := view{s, k}
	for n := max(1, int(ratio*float64(s.count[k]))); n > 0; n-- {
		j := nextuse.Victim(&s.heaps[k], v, s.clk[k].Now)
		if j < 0 {
			return
		}
		s.evict(st, j, k)
	}
}

// clear empties every size.
func (s *sim) clear() {
	for i := range s.ord {
		s.ord[i] = nextuse.New(0)
	}
	clear(s.kids)
	clear(s.in)
	clear(s.linked)
	for k := range s.heaps {
		s.heaps[k].Reset()
		s.held[k], s.count[k] = 0, 0
	}
}

// moved rebuilds the sim for st, a stack the objects of old (whose sim
// this was) were re-inserted into: each object keeps what each size held
// of it.
func (s *sim) moved(old *stack, st *stack) {
	prev := *s
	s.reset(st.slots())
	for k := range nf {
		s.clk[k], s.held[k], s.count[k], s.gone[k] = prev.clk[k], prev.held[k], prev.count[k], prev.gone[k]
	}
	for j := range old.spat {
		if old.spat[j] == 0 {
			continue
		}
		nj := st.find(old.spat[j], old.id[j])
		if nj < 0 {
			continue
		}
		s.in[nj], s.linked[nj], s.charge[nj], s.par[nj], s.parID[nj] = prev.in[j], prev.linked[j], prev.charge[j], prev.par[j], prev.parID[j]
		for k := range nf {
			o := prev.ord[j*nf+k]
			o.Due, o.Late = -1, -1
			s.ord[int(nj)*nf+k] = o
			s.kids[int(nj)*nf+k] = prev.kids[j*nf+k]
		}
	}
	for j := range st.spat {
		for k := range nf {
			if s.in[j] != 0 {
				s.reheap(int32(j), k)
			}
		}
	}
}
