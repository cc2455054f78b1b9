package l1

import (
	"fmt"
	"slices"
	"testing"

	"kvdock/core/keys"
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
