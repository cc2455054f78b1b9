package l1

import (
	"fmt"
	"slices"
	"testing"

	"kvdock/core/keys"
	"kvdock/core/testkit/fakeclock"
)

// chunkKeys is chunk i as a world of two ranks in two KV groups: four
// objects that only serve a read together.
func chunkKeys(i int) []keys.ObjectKey {
	var ks []keys.ObjectKey
	for g := range uint32(2) {
		for w := range 2 {
			k := key(i)
			k.KVRank, k.Group = keys.KVRank(2, w), g
			ks = append(ks, k)
		}
	}
	return ks
}

// TestPrefixEvictionTakesTheWholeChunk: a prefix eviction takes every rank
// and group of its victim's chunk together, since a chunk missing one of
// them is unreadable while the others would still hold their bytes; the
// other chunk stays whole.
func TestPrefixEvictionTakesTheWholeChunk(t *testing.T) {
	e := &evictions{}
	p, _ := newPool(t, 16, func(o *Options) { o.Policy, o.Observer = PolicyPrefix, e })
	chunks := [2][]keys.ObjectKey{chunkKeys(0), chunkKeys(1)}
	store(t, p, chunks[0], 4096)
	store(t, p, chunks[1], 4096)
	p.mu.Lock()
	n := p.evictLeaf()
	p.mu.Unlock()
	if n != len(chunks[0]) {
		t.Fatalf("one prefix eviction took %d objects, want the chunk's %d", n, len(chunks[0]))
	}
	got := slices.Clone(e.got)
	slices.Sort(got)
	gone := -1
	for c, ks := range chunks {
		var want []string
		for _, k := range ks {
			want = append(want, fmt.Sprintf("%s/%d", k, k.Group))
		}
		slices.Sort(want)
		if slices.Equal(got, want) {
			gone = c
		}
	}
	if gone < 0 {
		t.Fatalf("evicted %v, want one whole chunk", got)
	}
	if u := p.Unreadable(chunks[gone]); u != 1<<len(chunks[gone])-1 {
		t.Fatalf("evicted chunk unreadable %04b, want all %d objects", u, len(chunks[gone]))
	}
	if u := p.Unreadable(chunks[1-gone]); u != 0 {
		t.Fatalf("the other chunk unreadable %04b, want none", u)
	}
}

// TestAdoptedChunkIsEvictedWhole: an adoption puts a chunk's ranks and
// groups back in one ring (the adoption skips the ring probes only for a
// table of one rank and one group), so a prefix eviction after a restart
// still takes the whole chunk. A one-rank table beside it is adopted too.
func TestAdoptedChunkIsEvictedWhole(t *testing.T) {
	dir := testShmDir(t)
	opts := sharedPool(t, dir, 16, fakeclock.New())
	opts.Policy = PolicyPrefix
	chunks := [2][]keys.ObjectKey{chunkKeys(0), chunkKeys(1)}
	k := keepPool(t, opts, func(p *Pool) {
		store(t, p, chunks[0], 4096)
		store(t, p, chunks[1], 4096)
	})
	e := &evictions{}
	opts.Observer = e
	q, ad := adoptOK(t, opts, k)
	if ad.Objects != 8 {
		t.Fatalf("adopted %d objects, want 8", ad.Objects)
	}
	q.mu.Lock()
	n := q.evictLeaf()
	q.mu.Unlock()
	if n != len(chunks[0]) {
		t.Fatalf("one prefix eviction after the adoption took %d objects (%v), want the chunk's %d", n, e.got, len(chunks[0]))
	}
	if u0, u1 := q.Unreadable(chunks[0]), q.Unreadable(chunks[1]); !(u0 == 0b1111 && u1 == 0) && !(u0 == 0 && u1 == 0b1111) {
		t.Fatalf("unreadable after one eviction: %04b and %04b, want one whole chunk gone", u0, u1)
	}
}
