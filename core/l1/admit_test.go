package l1

import (
	"testing"

	"kvdock/core/keys"
)

// TestAdmissionRefusesAStoreDueLater: conversations served in turn fill
// the pool; the turn of the one just served, due back the latest, would
// evict the tail of one due back before it. The store is refused (no
// reservation, no error, counted), the other conversations keep every
// chunk, and the same store with free room is admitted in full.
func TestAdmissionRefusesAStoreDueLater(t *testing.T) {
	p, h := replayPool(t, 16*accAlign, PolicyPrefix, nil)
	defer p.Close()
	look := func(ks []keys.ObjectKey) int {
		n := p.ReserveReadPrefix(ks, 1)
		p.FinishRead(ks[:n], 1)
		return n
	}
	store := func(prev, ks []keys.ObjectKey) int {
		t.Helper()
		res, err := p.ReserveWriteAfter(InstanceOwner(1), prev, ks, accAlign)
		if err != nil || !p.FinishWrite(res) {
			t.Fatalf("store of %d chunks: %v", len(ks), err)
		}
		return len(res)
	}
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
