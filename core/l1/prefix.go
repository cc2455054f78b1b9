package l1

import (
	"fmt"

	"kvdock/core/keys"
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
// children), the least recently used first: the heap holds every leaf that
// is published, unlocked and not doomed, by stamp (the time of its last
// use). A record's chunk has a record per rank and per KV group; peer rings
// them, and an eviction takes every one of them that is an evictable leaf,
// since a chunk missing one rank or group is a miss for all of them.
// Each step is O(log n) for the heap, O(children) for the links of a
// record that leaves, and O(ranks × groups) for its ring.

// maxPeerProbes bounds the index probes that find a new record's ring.
const maxPeerProbes = 16

// usable reports whether record i counts as usable.
func (t *table) usable(i int32) bool {
	r := &t.recs[i]
	return !r.doomed && (r.root || r.parent != nilRec)
}

// candidate reports whether record i belongs in the heap of evictable
// leaves.
func (t *table) candidate(i int32) bool {
	r := &t.recs[i]
	return r.state == stateReady && !r.doomed && !r.readLocked() && r.kid == nilRec
}

// reheap puts record i in the heap or takes it out, as its state says.
func (t *table) reheap(i int32) {
	in, want := t.recs[i].heap >= 0, t.candidate(i)
	switch {
	case want && !in:
		t.recs[i].heap = int32(len(t.heap))
		t.heap = append(t.heap, i)
		t.heapUp(int(t.recs[i].heap))
	case !want && in:
		t.heapRemove(i)
	}
}

// stampNow marks record i as used now.
func (t *table) stampNow(i int32) {
	t.clock++
	t.recs[i].stamp = t.clock
	if h := t.recs[i].heap; h >= 0 {
		t.heapDown(int(h)) // a newer stamp only moves it down
	}
}

func (t *table) heapLess(a, b int) bool {
	return t.recs[t.heap[a]].stamp < t.recs[t.heap[b]].stamp
}

func (t *table) heapSwap(a, b int) {
	t.heap[a], t.heap[b] = t.heap[b], t.heap[a]
	t.recs[t.heap[a]].heap = int32(a)
	t.recs[t.heap[b]].heap = int32(b)
}

func (t *table) heapUp(j int) {
	for j > 0 {
		p := (j - 1) / 2
		if !t.heapLess(j, p) {
			return
		}
		t.heapSwap(j, p)
		j = p
	}
}

func (t *table) heapDown(j int) {
	n := len(t.heap)
	for {
		l := 2*j + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && t.heapLess(r, l) {
			m = r
		}
		if !t.heapLess(m, j) {
			return
		}
		t.heapSwap(j, m)
		j = m
	}
}

func (t *table) heapRemove(i int32) {
	j := int(t.recs[i].heap)
	last := len(t.heap) - 1
	if j != last {
		t.heapSwap(j, last)
	}
	t.heap = t.heap[:last]
	t.recs[i].heap = -1
	if j != last {
		t.heapDown(j)
		t.heapUp(j)
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
	if r.heap >= 0 {
		t.heapRemove(i)
	}
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
// (chunk-major), the index of the key of the chunk before it with the same
// rank, group, model and salt, or -1. prev is the [start, end) of the
// previous chunk's keys and cur the start of the current chunk's.
func parentIn(ks []keys.ObjectKey, j, prevStart, prevEnd, cur int) int {
	if prevStart < 0 {
		return -1
	}
	same := func(a, b *keys.ObjectKey) bool {
		return a.KVRank == b.KVRank && a.Group == b.Group && a.Model == b.Model && a.Salt == b.Salt
	}
	if g := prevStart + j - cur; g < prevEnd && same(&ks[g], &ks[j]) {
		return g // the usual layout: every chunk has its keys in one order
	}
	for g := prevStart; g < prevEnd; g++ {
		if same(&ks[g], &ks[j]) {
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

// evictLeaf evicts the least recently used evictable leaf and the other
// evictable leaves of its chunk (ranks, groups); it returns how many
// objects it evicted, 0 when the heap is empty.
func (p *Pool) evictLeaf() int {
	if len(p.t.heap) == 0 {
		return 0
	}
	i := p.t.heap[0]
	n := 0
	for j := p.t.recs[i].peer; j != i; {
		next := p.t.recs[j].peer
		if p.t.recs[j].heap >= 0 {
			p.evict(j)
			n++
		}
		j = next
	}
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
// and its eviction order are the predecessor's (the records are adopted
// least recently used first, so their stamps keep their order). Links to
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
			drop(j, "parent %d is not an earlier chunk of the same rank, group, model and salt", q)
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
// line: another chunk, the same rank, group, model and salt.
func sameLine(a, b *keys.ObjectKey) bool {
	return a.Chunk != b.Chunk && a.KVRank == b.KVRank && a.Group == b.Group && a.Model == b.Model && a.Salt == b.Salt
}
