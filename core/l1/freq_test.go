package l1

import (
	"testing"

	"kvdock/core/keys"
)

// freqPrompt is the keys of a prompt of n chunks of document doc.
func freqPrompt(h *keys.Hasher, doc uint64, n int) []keys.ObjectKey {
	var tokens []uint32
	for c := range n {
		tokens = append(tokens, chunkTokens(doc, c)...)
	}
	return keys.ObjectKeys(h.Hashes(tokens), "m", 1, nil, "")
}

// freqLook is a LOOKUP of ks and the retrieve of its hits; it returns the hits.
func freqLook(p *Pool, ks []keys.ObjectKey) int {
	n := p.ReserveReadPrefix(ks, 1)
	p.FinishRead(ks[:n], 1)
	return n
}

// freqFill looks up and stores each of prompts whole.
func freqFill(t *testing.T, p *Pool, prompts ...[]keys.ObjectKey) {
	t.Helper()
	for _, ks := range prompts {
		freqLook(p, ks)
		res, err := p.ReserveWrite(InstanceOwner(1), ks, accAlign)
		if err != nil || !p.FinishWrite(res) {
			t.Fatalf("store: %v", err)
		}
	}
}

// TestAdmissionRefusesARarerTail: two prompts asked for in turn fill a
// pool of 16 chunks; a prompt asked for once, whose store must evict, is
// given slots only for the chunks that fit without evicting, the rest
// refused and counted, not an error, and the two prompts still hit whole.
func TestAdmissionRefusesARarerTail(t *testing.T) {
	p, h := replayPool(t, 16*accAlign, PolicyPrefix, nil)
	defer p.Close()
	a, b := freqPrompt(h, 1, 7), freqPrompt(h, 2, 7)
	freqFill(t, p, a, b)
	for range 6 {
		freqLook(p, a)
		freqLook(p, b)
	}
	c := freqPrompt(h, 3, 5) // 2 free slots, then 3 chunks rarer than any held
	freqLook(p, c)
	res, err := p.ReserveWrite(InstanceOwner(1), c, accAlign)
	if err != nil {
		t.Fatalf("a refused store is an error: %v", err)
	}
	if len(res) != 2 || res[0].Index != 0 || res[1].Index != 1 {
		t.Fatalf("reserved %d chunks (%v), want the 2 leading ones", len(res), res)
	}
	if !p.FinishWrite(res) {
		t.Fatal("partial store not published")
	}
	if st := p.Stats(); st.AdmissionRefusals != 3 || st.Evictions != 0 {
		t.Errorf("%d refused, %d evicted: want 3 refused, none evicted", st.AdmissionRefusals, st.Evictions)
	}
	if na, nb, nc := freqLook(p, a), freqLook(p, b), freqLook(p, c); na != 7 || nb != 7 || nc != 2 {
		t.Errorf("hits %d, %d, %d: want 7, 7 and the 2 stored", na, nb, nc)
	}
	if u := p.Stats().UsableRatio(); u != 1 {
		t.Errorf("usable/resident %.4f, want 1", u)
	}
}

// TestAdmissionGivesWayToALatePrompt: prompts not asked for since well
// past their gap (late) are evicted for a new one however often they were
// asked before: a count says what a prompt was, not what it will be.
func TestAdmissionGivesWayToALatePrompt(t *testing.T) {
	p, h := replayPool(t, 16*accAlign, PolicyPrefix, nil)
	defer p.Close()
	a, b, d := freqPrompt(h, 1, 7), freqPrompt(h, 2, 7), freqPrompt(h, 4, 1)
	freqFill(t, p, a, b, d)
	for range 8 {
		freqLook(p, a)
		freqLook(p, b)
	}
	for range 40 { // requests for another prompt: a and b are late
		freqLook(p, d)
	}
	c := freqPrompt(h, 3, 4)
	freqLook(p, c)
	res, err := p.ReserveWrite(InstanceOwner(1), c, accAlign)
	if err != nil || len(res) != 4 || !p.FinishWrite(res) {
		t.Fatalf("store over a late prompt: %d reserved, %v", len(res), err)
	}
	if st := p.Stats(); st.AdmissionRefusals != 0 {
		t.Errorf("%d refused, want none", st.AdmissionRefusals)
	}
}

// TestHostileAskingKeepsTheSketchBounded: a peer asking for endless
// distinct prompts, and storing batches as large as the pool takes, grows
// the frequency sketch to at most 4 rows of 4 × the record slots (or the
// batch) rounded up to a power of two, 2 bytes a counter row pair.
func TestHostileAskingKeepsTheSketchBounded(t *testing.T) {
	const objects = 64
	p, h := replayPool(t, objects*accAlign, PolicyPrefix, nil)
	defer p.Close()
	for doc := range uint64(3000) {
		ks := freqPrompt(h, 1<<20+doc, 1+int(doc%objects))
		n := p.ReserveReadPrefix(ks, 1)
		p.FinishRead(ks[:n], 1)
		if res, err := p.ReserveWrite(InstanceOwner(1), ks, accAlign); err == nil {
			p.FinishWrite(res)
		}
	}
	width := (p.t.freq.mask + 1)
	limit := uint64(1)
	for limit < 4*uint64(len(p.t.recs)+objects) {
		limit *= 2
	}
	t.Logf("%d record slots, sketch width %d (%d bytes)", len(p.t.recs), width, len(p.t.freq.words)*8)
	if width > limit || len(p.t.freq.words) != freqRows*int(width)/16 {
		t.Errorf("sketch width %d for %d record slots, want at most %d", width, len(p.t.recs), limit)
	}
}

// TestHostilePinsForCopiesAreNoUse: the tiers' write-behind pins each
// chunk it copies out (PinRead). A pin is not a use: it counts no ask,
// restamps no order and counts no read hit. Counted as a use (as a
// ReserveReadPrefix was), every chunk written behind was asked for twice
// against a new chunk's once, so with a tier configured every store that
// had to evict was refused (core/engine's TestTierEvictedChunksComeBackFromTier
// caught it), and looked reused a few requests after its store.
func TestHostilePinsForCopiesAreNoUse(t *testing.T) {
	p, h := replayPool(t, 16*accAlign, PolicyPrefix, nil)
	defer p.Close()
	a, b := freqPrompt(h, 1, 8), freqPrompt(h, 2, 8)
	freqFill(t, p, a, b)
	before := p.Stats()
	stamp := p.t.recs[p.lookup(a[0], p.now().UnixNano())].ord
	for range 3 {
		for _, ks := range [][]keys.ObjectKey{a, b} {
			for i := range ks {
				if p.PinRead(ks[i:i+1], 1) != 1 {
					t.Fatal("pin refused")
				}
				p.FinishRead(ks[i:i+1], 1)
			}
		}
	}
	after := p.Stats()
	if after.ReadHits != before.ReadHits || after.ReadMisses != before.ReadMisses {
		t.Fatalf("pins counted as reads: hits %d → %d, misses %d → %d", before.ReadHits, after.ReadHits, before.ReadMisses, after.ReadMisses)
	}
	if o := p.t.recs[p.lookup(a[0], p.now().UnixNano())].ord; o.Stamp != stamp.Stamp || o.Gap != stamp.Gap {
		t.Fatalf("a pin restamped the order: %+v → %+v", stamp, o)
	}
	if e := p.t.freq.estimate(&a[0].Chunk); e != 1 { // its store (its lookup missed)
		t.Fatalf("chunk asked for %d times after its store and 3 pins, want 1", e)
	}
	// A new prompt asked as often as the held ones (its store) is
	// admitted in full: the pins gave the held ones no edge.
	c := freqPrompt(h, 3, 6)
	freqLook(p, c)
	res, err := p.ReserveWrite(InstanceOwner(1), c, accAlign)
	if err != nil || len(res) != len(c) {
		t.Fatalf("store of a prompt asked as often as the pinned ones: %d of %d reserved, %v", len(res), len(c), err)
	}
	p.FinishWrite(res)
	if n := p.Stats().AdmissionRefusals; n != 0 {
		t.Fatalf("%d chunks refused", n)
	}
}
