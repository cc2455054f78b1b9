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
// and group of the least recently used chunk together, since a chunk missing
// one of them is unreadable while the others would still hold their bytes;
// the next chunk stays whole.
func TestPrefixEvictionTakesTheWholeChunk(t *testing.T) {
	e := &evictions{}
	p, _ := newPool(t, 16, func(o *Options) { o.Policy, o.Observer = PolicyPrefix, e })
	old, young := chunkKeys(0), chunkKeys(1)
	store(t, p, old, 4096)
	store(t, p, young, 4096)
	p.mu.Lock()
	n := p.evictLeaf()
	p.mu.Unlock()
	if n != len(old) {
		t.Fatalf("one prefix eviction took %d objects, want the chunk's %d", n, len(old))
	}
	var want []string
	for _, k := range old {
		want = append(want, fmt.Sprintf("%s/%d", k, k.Group))
	}
	got := slices.Clone(e.got)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("evicted %v, want the old chunk %v", got, want)
	}
	if u := p.Unreadable(old); u != 1<<len(old)-1 {
		t.Fatalf("old chunk unreadable %04b, want all %d objects", u, len(old))
	}
	if u := p.Unreadable(young); u != 0 {
		t.Fatalf("young chunk unreadable %04b, want none", u)
	}
}
