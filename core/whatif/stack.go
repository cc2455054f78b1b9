package whatif

// stack is the LRU stack of the sampled objects, with the sums SHARDS
// needs in O(log n): every use of an object gets the next time stamp, a
// Fenwick tree over time stamps holds each object's size at its last use,
// and so the bytes used since an object's last use are the total minus a
// prefix sum. A linear-probing index finds an object by its hash. Time
// stamps run over twice the slots; when they run out the live ones are
// renumbered in order (amortised O(1) a use).
//
// Memory is fixed by the slot count given to reset: slotBytes a slot.
type stack struct {
	// Per slot. A free slot has spat 0 and links the free list through ts.
	spat []uint64 // spatial hash (never 0 for a live slot)
	id   []uint32 // identity check among objects sharing spat
	size []int64  // bytes (0: looked up, never stored)
	ts   []uint32 // time of last use

	index []int32 // slot+1 by hash, 0 = empty; a power of two ≥ 2 slots
	fen   []int64 // Fenwick tree over times: size of the object last used then
	rev   []int32 // time → slot, -1 once that slot was used again or left

	free   int32  // first free slot, -1 for none
	live   int    // objects held
	clock  uint32 // next time stamp
	oldest uint32 // no live object was last used before it
	total  int64  // sum of the live sizes
}

// slotBytes is the most memory one slot takes: the per-slot fields, up to
// four index entries, and two times in the tree and the reverse map.
const slotBytes = 8 + 4 + 8 + 4 + 4*4 + 2*8 + 2*4

// reset empties the stack and sizes it for n objects.
func (s *stack) reset(n int) {
	n = max(n, 1)
	idx := 1
	for idx < 2*n {
		idx <<= 1
	}
	*s = stack{
		spat: make([]uint64, n), id: make([]uint32, n), size: make([]int64, n), ts: make([]uint32, n),
		index: make([]int32, idx), fen: make([]int64, 2*n), rev: make([]int32, 2*n),
	}
	for i := range s.ts {
		s.ts[i] = uint32(i + 1) // next free; n ends the list
	}
	s.ts[n-1] = ^uint32(0)
	s.free = 0
	for i := range s.rev {
		s.rev[i] = -1
	}
}

// slots is the stack's capacity in objects.
func (s *stack) slots() int { return len(s.spat) }

// memory is what the stack holds, in bytes.
func (s *stack) memory() int64 {
	return int64(cap(s.spat))*8 + int64(cap(s.id))*4 + int64(cap(s.size))*8 + int64(cap(s.ts))*4 +
		int64(cap(s.index))*4 + int64(cap(s.fen))*8 + int64(cap(s.rev))*4
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

// above is the bytes of the objects used since slot j's last use.
func (s *stack) above(j int32) int64 {
	return s.total - s.prefix(s.ts[j])
}

// touch makes slot j the most recently used.
func (s *stack) touch(j int32) {
	t := s.ts[j]
	if t+1 == s.clock {
		return // already on top
	}
	s.add(t, -s.size[j])
	s.rev[t] = -1
	s.stamp(j)
}

// setSize changes slot j's size.
func (s *stack) setSize(j int32, size int64) {
	s.add(s.ts[j], size-s.size[j])
	s.total += size - s.size[j]
	s.size[j] = size
}

// insert adds an object on top and returns its slot; -1 when full.
func (s *stack) insert(sp uint64, id uint32, size int64) int32 {
	j := s.free
	if j < 0 {
		return -1
	}
	if n := s.ts[j]; n == ^uint32(0) {
		s.free = -1
	} else {
		s.free = int32(n)
	}
	s.spat[j], s.id[j], s.size[j] = sp, id, size
	mask := uint64(len(s.index) - 1)
	h := sp & mask
	for s.index[h] != 0 {
		h = (h + 1) & mask
	}
	s.index[h] = j + 1
	s.total += size
	s.live++
	s.stamp(j)
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
	t := s.ts[j]
	s.add(t, -s.size[j])
	s.rev[t] = -1
	s.total -= s.size[j]
	s.live--
	s.spat[j], s.id[j], s.size[j] = 0, 0, 0
	if s.free < 0 {
		s.ts[j] = ^uint32(0)
	} else {
		s.ts[j] = uint32(s.free)
	}
	s.free = j
}

// bottom returns the least recently used slot, or -1 when empty.
func (s *stack) bottom() int32 {
	for s.oldest < s.clock && s.rev[s.oldest] < 0 {
		s.oldest++
	}
	if s.oldest == s.clock {
		return -1
	}
	return s.rev[s.oldest]
}

// stamp gives slot j the next time, renumbering first when none is left.
func (s *stack) stamp(j int32) {
	if int(s.clock) == len(s.rev) {
		s.renumber()
	}
	t := s.clock
	s.clock++
	s.ts[j] = t
	s.rev[t] = j
	s.add(t, s.size[j])
}

// renumber packs the live objects' times to 0..live-1, in order, and
// rebuilds the tree.
func (s *stack) renumber() {
	n := uint32(0)
	for t := s.oldest; t < s.clock; t++ {
		if j := s.rev[t]; j >= 0 {
			s.rev[t] = -1
			s.rev[n] = j
			s.ts[j] = n
			n++
		}
	}
	clear(s.fen)
	for t := range n {
		s.fen[t] = s.size[s.rev[t]]
	}
	// Linear-time Fenwick build: each node adds itself to its parent.
	for i := 1; i <= len(s.fen); i++ {
		if p := i + i&-i; p <= len(s.fen) {
			s.fen[p-1] += s.fen[i-1]
		}
	}
	s.clock, s.oldest = n, 0
}

// add adds v at time t in the tree.
func (s *stack) add(t uint32, v int64) {
	for i := int(t) + 1; i <= len(s.fen); i += i & -i {
		s.fen[i-1] += v
	}
}

// prefix is the sum of the tree over times 0..t.
func (s *stack) prefix(t uint32) int64 {
	var sum int64
	for i := int(t) + 1; i > 0; i -= i & -i {
		sum += s.fen[i-1]
	}
	return sum
}
