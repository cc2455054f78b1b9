package l1

import "kvdock/core/l1/nextuse"

// Ghosts: the prefix policy's memory of the chunks it evicted. A chunk
// stored again takes its own history back (nextuse.Resume) instead of the
// gap its parent lends: the parent of a RAG document, a system prompt's
// question or a scanned document's tail is used far more often than the
// chunk, which would otherwise look as hot as the prompt it extends and
// push out prompts that come back (docs/BENCHMARKS.md).
//
// The table is direct-mapped by a hash of the record's identity, one entry
// per record slot rounded up to a power of two (so 24-48 bytes a record,
// bounded by the table, whatever a peer stores); an eviction overwrites
// the entry it maps to, and a store takes the entry it finds, so a ghost
// is remembered for about as many evictions as the pool holds records.

// ghost is one evicted chunk: its identity's hash (0: empty), its last
// use and its measured gap (0: none).
type ghost struct{ tag, stamp, gap uint64 }

// ghostTag is record i's hash in the ghosts (never 0).
func (t *table) ghostTag(i int32) uint64 {
	id := &t.recs[i].id
	var h uint64
	for _, b := range id.chunk[:8] {
		h = h<<8 | uint64(b)
	}
	h ^= (uint64(id.name)<<32 | uint64(id.rank)<<8 | uint64(id.group)) * 0x9e3779b97f4a7c15
	return h | 1
}

// bury remembers record i, evicted by the prefix policy.
func (t *table) bury(i int32) {
	if n := len(t.recs); len(t.ghosts) < n {
		c := 64
		for c < n {
			c *= 2
		}
		t.ghosts = make([]ghost, c) // the table grew: older ghosts go
	}
	o := &t.recs[i].ord
	tag := t.ghostTag(i)
	g := ghost{tag: tag, stamp: o.Stamp}
	if o.Measured {
		g.gap = o.Gap
	}
	t.ghosts[tag&uint64(len(t.ghosts)-1)] = g
}

// unbury takes the ghost of record i, a new record, if there is one.
func (t *table) unbury(i int32) (ghost, bool) {
	if len(t.ghosts) == 0 {
		return ghost{}, false
	}
	tag := t.ghostTag(i)
	g := &t.ghosts[tag&uint64(len(t.ghosts)-1)]
	if g.tag != tag {
		return ghost{}, false
	}
	found := *g
	*g = ghost{}
	return found, true
}

// resume gives record c, new and just linked under par, the gap of its
// own history when its ghost has one that counts (nextuse.Resume); it
// reports whether it did.
func (t *table) resume(c, par int32) bool {
	o := &t.recs[c].ord
	if o.Gap != 0 || o.InHeaps() {
		return false // not new
	}
	g, ok := t.unbury(c)
	if !ok {
		return false
	}
	gap, ok := nextuse.Resume(t.clk.Now, g.stamp, g.gap, t.recs[par].ord.Gap == 0)
	if ok {
		o.Gap, o.Measured = gap, true
	}
	return ok
}
