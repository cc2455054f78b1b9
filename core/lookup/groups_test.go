package lookup

import (
	"testing"

	"kvdock/core/keys"
	"kvdock/core/testkit/fakeclock"
)

type groupCounts map[string]int

func (g groupCounts) Registered(model string, ws int) ([]uint64, []int) {
	if n := g[model]; n > 0 {
		return []uint64{0}, []int{n}
	}
	return nil, nil
}

// TestLookupHybridGroups: for a model registered with two KV groups a chunk
// hits only when both groups' objects are there (a store whose second
// group never arrived is not served), the hit prefix is locked on every
// group, the locks of a partial chunk are released, and FREE_LOOKUP_LOCKS
// and END_SESSION reach every group too.
func TestLookupHybridGroups(t *testing.T) {
	h, err := keys.NewHasher(cs, "blake3")
	if err != nil {
		t.Fatal(err)
	}
	clk := fakeclock.New()
	s := keys.NewSessions(h, 0, clk.Now)
	store := newStore()
	m := New(s, store, groupCounts{"m": 2}, Options{Now: clk.Now})

	ts := tokens(3 * cs)
	g0 := keysOf(t, ts, 1)
	g1 := keys.InGroup(g0, 1)
	// Chunks 0 and 1 complete; chunk 2 has group 0 only.
	for _, k := range []keys.ObjectKey{g0[0], g1[0], g0[1], g1[1], g0[2]} {
		store.present[k] = true
	}
	if err := m.Lookup(lookupReq("r", ts, 1), 1); err != nil {
		t.Fatal(err)
	}
	if n, _ := m.QueryHits("r"); n != 2 {
		t.Fatalf("hits = %d, want 2 (chunk 2 lacks group 1)", n)
	}
	for i, k := range []keys.ObjectKey{g0[0], g1[0], g0[1], g1[1]} {
		if store.lockOf(k) != 1 {
			t.Errorf("hit key %d holds %d locks", i, store.lockOf(k))
		}
	}
	if store.lockOf(g0[2]) != 0 {
		t.Error("group 0 of a half-stored chunk kept its lock")
	}
	// A group 1 object alone under group 0's name would alias: keys differ.
	if g0[0] == g1[0] {
		t.Fatal("groups share a key")
	}
	w := 0
	if err := m.FreeLocks(keys.KeyRequest{RequestID: "r", Model: "m", WorldSize: 1, Worker: &w, Tokens: ts, Start: 0, End: 2 * cs}, 1); err != nil {
		t.Fatal(err)
	}
	if store.lockOf(g1[1]) != 0 || store.lockOf(g0[1]) != 0 {
		t.Error("FREE_LOOKUP_LOCKS left a group's lock")
	}
}

// TestLookupHybridAcrossBatches: with KV groups a batch holds fewer chunks
// (as many keys as a plain batch); a prefix longer than several batches is
// still counted whole, and stops at the first chunk missing a group.
func TestLookupHybridAcrossBatches(t *testing.T) {
	for _, groups := range []int{2, 3, 16} {
		h, err := keys.NewHasher(cs, "blake3")
		if err != nil {
			t.Fatal(err)
		}
		clk := fakeclock.New()
		store := newStore()
		m := New(keys.NewSessions(h, 0, clk.Now), store, groupCounts{"m": groups}, Options{Now: clk.Now})
		const chunks = 100
		ts := tokens(chunks * cs)
		g0 := keysOf(t, ts, 1)
		missing := 70 // chunk 70 lacks its last group
		for c := range chunks {
			for g := range groups {
				if c == missing && g == groups-1 {
					continue
				}
				store.present[keys.InGroup(g0[c:c+1], uint32(g))[0]] = true
			}
		}
		if err := m.Lookup(lookupReq("r", ts, 1), 1); err != nil {
			t.Fatal(err)
		}
		if n, _ := m.QueryHits("r"); n != missing {
			t.Errorf("%d groups: hits = %d, want %d", groups, n, missing)
		}
		if chunkBatch(keys.KeySet{}.WithGroups(groups))*groups > lockBatch {
			t.Errorf("%d groups: a batch of %d chunks holds more keys than a plain one", groups, chunkBatch(keys.KeySet{}.WithGroups(groups)))
		}
	}
}
