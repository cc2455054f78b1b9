package l1

import (
	"testing"

	"kvdock/core/keys"
)

// ghostPrompt is the keys of a prompt made of the first chunk of each of
// docs, in order.
func ghostPrompt(h *keys.Hasher, docs ...uint64) []keys.ObjectKey {
	var tokens []uint32
	for _, d := range docs {
		tokens = append(tokens, chunkTokens(d, 0)...)
	}
	return keys.ObjectKeys(h.Hashes(tokens), "m", 1, nil, "")
}

// TestEvictedChunkTakesItsOwnGap: a chunk the prefix policy evicted and a
// store brings back after its parent takes its own history (the ticks
// since its last use), not the parent's gap, which a chunk seen for the
// first time takes when it extends the prompt's tip, and none when it
// branches off beside another. A question under a system prompt used
// every request would otherwise look as hot as the prompt.
func TestEvictedChunkTakesItsOwnGap(t *testing.T) {
	p, h := replayPool(t, 8*accAlign, PolicyPrefix, nil)
	defer p.Close()
	store := func(prev, ks []keys.ObjectKey) {
		t.Helper()
		res, err := p.ReserveWriteAfter(InstanceOwner(1), prev, ks, accAlign)
		if err != nil || !p.FinishWrite(res) {
			t.Fatalf("store of %d chunks: %v", len(ks), err)
		}
	}
	look := func(ks []keys.ObjectKey) int {
		n := p.ReserveReadPrefix(ks, 1)
		p.FinishRead(ks[:n], 1)
		return n
	}
	sys := ghostPrompt(h, 1)
	q := ghostPrompt(h, 1, 2) // the system prompt and a question
	store(nil, sys)
	for range 4 {
		look(sys) // the system prompt, used every request
	}
	store(sys, q[1:])
	for doc := uint64(100); p.t.find(q[1]) != nilRec; doc++ { // other prompts push the question out
		if doc == 200 {
			t.Fatal("100 other prompts did not push the question out")
		}
		store(nil, ghostPrompt(h, doc))
		look(sys)
	}
	for range 50 {
		look(sys)
	}
	store(sys, q[1:]) // the question again
	sysOrd := p.t.recs[p.t.find(sys[0])].ord
	qOrd := p.t.recs[p.t.find(q[1])].ord
	// Its own: the mean of the 50+ ticks since its last use and the gap
	// it had when it left.
	if !qOrd.Measured || qOrd.Gap < 25 {
		t.Errorf("the question stored again has gap %d (measured %v), want its own, ≥ 25 ticks", qOrd.Gap, qOrd.Measured)
	}
	if sysOrd.Gap > 4 {
		t.Fatalf("the system prompt's gap is %d ticks, want a few", sysOrd.Gap)
	}
	// A question never seen before branches off the system prompt, which
	// goes on in the first question still: it takes none of the prompt's
	// gap and is late from the next request on (nextuse.Branch).
	q2 := ghostPrompt(h, 1, 3)
	look(q2)
	store(sys, q2[1:])
	if o := p.t.recs[p.t.find(q2[1])].ord; o.Measured || o.LateAt() > p.t.clk.Now+1 {
		t.Errorf("a new question branching off the system prompt has gap %d (measured %v), want none: late at once", o.Gap, o.Measured)
	}
	// A prompt extended past its tip, where nothing else goes on, lends
	// the new chunk its gap (a conversation's next turn).
	conv := ghostPrompt(h, 7, 8)
	store(nil, conv[:1])
	for range 3 {
		look(conv[:1])
	}
	store(conv[:1], conv[1:])
	if g, want := p.t.recs[p.t.find(conv[1])].ord.Gap, p.t.recs[p.t.find(conv[0])].ord.Gap; g != want {
		t.Errorf("a conversation's new turn has gap %d, want its prompt's %d", g, want)
	}
	if u := p.Stats().UsableRatio(); u != 1 {
		t.Errorf("usable/resident %.4f, want 1", u)
	}
}

// TestHostileChurnKeepsGhostsBounded: a peer storing endless distinct
// prompts makes the pool evict as many chunks, and the ghosts it keeps
// stay one entry per record slot, rounded up to a power of two.
func TestHostileChurnKeepsGhostsBounded(t *testing.T) {
	p, h := replayPool(t, 64*accAlign, PolicyPrefix, nil)
	defer p.Close()
	for doc := range uint64(5000) {
		ks := ghostPrompt(h, 1<<20+doc, 2, 3)
		res, err := p.ReserveWrite(InstanceOwner(1), ks, accAlign)
		if err != nil || !p.FinishWrite(res) {
			t.Fatalf("store %d: %v", doc, err)
		}
	}
	if ev := p.Stats().Evictions; ev < 10000 {
		t.Fatalf("%d evictions, want the churn to evict", ev)
	}
	recs, ghosts := len(p.t.recs), len(p.t.ghosts)
	t.Logf("%d record slots, %d ghost entries", recs, ghosts)
	if ghosts == 0 || ghosts > max(2*recs, 64) {
		t.Errorf("%d ghost entries for %d record slots, want 1 to 2 a slot", ghosts, recs)
	}
}
