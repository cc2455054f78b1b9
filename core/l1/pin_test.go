package l1

import (
	"testing"

	"kvdock/core/keys"
)

// TestHostilePinsForCopiesAreNoUse: the tiers' write-behind pins each
// chunk it copies out (PinRead). A pin is not a use: it restamps no order
// (nextuse) and counts no read hit. Taken as a lookup's lock
// (ReserveReadPrefix), every chunk written behind would look reused a few
// requests after its store to the prefix policy, and the pool's read hits
// would count the copies.
func TestHostilePinsForCopiesAreNoUse(t *testing.T) {
	p, h := replayPool(t, 16*accAlign, PolicyPrefix, nil)
	defer p.Close()
	a := docPrompt(h, 1, 8)
	res, err := p.ReserveWrite(InstanceOwner(1), a, accAlign)
	if err != nil || !p.FinishWrite(res) {
		t.Fatalf("store: %v", err)
	}
	before := p.Stats()
	at := func(k keys.ObjectKey) int32 { return p.lookup(k, p.now().UnixNano()) }
	stamps := make([]uint64, len(a))
	for i, k := range a {
		stamps[i] = p.t.recs[at(k)].ord.Stamp
	}
	for range 3 {
		for i := range a {
			if p.PinRead(a[i:i+1], 1) != 1 {
				t.Fatal("pin refused")
			}
			p.FinishRead(a[i:i+1], 1)
		}
	}
	after := p.Stats()
	if after.ReadHits != before.ReadHits || after.ReadMisses != before.ReadMisses {
		t.Fatalf("pins counted as reads: hits %d → %d, misses %d → %d", before.ReadHits, after.ReadHits, before.ReadMisses, after.ReadMisses)
	}
	for i, k := range a {
		if o := p.t.recs[at(k)].ord; o.Stamp != stamps[i] || o.Measured {
			t.Fatalf("chunk %d: a pin restamped the order (stamp %d → %d, measured %v)", i, stamps[i], o.Stamp, o.Measured)
		}
	}
	// A pin still locks: the chunk is not evictable while pinned.
	if p.PinRead(a[:1], 1) != 1 || !p.IsLocked(a[0]) {
		t.Fatal("a pinned chunk is not locked")
	}
	p.FinishRead(a[:1], 1)
}
