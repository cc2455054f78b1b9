package tier_test

import (
	"bytes"
	"context"
	"testing"

	"kvdock/core/keys"
	"kvdock/core/layout"
	"kvdock/transfer/tier"
	"kvdock/transfer/tier/memtier"
)

// TestPrefetchHybridGroups: a hybrid model's chunk is loaded group by group,
// each value named and verified under its own group's layout; a chunk whose
// second group is missing from the tier is not loaded (not a hit).
func TestPrefetchHybridGroups(t *testing.T) {
	lay0 := testLayout(t)
	lay1, err := layout.New(1, 4, 16, "float32", false) // 2*1*4*16*4 = 512 bytes
	if err != nil {
		t.Fatal(err)
	}
	reg := layout.NewRegistry()
	id, err := reg.AddGroups("org/model:v1", 1, []layout.Layout{lay0, lay1})
	if err != nil {
		t.Fatal(err)
	}
	p := openPool(t, 1<<20)
	mt := memtier.New()
	s := tier.NewSet([]tier.Backend{mt}, p, reg, tier.Options{})
	runSet(t, s)

	put := func(k keys.ObjectKey, lay layout.Layout, seed int) {
		v, err := tier.Encode(tier.Key(k, lay), lay, payload(int(lay.Bytes), seed))
		if err != nil {
			t.Fatal(err)
		}
		mt.Set(tier.Key(k, lay), v)
	}
	var ks []keys.ObjectKey
	for c := range 2 {
		k0 := testKey(c)
		k0.Layout = id // the keys a lookup of the model builds
		k1 := k0
		k1.Group = 1
		put(k0, lay0, 10*c)
		if c == 0 {
			put(k1, lay1, 10*c+1) // chunk 1 lacks group 1
		}
		ks = append(ks, k0, k1)
	}
	if n := s.Prefetch(context.Background(), "org/model:v1", 1, ks, 2, 1); n != 1 {
		t.Fatalf("prefetched %d chunks, want 1 (chunk 1 has no group 1)", n)
	}
	if got := read(t, p, ks[0]); !bytes.Equal(got, payload(int(lay0.Bytes), 0)) {
		t.Fatal("group 0 bytes differ")
	}
	if got := read(t, p, ks[1]); !bytes.Equal(got, payload(int(lay1.Bytes), 1)) {
		t.Fatal("group 1 bytes differ")
	}
}
