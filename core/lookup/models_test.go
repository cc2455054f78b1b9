package lookup

import (
	"fmt"
	"testing"

	"kvdock/core/keys"
)

func TestModelStatsPerModelAndWorldSize(t *testing.T) {
	f := newFixture(t, Options{})
	ts := tokens(4 * cs)
	ks := keysOf(t, ts, 1)
	f.store.present[ks[0]] = true
	f.store.present[ks[1]] = true
	for i := range 3 {
		f.lookup(t, fmt.Sprint("a", i), ts, 1)
	}
	f.lookup(t, "b", ts, 2)
	// Not counted apart: no layout (an early exit), and a prompt under a chunk.
	_ = f.m.Lookup(keys.KeyRequest{RequestID: "x", Model: "other", WorldSize: 1, Tokens: ts}, 1)
	_ = f.m.Lookup(lookupReq("short", ts[:cs-1], 1), 1)

	got := f.m.ModelStats()
	want := []ModelStats{
		{Model: "m", WorldSize: 1, Lookups: 3, RequestedChunks: 12, HitChunks: 6, HitTokens: 6 * cs},
		{Model: "m", WorldSize: 2, Lookups: 1, RequestedChunks: 4, HitChunks: 0, HitTokens: 0},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("models\n got %+v\nwant %+v", got, want)
	}
}

func TestGroupsBounded(t *testing.T) {
	m := &Module{}
	for i := range maxModels + 50 {
		m.models.add(fmt.Sprint("model-", i), 1, 1, 2, 1, cs)
	}
	if n := len(m.ModelStats()); n != maxModels {
		t.Fatalf("%d models kept, want the bound %d", n, maxModels)
	}
	// A known group still counts when the table is full.
	m.models.add("model-0", 1, 1, 2, 2, cs)
	if s := m.ModelStats(); s[0].Model != "model-0" || s[0].Lookups != 2 || s[0].HitChunks != 3 {
		t.Fatalf("model-0 after the table filled: %+v", s[0])
	}
}

// TestModelStatsCountTierHits: chunks a tier phase loads count as hits of
// the group, as they do in the totals (the worker reads them from L1).
func TestModelStatsCountTierHits(t *testing.T) {
	f, store, ft := newTierFixture(t)
	ts := tokens(5 * cs)
	ks := keysOf(t, ts, 1)
	store.present[ks[0]] = true
	for _, k := range ks[1:4] {
		ft.held[k] = true
	}
	f.lookup(t, "r", ts, 1)
	<-ft.calls
	close(ft.release)
	f.m.Stop() // waits for the tier phase
	g := f.m.ModelStats()
	st := f.m.Stats()
	if len(g) != 1 || g[0].Lookups != 1 || g[0].RequestedChunks != 5 || g[0].HitChunks != 4 || g[0].HitTokens != 4*cs {
		t.Fatalf("group %+v, want 1 lookup, 5 asked, 4 hit (1 L1 + 3 tier)", g)
	}
	if g[0].HitChunks != st.HitChunks || g[0].HitTokens != st.HitTokens {
		t.Fatalf("group hits %d/%d differ from the totals %d/%d", g[0].HitChunks, g[0].HitTokens, st.HitChunks, st.HitTokens)
	}
}
