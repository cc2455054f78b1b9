package l1

import (
	"fmt"

	"kvdock/core/keys"
	"kvdock/core/l1/nextuse"
)

// The prefix tree. A LOOKUP serves only the leading run of a prompt's
// chunks, so a chunk is worth its bytes only while the chunk before it in
// its prompt is resident too. Stores see their keys in prompt order (the
// whole key range, keys already present included), so ReserveWrite links
// each chunk's record to the previous chunk's record of the same rank and
// group: its parent. Chunk digests chain (keys.Hasher), so a chunk has one
// parent whatever prompt stored it, and a first chunk is one for good.
//
// A record is usable when it is resident (not doomed) and starts a prompt
// (root) or its parent is resident. usableBytes follows every change of a
// link (link, untree), so the figure costs nothing to read.
//
// The prefix policy evicts leaves only (records without resident
// children), in the order of their next use as the table predicts it
// (package nextuse, which the what-if plays too): each record's last use
// and reuse gap on a clock that ticks once a request, the lookup, store or
// touch that uses it (ReserveReadPrefix, ReserveWrite and Touch each open
// one; a new record takes its parent's gap, a new prompt start the table's
// mean); the victim is the
// leaf the longest late, if any is late (a conversation that ended, a
// question never asked again), else the leaf due the latest. Recency alone evicts the conversation that comes back
// soonest when conversations return in turn (each is the least recently
// used when its turn comes), and a prefix pool that evicts it from its
// tail back passes a growing deficit to the next conversation, until every
// one misses in full (docs/BENCHMARKS.md); by gaps, the conversation just
// served is due the latest, so its tail goes and the others keep theirs.
// A store pins the chunks of its own prompt while it evicts (pinPrompt):
// the prompt it extends is the one just used, due the latest, and its tip
// is the parent the new chunks need to be usable.
//
// The heaps hold every leaf that is published, unlocked, not doomed and
// not pinned: one by due time (latest first), one by late time (earliest
// first). A record's chunk has a record per rank and per KV group; peer
// rings them, and an eviction takes every one of them that is an
// evictable leaf, since a chunk missing one rank or group is a miss for
// all of them. Each step is O(log n) for the heaps, O(children) for the
// links of a record that leaves, and O(ranks × groups) for its ring.

// maxPeerProbes bounds the index probes that find a new record's ring.
const maxPeerProbes = 16

// Order is the nextuse.Items of the table's records.
func (t *table) Order(i int32) *nextuse.Order { return &t.recs[i].ord }

// usable reports whether record i counts as usable.
func (t *table) usable(i int32) bool {
	r := &t.recs[i]
	return !r.doomed && (r.root || r.parent != nilRec)
}

// candidate reports whether record i belongs in the heaps of evictable
// leaves.
func (t *table) candidate(i int32) bool {
	r := &t.recs[i]
	return r.state == stateReady && !r.doomed && !r.readLocked() && r.kid == nilRec && !r.pinned
}

// reheap puts record i in the heaps or takes it out, as its state says.
func (t *table) reheap(i int32) {
	in, want := t.recs[i].ord.InHeaps(), t.candidate(i)
	switch {
	case want && !in:
		nextuse.Push(&t.heaps, t, i, t.clk.Prior(t.len()))
	case !want && in:
		nextuse.Remove(&t.heaps, t, i)
	}
}

// stampNow marks record i as used now and learns its reuse gap.
func (t *table) stampNow(i int32) {
	t.clk.Use(&t.recs[i].ord)
	nextuse.Fix(&t.heaps, t, i)
}

// refresh moves record i to the MRU end and restamps it without taking
// the time since its last use for a reuse gap: END_SESSION touches the
// prompt its LOOKUP just used (Touch), which is the same use.
func (t *table) refresh(i int32) {
	t.clk.Refresh(&t.recs[i].ord)
	nextuse.Fix(&t.heaps, t, i)
	if t.mru != i {
		t.unlink(i)
		t.pushMRU(i)
	}
}

// inherit lends the new record c its parent's reuse gap: a conversation's
// new chunks come back when it does; a chunk the policy evicted before
// takes its own history back instead (ghost.go), and one that branches
// off a parent with another resident child takes none (nextuse.Branch).
func (t *table) inherit(c, par int32) {
	o := &t.recs[c].ord
	switch {
	case t.resume(c, par):
	case o.Gap == 0 && !o.InHeaps() && t.recs[c].sibNext != nilRec: // link put c first of par's children
		nextuse.Branch(o)
	case !nextuse.Inherit(o, &t.recs[par].ord):
		return
	}
	nextuse.Fix(&t.heaps, t, c)
}

// victim is the prefix policy's next leaf to evict, nilRec when none.
func (t *table) victim() int32 {
	if i := nextuse.Victim(&t.heaps, t, t.clk.Now); i >= 0 {
		return i
	}
	return nilRec
}

// pinPrompt pins (on) or unpins the resident records of prev and ks, the
// prompt of a store, while the store evicts: the prompt just looked up is
// the one due the latest, and its tip is the new chunks' parent.
func (p *Pool) pinPrompt(prev, ks []keys.ObjectKey, on bool) {
	for _, run := range [2][]keys.ObjectKey{prev, ks} {
		for _, k := range run {
			if i := p.t.find(k); i != nilRec && !p.t.recs[i].doomed && p.t.recs[i].pinned != on {
				p.t.recs[i].pinned = on
				p.t.reheap(i)
			}
		}
	}
}

// link makes record par the parent of record c (both resident, not
// doomed); a record that already has a parent keeps it.
func (p *Pool) link(c, par int32) {
	t := &p.t
	r := &t.recs[c]
	if r.parent != nilRec || c == par {
		return
	}
	if !t.usable(c) {
		t.usableBytes += p.rounded(c)
	}
	r.parent = par
	r.root = false
	r.sibPrev, r.sibNext = nilRec, t.recs[par].kid
	if r.sibNext != nilRec {
		t.recs[r.sibNext].sibPrev = c
	}
	t.recs[par].kid = c
	t.reheap(par) // no longer a leaf
	t.inherit(c, par)
}

// untree takes record i out of the tree, its ring and the heap, as it
// leaves (dropped or doomed): its children lose their parent, and its
// parent may become a leaf.
func (p *Pool) untree(i int32) {
	t := &p.t
	r := &t.recs[i]
	if t.usable(i) {
		t.usableBytes -= p.rounded(i)
	}
	if par := r.parent; par != nilRec {
		if r.sibPrev != nilRec {
			t.recs[r.sibPrev].sibNext = r.sibNext
		} else {
			t.recs[par].kid = r.sibNext
		}
		if r.sibNext != nilRec {
			t.recs[r.sibNext].sibPrev = r.sibPrev
		}
		r.parent, r.sibPrev, r.sibNext = nilRec, nilRec, nilRec
		t.reheap(par)
	}
	for c := r.kid; c != nilRec; {
		cr := &t.recs[c]
		next := cr.sibNext
		if !cr.doomed {
			t.usableBytes -= p.rounded(c) // it was usable: its parent was resident
		}
		cr.parent, cr.sibPrev, cr.sibNext = nilRec, nilRec, nilRec
		c = next
	}
	r.kid = nilRec
	r.root = false
	// Leave the ring: find the predecessor (rings are a chunk's ranks and
	// groups, a handful of records).
	if r.peer != i {
		j := r.peer
		for t.recs[j].peer != i {
			j = t.recs[j].peer
		}
		t.recs[j].peer = r.peer
		r.peer = i
	}
	nextuse.Remove(&t.heaps, t, i)
}

// joinRing puts the new record i in the ring of a resident record of the
// same chunk (other ranks of its world size in its group, then its rank in
// the first groups), within maxPeerProbes probes of the index.
func (p *Pool) joinRing(i int32) {
	t := &p.t
	id := t.recs[i].id
	ws := rankWorldSize(id.rank)
	probes := 0
	try := func(rank, group uint32) bool {
		if probes++; probes > maxPeerProbes || (rank == id.rank && group == id.group) {
			return false
		}
		j := t.index.find(t.recs, &ident{id.chunk, id.name, rank, group})
		if j == nilRec || t.recs[j].doomed {
			return false
		}
		t.recs[i].peer = t.recs[j].peer
		t.recs[j].peer = i
		return true
	}
	for w := range ws {
		if try(keys.KVRank(int(ws), int(w)), id.group) {
			return
		}
	}
	for g := range uint32(4) {
		if try(id.rank, g) {
			return
		}
	}
}

// parentIn returns, for key j of a run of keys in prompt order
// (chunk-major), the index of the key of the chunk before it on the same
// line (sameLine: rank, group, model, salt and layout), or -1. prev is the
// [start, end) of the previous chunk's keys and cur the start of the
// current chunk's.
func parentIn(ks []keys.ObjectKey, j, prevStart, prevEnd, cur int) int {
	if prevStart < 0 {
		return -1
	}
	if g := prevStart + j - cur; g < prevEnd && sameLine(&ks[g], &ks[j]) {
		return g // the usual layout: every chunk has its keys in one order
	}
	for g := prevStart; g < prevEnd; g++ {
		if sameLine(&ks[g], &ks[j]) {
			return g
		}
	}
	return -1
}

// chain links the records of ks, keys of consecutive chunks of one prompt
// in order, each to the previous chunk's record; with first, the records
// of ks's first chunk start the prompt. Absent and doomed keys are skipped
// (a gap: the chunk after it has no resident parent).
func (p *Pool) chain(ks []keys.ObjectKey, first bool) {
	prevStart, prevEnd, cur := -1, -1, 0
	var recs []int32
	if len(ks) <= smallBatch {
		var buf [smallBatch]int32
		recs = buf[:len(ks)]
	} else {
		recs = make([]int32, len(ks))
	}
	for j := range ks {
		if j > 0 && (ks[j].Chunk != ks[j-1].Chunk || ks[j].Model != ks[j-1].Model || ks[j].Salt != ks[j-1].Salt) {
			prevStart, prevEnd, cur = cur, j, j
		}
		i := p.t.find(ks[j])
		if i != nilRec && p.t.recs[i].doomed {
			i = nilRec
		}
		recs[j] = i
		if i == nilRec {
			continue
		}
		if prevStart < 0 {
			if first && !p.t.recs[i].root && p.t.recs[i].parent == nilRec {
				p.t.recs[i].root = true
				p.t.usableBytes += p.rounded(i)
			}
			continue
		}
		if g := parentIn(ks, j, prevStart, prevEnd, cur); g >= 0 && recs[g] != nilRec {
			p.link(i, recs[g])
		}
	}
}

// chainAfter chains ks, a store's keys in prompt order: from the prompt's
// start when prev is empty, else after prev, the keys of the chunk before
// ks's first, which is then no prompt start.
func (p *Pool) chainAfter(prev, ks []keys.ObjectKey) {
	if len(prev) == 0 {
		p.chain(ks, true)
		return
	}
	p.chain(append(prev[:len(prev):len(prev)], ks...), false)
}

// evictLeaf evicts the policy's victim and the other evictable leaves of
// its chunk (ranks, groups); it returns how many objects it evicted, 0
// when no leaf is evictable.
func (p *Pool) evictLeaf() int {
	i := p.t.victim()
	if i == nilRec {
		return 0
	}
	n := 0
	for j := p.t.recs[i].peer; j != i; {
		next := p.t.recs[j].peer
		if p.t.recs[j].ord.InHeaps() {
			p.t.bury(j)
			p.evict(j)
			n++
		}
		j = next
	}
	p.t.bury(i)
	p.evict(i)
	return n + 1
}

// evict drops record i for the policy, telling the observer.
func (p *Pool) evict(i int32) {
	p.lost(i, LossEvicted)
	p.drop(i)
	p.st.Evictions++
}

// The tree across a restart (adopt.go). Keep records, for each published
// object, its parent's place in the kept table and whether it starts a
// prompt; Adopt links the records again, so the successor's usable bytes
// are the predecessor's, and gives each its kept place in the order (age,
// gap), so its evictions are too. Links to
// or from held objects are not kept: a held object is never readable in
// the successor, as it is not here once doomed.
//
// The kept table is outside input: a link is restored only when it names
// another published object of the table, adopted, of the same rank, group,
// model and salt and of another chunk, and the links form no cycle (a
// cycle would make its records nobody's leaf, never evictable). Any other
// link is dropped, its object adopted unlinked, with the reason. What a
// record cannot prove (that a parent's digest chains to its child's) costs
// at most an object's place in the eviction order, never a byte served:
// reads go by key.

// maxKeptTicks bounds the ages and gaps a kept table may give: outside
// input, whose sums must not wrap the clock (a bad one costs an object's
// place in the order, never a byte served).
const maxKeptTicks = 1 << 48

// exportOrder fills the order of objs, the kept objects of the records
// recs, and returns the mean gap; p.mu is held.
func (p *Pool) exportOrder(objs []KeptObject, recs []int32) uint64 {
	for j, i := range recs {
		o := &p.t.recs[i].ord
		objs[j].Age, objs[j].Gap, objs[j].Measured = p.t.clk.Now-o.Stamp, o.Gap, o.Measured
	}
	return p.t.clk.MeanGap
}

// orderBase returns the tick the ages of k count back from, past the
// stamps the adoption of its objects gives (the clock is set to it once
// they are adopted, so each kept age is its age again).
func (t *table) orderBase(k Kept) uint64 {
	var oldest uint64
	for _, o := range k.Objects {
		oldest = max(oldest, min(o.Age, maxKeptTicks))
	}
	t.clk.MeanGap = min(k.MeanGap, maxKeptTicks)
	return t.clk.Now + uint64(len(k.Objects)) + oldest + 1
}

// adoptOrder gives the adopted record i the order o kept; a kept object
// with none keeps the stamp its adoption gave it (the table's order).
func (t *table) adoptOrder(i int32, o KeptObject, base uint64) {
	if o.Age == 0 && o.Gap == 0 {
		return
	}
	r := &t.recs[i].ord
	r.Stamp = base - min(o.Age, maxKeptTicks)
	r.Gap, r.Measured = min(o.Gap, maxKeptTicks), o.Measured && o.Gap > 0
}

// exportLinks fills the prompt links of objs, the kept objects of the
// records recs (objs[j] is record recs[j]); p.mu is held.
func (p *Pool) exportLinks(objs []KeptObject, recs []int32) {
	at := make([]int32, len(p.t.recs)) // 1 + a published record's place in objs
	for j, i := range recs {
		if !objs[j].Held {
			at[i] = int32(j + 1)
		}
	}
	for j, i := range recs {
		r := &p.t.recs[i]
		switch {
		case objs[j].Held:
		case r.root:
			objs[j].Root = true
		case r.parent != nilRec && at[r.parent] != 0:
			objs[j].Parent = int(at[r.parent])
		}
	}
}

// restoreLinks links the adopted records of objs as their prompt links
// say, after checking each link; p.mu is held and every object is adopted.
func (p *Pool) restoreLinks(objs []KeptObject, ad *Adopted) {
	n := len(objs)
	drop := func(j int, format string, args ...any) {
		ad.LinksDropped++
		if ad.LinkDropReason == "" {
			ad.LinkDropReason = fmt.Sprintf("object %d (%s): %s", j, objs[j].Key, fmt.Sprintf(format, args...))
		}
	}
	// The record of each published object (nilRec: none, or not this one).
	rec := make([]int32, n)
	for j, o := range objs {
		rec[j] = nilRec
		if o.Held {
			continue
		}
		if i := p.t.find(o.Key); i != nilRec && !p.t.recs[i].doomed && p.t.recs[i].off == o.Offset {
			rec[j] = i
		}
	}
	par := make([]int32, n) // each object's checked parent, -1 for none
	for j, o := range objs {
		par[j] = -1
		if o.Parent == 0 && !o.Root {
			continue
		}
		q := o.Parent - 1
		switch {
		case rec[j] == nilRec:
			drop(j, "a prompt link on an object that is not published")
		case o.Root && o.Parent != 0:
			drop(j, "recorded both as a prompt start and with a parent")
		case o.Root:
		case q < 0 || q >= n:
			drop(j, "parent %d outside the %d objects", q, n)
		case q == j:
			drop(j, "its own parent")
		case rec[q] == nilRec:
			drop(j, "parent %d is not a published object", q)
		case !sameLine(&objs[q].Key, &o.Key):
			drop(j, "parent %d is not an earlier chunk of the same rank, group, model, salt and layout", q)
		default:
			par[j] = int32(q)
		}
	}
	// Break cycles: walk each object's chain of parents once; a walk that
	// meets its own path closes a cycle, whose last link goes.
	const (
		unseen uint8 = iota
		onPath
		done
	)
	state := make([]uint8, n)
	var path []int32
	for s := range n {
		path = path[:0]
		v := int32(s)
		for v >= 0 && state[v] == unseen {
			state[v] = onPath
			path = append(path, v)
			v = par[v]
		}
		if v >= 0 && state[v] == onPath {
			last := path[len(path)-1]
			drop(int(last), "its links form a cycle")
			par[last] = -1
		}
		for _, u := range path {
			state[u] = done
		}
	}
	for j, o := range objs {
		i := rec[j]
		switch {
		case i == nilRec:
		case par[j] >= 0:
			p.link(i, rec[par[j]])
			ad.Links++
		case o.Root && o.Parent == 0:
			if r := &p.t.recs[i]; !r.root && r.parent == nilRec {
				r.root = true
				p.t.usableBytes += p.rounded(i)
				ad.Roots++
			}
		}
	}
}

// sameLine reports whether a and b are keys of two chunks of one prompt
// line: another chunk, the same rank, group, model, salt and layout.
func sameLine(a, b *keys.ObjectKey) bool {
	return a.Chunk != b.Chunk && a.KVRank == b.KVRank && a.Group == b.Group && a.Model == b.Model && a.Salt == b.Salt &&
		a.Layout == b.Layout
}
