package l1

import (
	"fmt"
	"testing"
)

// Each LOOKUP request is a lock owner of its own, so a scheduler that looks
// several prompts up ahead is served up to the lookups' share of the pool,
// while one request stops at the owner cap and many requests together stop
// at the lookups' cap, leaving the rest of the pool to stores.
func TestLookupLocksCappedPerRequestAndTogether(t *testing.T) {
	const units = 64
	p, _ := newPool(t, units, func(o *Options) { o.OwnerLockShare, o.TotalLockShare = 0.5, 0.9 })
	fill := func(from, n int) {
		t.Helper()
		rs, err := p.ReserveWrite(InstanceOwner(1), keyRange(from, from+n), 4096)
		if err != nil || !p.FinishWrite(rs) {
			t.Fatalf("store %d..%d: %v", from, from+n, err)
		}
	}
	for i := 0; i < units; i += 16 { // the whole pool, under the owner cap per store
		fill(i, 16)
	}
	// Ten prompts of four units each (62.5 % of the pool) looked up ahead.
	for r := range 10 {
		if n, refused := p.ReserveLookup(fmt.Sprint("ahead-", r), keyRange(4*r, 4*r+4), 1); n != 4 || refused {
			t.Fatalf("prompt %d looked up ahead: %d of 4 locked, refused %v", r, n, refused)
		}
	}
	// One request past the owner cap (half the pool).
	p2, _ := newPool(t, units, func(o *Options) { o.OwnerLockShare, o.TotalLockShare = 0.5, 0.9 })
	p = p2
	for i := 0; i < units; i += 16 {
		fill(i, 16)
	}
	if n, refused := p.ReserveLookup("one", keyRange(0, 40), 1); n != units/2 || !refused {
		t.Fatalf("one request of 40 units: %d locked, refused %v; want %d, true", n, refused, units/2)
	}
	p.FinishRead(keyRange(0, units/2), 1)
	// Many requests together stop at the lookups' cap (70 % with these
	// shares: midway between one owner's and the total).
	locked := 0
	for r := range units {
		n, _ := p.ReserveLookup(fmt.Sprint("many-", r), keyRange(r, r+1), 1)
		locked += n
	}
	if want := int(p.lookupCap() / 4096); locked != want || want != units*7/10 {
		t.Fatalf("one unit each from %d requests: %d locked, want the lookups' cap %d", units, locked, want)
	}
	// What lookups cannot pin stays storable.
	if rs, err := p.ReserveWrite(InstanceOwner(2), keyRange(1000, 1000+units/8), 4096); err != nil || len(rs) != units/8 {
		t.Fatalf("a store beside pinned lookups: %d reserved, %v", len(rs), err)
	}
}
