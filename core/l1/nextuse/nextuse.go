// Package nextuse is the prefix eviction policy's order: each object's
// last use and reuse gap on a logical clock, and two heaps of the
// evictable objects, by the time each is due back (latest first) and by
// the time it is late (earliest first). core/l1 runs it on the pool's
// leaves; core/whatif runs it on its sampled objects at every pool size
// it estimates, so the what-if plays the order the pool runs. It holds no
// objects: callers keep an Order per object and name objects by int32.
//
// The clock ticks once a request (Begin, End): the uses and stores of one
// lookup, store or touch share its tick, so a gap counts requests, not the
// chunks they carried. Counted in chunks, the gaps of conversations served
// in turn grow with every turn (each turn's prompts are longer), and a
// conversation would look late just before it comes back. A use learns a
// gap (the ticks between an object's last two uses, smoothed); an object
// without one is given its parent's (Inherit) or the mean (Clock.Prior).
// An object is due at its last use plus its gap, late half a gap after
// once the gap was measured (its own, or a parent's it was lent), at
// its due time on the mean. The victim is the object the longest late, if
// one is late; else the one due the latest (Belady's choice, as far as the
// gaps tell). A store that would have to evict a victim due back before
// its own chunks stores none of them (Admits), as Belady's MIN would not,
// and a new prompt does not evict a chunk used HotUses times until it is
// long late.
package nextuse

// Order is one object's place in the order.
type Order struct {
	Stamp     uint64 // last use, on the clock
	Gap       uint64 // reuse gap estimate in ticks; 0: none yet
	Due, Late int32  // places in the two heaps (-1: not there)
	Left      uint32 // the holder's evictions when this object left (core/whatif's ghosts)
	Measured  bool   // Gap comes from the object's own uses
	Unused    bool   // stored and not used since (Admits)
	Uses      uint8  // uses since its store, up to 255 (Admits)
}

// New is the order of an object stored at tick now, in no heap.
func New(now uint64) Order { return Order{Stamp: now, Due: -1, Late: -1} }

// Stored is New for an object a store brings in: unused until its first
// use.
func Stored(now uint64) Order {
	o := New(now)
	o.Unused = true
	return o
}

// InHeaps reports whether the object is in the heaps.
func (o *Order) InHeaps() bool { return o.Due >= 0 }

// Clock is the order's logical clock, which ticks once a request (at
// every use and store outside one), and the mean reuse gap.
type Clock struct {
	Now, MeanGap uint64
	// open says a request is open (Begin), ticked that it took its tick.
	open, ticked bool
}

// Begin opens a request: its uses and stores share one tick, taken at the
// first of them.
func (c *Clock) Begin() { c.open, c.ticked = true, false }

// End closes the request Begin opened.
func (c *Clock) End() { c.open = false }

// advance takes the tick of what is being done now.
func (c *Clock) advance() {
	if !c.open || !c.ticked {
		c.Now++
		c.ticked = true
	}
}

// Tick advances the clock and returns the new tick (a store's stamp).
func (c *Clock) Tick() uint64 {
	c.advance()
	return c.Now
}

// Use marks o as used now and learns its reuse gap; the caller refixes
// the heaps (Fix).
func (c *Clock) Use(o *Order) {
	c.advance()
	d := c.Now - o.Stamp
	if d == 0 {
		return // used twice in one request: one use
	}
	o.Unused = false
	if o.Uses < 255 {
		o.Uses++
	}
	if o.Measured {
		o.Gap = (o.Gap + d + 1) / 2
	} else {
		o.Gap, o.Measured = d, true
	}
	c.MeanGap = (7*c.MeanGap + d + 7) / 8
	o.Stamp = c.Now
}

// Refresh restamps o without taking the time since its last use for a
// reuse gap (a second touch of the same use).
func (c *Clock) Refresh(o *Order) {
	c.advance()
	o.Stamp = c.Now
}

// Prior is the gap an object without one is given: the mean, or one
// turnover of the objects before any reuse.
func (c *Clock) Prior(objects int) uint64 {
	if c.MeanGap > 0 {
		return c.MeanGap
	}
	return uint64(max(objects, 1))
}

// Inherit lends o its parent's gap when o has none: a conversation's new
// chunks come back when it does, as late as it may. A gap the parent
// measured is measured for o too: o is late when its conversation is
// (half a gap past due), not at its due time, which a conversation whose
// returns vary passes on about half its turns (chat with think time: its
// new chunks, late at once, went first and came back ~50 prompts later).
// It reports whether o changed.
func Inherit(o, parent *Order) bool {
	if o.Gap == 0 && parent.Gap > 0 {
		o.Gap, o.Measured = parent.Gap, parent.Measured
		return true
	}
	return false
}

// Branch gives o, a new object whose parent already goes on in another
// resident child, no gap at all: it is late from the next tick on, until
// its first use measures its own. A parent that branches is a prompt
// shared by others (a system prompt before its questions, the documents a
// RAG prompt puts first): its gap says how often the prefix comes back,
// not this continuation, which is most often asked once. Lent that gap,
// each one looked as hot as the prefix and pushed out prompts that come
// back (docs/BENCHMARKS.md). Its children inherit the lack of one.
func Branch(o *Order) { o.Gap, o.Measured = 1, false }

// HotUses is the uses since its store past which a chunk is hot: a new
// prompt may not evict it until it is long late (Admits).
const HotUses = 16

// hotLate is how many gaps past its late time a hot chunk must be before
// a new prompt may evict it: a prompt that was hot and stopped is let go.
const hotLate = 8

// Admits reports whether a store whose new objects would be due back at
// due may evict victim, the policy's next one, at tick now: always when
// the victim was never used since its store (content seen once never
// shuts out content seen once, however many came before); else, when the
// store is a new prompt (newPrompt: no chunk before its new ones to lend
// them a gap) and the victim is hot (HotUses), only once the victim is
// hotLate gaps past late; else when the victim is late, or due back no
// sooner than the new objects. Otherwise the store's chunks are the ones
// due the latest, and storing them evicts a chunk wanted before them:
// Belady's MIN does not store a chunk then (chat.OfflineHits), and a pool
// that does hands the deficit on (the conversation it evicted misses and
// evicts the next one's). A new prompt's due time is the mean gap, which
// says nothing of how often it comes back: a rare system prompt seen
// again pushed out a popular one (used every few requests) each time, as
// A0, the online bound under fixed popularities, never does
// (docs/BENCHMARKS.md).
func Admits(victim *Order, now, due uint64, newPrompt bool) bool {
	switch {
	case victim.Unused:
		return true
	case newPrompt && victim.Uses >= HotUses:
		return victim.LateAt()+hotLate*victim.Gap < now
	}
	return victim.LateAt() < now || victim.Stamp+victim.Gap >= due
}

// Resume is the gap of an object stored again after it was evicted, from
// its own history: last, its last use, and gap, its measured gap then (0:
// none). A chunk whose parent is used when it is not (the next document
// after a shared one in RAG, a system prompt's question, a scanned
// document's tail) would take the parent's gap and look as hot as the
// prompt it extends; its own history says how seldom it comes back. Its
// gap is the mean of the ticks since its last use and its old gap, as if
// it had been used now (Clock.Use).
//
// With strict (no gap to lend: the prompt was stored again from its
// start), the history counts only when this return came within half to
// twice the old gap: a memoryless return (random-order chat) says nothing
// of the next one, and a fully evicted conversation would otherwise take
// the long gap that got it evicted. It reports whether the history counts.
func Resume(now, last, gap uint64, strict bool) (uint64, bool) {
	d := max(now-min(last, now), 1)
	switch {
	case strict && (gap == 0 || d > 2*gap || 2*d < gap):
		return 0, false
	case gap == 0:
		return d, true
	}
	return (d + gap + 1) / 2, true
}

// LateAt is when o is late: half a gap past its due time once it has
// reuses of its own (gaps vary from one use to the next), at its due time
// on a lent gap, which an object stored once and never asked again (a
// question, a scan) does not earn.
func (o *Order) LateAt() uint64 {
	if !o.Measured {
		return o.Stamp + o.Gap
	}
	return o.Stamp + o.Gap + o.Gap/2
}

// before reports whether x comes out of the heap before y.
func before(late bool, x, y *Order) bool {
	if late {
		return x.LateAt() < y.LateAt()
	}
	if dx, dy := x.Stamp+x.Gap, y.Stamp+y.Gap; dx != dy {
		return dx > dy
	}
	return x.Stamp > y.Stamp // of two due together, the one used later
}

// Items gives the Order of each object the heaps hold.
type Items interface {
	Order(i int32) *Order
}

// Heaps are the evictable objects by due time and by late time.
type Heaps struct {
	due, late []int32
}

// Len is the number of objects in the heaps.
func (h *Heaps) Len() int { return len(h.due) }

// Reset empties the heaps (their objects' places are the caller's to
// clear).
func (h *Heaps) Reset() { h.due, h.late = h.due[:0], h.late[:0] }

// Victim is the next object to evict, -1 when the heaps are empty.
func Victim[I Items](h *Heaps, it I, now uint64) int32 {
	if len(h.late) == 0 {
		return -1
	}
	if i := h.late[0]; it.Order(i).LateAt() < now {
		return i
	}
	return h.due[0]
}

// Push puts object i in the heaps, giving it prior as its gap when it has
// none (the keys must not move while it is there).
func Push[I Items](h *Heaps, it I, i int32, prior uint64) {
	LendPrior(it.Order(i), prior)
	push(h, it, false, i)
	push(h, it, true, i)
}

// LendPrior gives o prior as its gap when it has none, as Push does.
func LendPrior(o *Order, prior uint64) {
	if o.Gap == 0 {
		o.Gap = prior
	}
}

// Build puts the objects is, none of them in the heaps yet and their gaps
// given (LendPrior), in the heaps at once: O(n) over the heaps, where a
// Push each is O(log n). For a pool adopting a table of 65,536 objects.
func Build[I Items](h *Heaps, it I, is []int32) {
	for _, i := range is {
		o := it.Order(i)
		o.Due, o.Late = int32(len(h.due)), int32(len(h.late))
		h.due, h.late = append(h.due, i), append(h.late, i)
	}
	for _, late := range []bool{false, true} {
		hp := *heapOf(h, late)
		for j := len(hp)/2 - 1; j >= 0; j-- {
			down(hp, it, late, j)
		}
	}
}

// Remove takes object i out of the heaps, if it is there.
func Remove[I Items](h *Heaps, it I, i int32) {
	if it.Order(i).Due < 0 {
		return
	}
	remove(h, it, false, i)
	remove(h, it, true, i)
}

// Fix restores the heaps after object i's keys changed.
func Fix[I Items](h *Heaps, it I, i int32) {
	if it.Order(i).Due < 0 {
		return
	}
	remove(h, it, false, i)
	remove(h, it, true, i)
	push(h, it, false, i)
	push(h, it, true, i)
}

// Check reports whether each heap holds its order and each object's
// place: for tests.
func Check[I Items](h *Heaps, it I) bool {
	for _, late := range []bool{false, true} {
		hp := *heapOf(h, late)
		for j, i := range hp {
			if *place(it.Order(i), late) != int32(j) {
				return false
			}
			if j > 0 && before(late, it.Order(i), it.Order(hp[(j-1)/2])) {
				return false
			}
		}
	}
	return true
}

func heapOf(h *Heaps, late bool) *[]int32 {
	if late {
		return &h.late
	}
	return &h.due
}

func place(o *Order, late bool) *int32 {
	if late {
		return &o.Late
	}
	return &o.Due
}

func push[I Items](h *Heaps, it I, late bool, i int32) {
	hp := heapOf(h, late)
	*place(it.Order(i), late) = int32(len(*hp))
	*hp = append(*hp, i)
	up(*hp, it, late, len(*hp)-1)
}

func swap[I Items](hp []int32, it I, late bool, a, b int) {
	hp[a], hp[b] = hp[b], hp[a]
	*place(it.Order(hp[a]), late) = int32(a)
	*place(it.Order(hp[b]), late) = int32(b)
}

func up[I Items](hp []int32, it I, late bool, j int) {
	for j > 0 {
		p := (j - 1) / 2
		if !before(late, it.Order(hp[j]), it.Order(hp[p])) {
			return
		}
		swap(hp, it, late, j, p)
		j = p
	}
}

func down[I Items](hp []int32, it I, late bool, j int) {
	n := len(hp)
	for {
		l := 2*j + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && before(late, it.Order(hp[r]), it.Order(hp[l])) {
			m = r
		}
		if !before(late, it.Order(hp[m]), it.Order(hp[j])) {
			return
		}
		swap(hp, it, late, j, m)
		j = m
	}
}

func remove[I Items](h *Heaps, it I, late bool, i int32) {
	hp := heapOf(h, late)
	j := int(*place(it.Order(i), late))
	last := len(*hp) - 1
	if j != last {
		swap(*hp, it, late, j, last)
	}
	*hp = (*hp)[:last]
	*place(it.Order(i), late) = -1
	if j != last {
		down(*hp, it, late, j)
		up(*hp, it, late, j)
	}
}

// Cap is the heaps' capacity in objects, for memory accounting.
func (h *Heaps) Cap() int { return cap(h.due) }

// Grow makes room for n objects in the heaps, so that pushes up to n
// allocate nothing.
func (h *Heaps) Grow(n int) {
	h.due = append(make([]int32, 0, n), h.due...)
	h.late = append(make([]int32, 0, n), h.late...)
}
