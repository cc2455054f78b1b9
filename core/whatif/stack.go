package whatif

// stack holds the sampled objects in recency order, with the sums SHARDS
// needs in O(log n): every use of an object gets a time stamp, a Fenwick
// tree over time stamps holds each object's size at its last use, and so
// the bytes used since an object's last use are the total minus a prefix
// sum. The objects, their sizes and the linear-probing index that finds
// one by its hash sit beside the order, which the prefix policy's pools
// (sim) index by slot too. Time stamps run over twice the slots; when the
// order runs out the live ones are renumbered in order (amortised O(1) a
// use).
//
// Memory is fixed by the slot count given to reset: slotBytes a slot, and
// 8 more with prompt sampling (samp).
type stack struct {
	// Per slot. A free slot has spat 0 and links the free list through
	// ord[0].ts.
	spat []uint64 // spatial hash (never 0 for a live slot)
	samp []uint64 // the hash that keeps it in the sample, where not spat (prompt sampling); nil until one differs
	id   []uint32 // identity check among objects sharing spat
	size []int64  // bytes (0: looked up, never stored)

	index []int32 // slot+1 by hash, 0 = empty; a power of two ≥ 2 slots
	ord   [orders]order

	free  int32 // first free slot, -1 for none
	live  int   // objects held
	total int64 // sum of the live sizes
}

// The orders a stack keeps: one, LRU.
const (
	lruOrder = 0
	orders   = 1
)

// order is one recency order of the stack's objects.
type order struct {
	ts     []uint32 // per slot: time of last use
	fen    []int64  // Fenwick tree over times: size of the object last used then
	rev    []int32  // time → slot, -1 once that slot was used again or left
	clock  uint32   // next time stamp
	oldest uint32   // no live object was last used before it
}

// slotBytes is the most memory one slot takes: the shared per-slot fields,
// up to four index entries, and per order a time, two times in the tree
// and two in the reverse map.
const slotBytes = 8 + 4 + 8 + 4*4 + orders*(4+2*8+2*4)

// reset empties the stack and sizes it for n objects.
func (s *stack) reset(n int) {
	n = max(n, 1)
	idx := 1
	for idx < 2*n {
		idx <<= 1
	}
	*s = stack{
		spat: make([]uint64, n), id: make([]uint32, n), size: make([]int64, n),
		index: make([]int32, idx),
	}
	for o := range s.ord {
		s.ord[o] = order{ts: make([]uint32, n), fen: make([]int64, 2*n), rev: make([]int32, 2*n)}
		for i := range s.ord[o].rev {
			s.ord[o].rev[i] = -1
		}
	}
	ts := s.ord[0].ts
	for i := range ts {
		ts[i] = uint32(i + 1) // next free; n ends the list
	}
	ts[n-1] = ^uint32(0)
	s.free = 0
}

// slots is the stack's capacity in objects.
func (s *stack) slots() int { return len(s.spat) }

// memory is what the stack holds, in bytes.
func (s *stack) memory() int64 {
	m := int64(cap(s.spat))*8 + int64(cap(s.samp))*8 + int64(cap(s.id))*4 + int64(cap(s.size))*8 + int64(cap(s.index))*4
	for o := range s.ord {
		m += int64(cap(s.ord[o].ts))*4 + int64(cap(s.ord[o].fen))*8 + int64(cap(s.ord[o].rev))*4
	}
	return m
}

// sampling is the hash that keeps slot j in the sample: its own spatial
// hash, or with prompt sampling its prompt family's.
func (s *stack) sampling(j int32) uint64 {
	if s.samp != nil {
		return s.samp[j]
	}
	return s.spat[j]
}

// find returns the slot of (sp, id), or -1.
func (s *stack) find(sp uint64, id uint32) int32 {
	mask := uint64(len(s.index) - 1)
	for h := sp & mask; ; h = (h + 1) & mask {
		e := s.index[h]
		if e == 0 {
			return -1
		}
		if j := e - 1; s.spat[j] == sp && s.id[j] == id {
			return j
		}
	}
}

// above is the bytes of the objects used, in order o, since slot j's last
// use.
func (s *stack) above(o int, j int32) int64 {
	return s.total - s.ord[o].prefix(s.ord[o].ts[j])
}

// touch makes slot j the most recently used in order o.
func (s *stack) touch(o int, j int32) {
	or := &s.ord[o]
	if or.ts[j]+1 == or.clock {
		return // already on top
	}
	or.leave(j, s.size[j])
	s.stamp(o, j)
}

// setSize changes slot j's size.
func (s *stack) setSize(j int32, size int64) {
	for o := range s.ord {
		s.ord[o].add(s.ord[o].ts[j], size-s.size[j])
	}
	s.total += size - s.size[j]
	s.size[j] = size
}

// insert adds an object, kept in the sample while samp is under the
// threshold, on top of the order and returns its slot; -1 when full.
func (s *stack) insert(sp, samp uint64, id uint32, size int64) int32 {
	j := s.free
	if j < 0 {
		return -1
	}
	if n := s.ord[0].ts[j]; n == ^uint32(0) {
		s.free = -1
	} else {
		s.free = int32(n)
	}
	s.spat[j], s.id[j], s.size[j] = sp, id, size
	if samp != sp && s.samp == nil {
		s.samp = make([]uint64, len(s.spat))
		copy(s.samp, s.spat)
	}
	if s.samp != nil {
		s.samp[j] = samp
	}
	mask := uint64(len(s.index) - 1)
	h := sp & mask
	for s.index[h] != 0 {
		h = (h + 1) & mask
	}
	s.index[h] = j + 1
	s.total += size
	s.live++
	for o := range s.ord {
		s.stamp(o, j)
	}
	return j
}

// remove drops slot j.
func (s *stack) remove(j int32) {
	mask := uint64(len(s.index) - 1)
	h := s.spat[j] & mask
	for s.index[h] != j+1 {
		h = (h + 1) & mask
	}
	// Backward-shift deletion keeps every probe chain unbroken.
	s.index[h] = 0
	for i, k := h, (h+1)&mask; s.index[k] != 0; k = (k + 1) & mask {
		home := s.spat[s.index[k]-1] & mask
		// The entry at k stays unless its home lies cyclically in (i, k].
		if (i <= k && (home <= i || home > k)) || (i > k && home <= i && home > k) {
			s.index[i], s.index[k] = s.index[k], 0
			i = k
		}
	}
	for o := range s.ord {
		s.ord[o].leave(j, s.size[j])
	}
	s.total -= s.size[j]
	s.live--
	s.spat[j], s.id[j], s.size[j] = 0, 0, 0
	if s.samp != nil {
		s.samp[j] = 0
	}
	if s.free < 0 {
		s.ord[0].ts[j] = ^uint32(0)
	} else {
		s.ord[0].ts[j] = uint32(s.free)
	}
	s.free = j
}

// bottom returns the least recently used slot in order o, or -1 when
// empty.
func (s *stack) bottom(o int) int32 {
	or := &s.ord[o]
	for or.oldest < or.clock && or.rev[or.oldest] < 0 {
		or.oldest++
	}
	if or.oldest == or.clock {
		return -1
	}
	return or.rev[or.oldest]
}

// stamp gives slot j the next time in order o, renumbering first when
// none is left.
func (s *stack) stamp(o int, j int32) {
	or := &s.ord[o]
	if int(or.clock) == len(or.rev) {
		s.renumber(o)
	}
	t := or.clock
	or.clock++
	or.ts[j] = t
	or.rev[t] = j
	or.add(t, s.size[j])
}

// renumber packs order o's live times to 0..live-1, in order, and
// rebuilds its tree.
func (s *stack) renumber(o int) {
	or := &s.ord[o]
	n := uint32(0)
	for t := or.oldest; t < or.clock; t++ {
		if j := or.rev[t]; j >= 0 {
			or.rev[t] = -1
			or.rev[n] = j
			or.ts[j] = n
			n++
		}
	}
	clear(or.fen)
	for t := range n {
		or.fen[t] = s.size[or.rev[t]]
	}
	// Linear-time Fenwick build: each node adds itself to its parent.
	for i := 1; i <= len(or.fen); i++ {
		if p := i + i&-i; p <= len(or.fen) {
			or.fen[p-1] += or.fen[i-1]
		}
	}
	or.clock, or.oldest = n, 0
}

// leave takes slot j, of size bytes, off its time.
func (or *order) leave(j int32, size int64) {
	t := or.ts[j]
	or.add(t, -size)
	or.rev[t] = -1
}

// add adds v at time t in the tree.
func (or *order) add(t uint32, v int64) {
	for i := int(t) + 1; i <= len(or.fen); i += i & -i {
		or.fen[i-1] += v
	}
}

// prefix is the sum of the tree over times 0..t.
func (or *order) prefix(t uint32) int64 {
	var sum int64
	for i := int(t) + 1; i > 0; i -= i & -i {
		sum += or.fen[i-1]
	}
	return sum
}
