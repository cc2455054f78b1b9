package l1

import (
	"testing"

	"kvdock/core/keys"
	"kvdock/core/l1/nextuse"
)

// admitOps is a lookup that reads its hits and ends (the chunks it hit)
// and a store after prev (none: a prompt's start) that must not fail (the
// chunks reserved, none when admission refuses them) on p.
func admitOps(t *testing.T, p *Pool) (look func(ks []keys.ObjectKey) int, store func(prev, ks []keys.ObjectKey) int) {
	look = func(ks []keys.ObjectKey) int {
		n := p.ReserveReadPrefix(ks, 1)
		p.FinishRead(ks[:n], 1)
		return n
	}
	store = func(prev, ks []keys.ObjectKey) int {
		t.Helper()
		res, err := p.ReserveWriteAfter(InstanceOwner(1), prev, ks, accAlign)
		if err != nil || !p.FinishWrite(res) {
			t.Fatalf("store of %d chunks: %v", len(ks), err)
		}
		return len(res)
	}
	return look, store
}

// TestAdmissionRefusesAStoreDueLater: conversations served in turn fill
// the pool; the turn of the one just served, due back the latest, would
// evict the tail of one due back before it. The store is refused (no
// reservation, no error, counted), the other conversations keep every
// chunk, and the same store with free room is admitted in full.
func TestAdmissionRefusesAStoreDueLater(t *testing.T) {
	p, h := replayPool(t, 16*accAlign, PolicyPrefix, nil)
	defer p.Close()
	look, store := admitOps(t, p)
	for doc := range uint64(4) {
		store(nil, docPrompt(h, doc, 4)) // four conversations fill the pool
	}
	for range 2 {
		for doc := range uint64(4) {
			look(docPrompt(h, doc, 4)) // rounds of turns: each learns its gap
		}
	}
	a := docPrompt(h, 0, 6)
	if n := look(a); n != 4 {
		t.Fatalf("conversation 0 hits %d of its 4 chunks", n)
	}
	if n := store(a[3:4], a[4:]); n != 0 {
		t.Errorf("the turn of the conversation just served was stored (%d chunks), evicting one due back before it", n)
	}
	if r := p.Stats().AdmissionRefusals; r != 2 {
		t.Errorf("%d admission refusals, want the turn's 2", r)
	}
	for doc := range uint64(4) {
		if n := look(docPrompt(h, doc, 4)); n != 4 {
			t.Errorf("after the refusal, conversation %d hits %d of its 4 chunks", doc, n)
		}
	}
	if u := p.Stats().UsableRatio(); u != 1 {
		t.Errorf("usable/resident %.4f, want 1", u)
	}
	// With room, nothing is refused.
	if n := p.Delete(docPrompt(h, 3, 4)[2:]); n != 2 {
		t.Fatalf("deleted %d of conversation 3's 2 tail chunks", n)
	}
	look(a)
	if n := store(a[3:4], a[4:]); n != 2 {
		t.Errorf("a turn that fits in free space stored %d of its 2 chunks", n)
	}
	if n := look(a); n != 6 {
		t.Errorf("after its store, conversation 0 hits %d of its 6 chunks", n)
	}
}

// TestHostileOneShotPromptsAreAdmitted: a stream of prompts each stored
// once and never asked again keeps a full pool: content seen once never
// shuts out content seen once before it, so every store is reserved in
// full and the last prompt is cached whole (tests/reliability/attack's
// TestHostileInboundQueue, through the wire).
func TestHostileOneShotPromptsAreAdmitted(t *testing.T) {
	p, h := replayPool(t, 64*accAlign, PolicyPrefix, nil)
	defer p.Close()
	var last []keys.ObjectKey
	for doc := range uint64(200) {
		last = docPrompt(h, 1000+doc, 8)
		res, err := p.ReserveWrite(InstanceOwner(1), last, accAlign)
		if err != nil || len(res) != len(last) || !p.FinishWrite(res) {
			t.Fatalf("one-shot prompt %d: %d of %d chunks reserved: %v", doc, len(res), len(last), err)
		}
	}
	st := p.Stats()
	if st.AdmissionRefusals != 0 || st.Evictions == 0 {
		t.Errorf("%d admission refusals, %d evictions: want none refused, the pool evicting", st.AdmissionRefusals, st.Evictions)
	}
	if n := p.ReserveReadPrefix(last, 1); n != len(last) {
		t.Errorf("the last prompt hits %d of its %d chunks", n, len(last))
	} else {
		p.FinishRead(last, 1)
	}
}

// TestHostileHotPromptsShutNewOnesOutForABoundedTime: prompts used
// nextuse.HotUses times fill the pool and stop being asked. A new prompt
// is refused while they are hot (no reservation, no error, counted): a
// new prompt's due time says nothing of how often it comes back, and a
// rare one stored at first sight pushed out popular ones. The refusal
// ends once they are long late (hotLate gaps past late: about 45 requests
// here, for a gap of 5; late alone, 1.5 gaps, would let it in after 8), so
// whoever made them hot cannot keep new prompts out for longer than a
// fraction of the time it spent using them.
func TestHostileHotPromptsShutNewOnesOutForABoundedTime(t *testing.T) {
	p, h := replayPool(t, 17*accAlign, PolicyPrefix, nil)
	defer p.Close()
	look, storeAfter := admitOps(t, p)
	store := func(ks []keys.ObjectKey) int { return storeAfter(nil, ks) } // from a prompt's start
	// A chunk asked at every step, so the requests go on.
	clock := docPrompt(h, 50, 1)
	store(clock)
	for doc := range uint64(4) {
		store(docPrompt(h, doc, 4)) // the pool is full
	}
	for range nextuse.HotUses {
		look(clock)
		for doc := range uint64(4) {
			if n := look(docPrompt(h, doc, 4)); n != 4 {
				t.Fatalf("prompt %d hits %d of its 4 chunks", doc, n)
			}
		}
	}
	fresh := docPrompt(h, 100, 4)
	if n := store(fresh); n != 0 {
		t.Fatalf("a new prompt stored %d chunks over hot ones", n)
	}
	if r := p.Stats().AdmissionRefusals; r != 4 {
		t.Errorf("%d admission refusals, want the new prompt's 4", r)
	}
	steps := 0
	for ; steps < 200; steps++ {
		look(clock)
		if store(fresh) > 0 {
			break
		}
	}
	t.Logf("the new prompt was stored after %d requests", steps+1)
	if steps < 20 || steps > 60 {
		t.Errorf("the new prompt was stored after %d requests, want 20 to 60 (hot prompts of gap 5, hotLate gaps past late)", steps+1)
	}
	if n := look(fresh); n == 0 {
		t.Errorf("the new prompt stored after the refusals does not hit")
	}
	if u := p.Stats().UsableRatio(); u != 1 {
		t.Errorf("usable/resident %.4f, want 1", u)
	}
}
