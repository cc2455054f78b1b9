package l1

import (
	"fmt"
	"testing"
	"time"

	"kvdock/core/testkit/fakeclock"
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
		if n, refused := p.ReserveLookup("sched", fmt.Sprint("ahead-", r), keyRange(4*r, 4*r+4), 1); n != 4 || refused {
			t.Fatalf("prompt %d looked up ahead: %d of 4 locked, refused %v", r, n, refused)
		}
	}
	// One request past the owner cap (half the pool).
	p2, _ := newPool(t, units, func(o *Options) { o.OwnerLockShare, o.TotalLockShare = 0.5, 0.9 })
	p = p2
	for i := 0; i < units; i += 16 {
		fill(i, 16)
	}
	if n, refused := p.ReserveLookup("sched", "one", keyRange(0, 40), 1); n != units/2 || !refused {
		t.Fatalf("one request of 40 units: %d locked, refused %v; want %d, true", n, refused, units/2)
	}
	p.FinishRead(keyRange(0, units/2), 1)
	// Many requests together stop at the lookups' cap (70 % with these
	// shares: midway between one owner's and the total).
	locked := 0
	for r := range units {
		n, _ := p.ReserveLookup("sched", fmt.Sprint("many-", r), keyRange(r, r+1), 1)
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

// TestHostileLookupShareBetweenPeers: a peer holding nearly the whole
// lookups' cap (44 of 64 units, the cap is 44.8) cannot starve another
// scheduler: that one's 12 units are locked, the hog's least recently
// refreshed eras released to make room, and the hog, past its share, gets
// none of them back by looking everything up again; what a worker holds is
// never released.
func TestHostileLookupShareBetweenPeers(t *testing.T) {
	const units = 64
	c := fakeclock.New()
	p, _ := newPool(t, units, func(o *Options) {
		o.OwnerLockShare, o.TotalLockShare = 0.5, 0.9
		o.Now = c.Now
	})
	for i := 0; i < units; i += 16 {
		rs, err := p.ReserveWrite(InstanceOwner(1), keyRange(i, i+16), 4096)
		if err != nil || !p.FinishWrite(rs) {
			t.Fatalf("store %d: %v", i, err)
		}
	}
	hog := func() int {
		locked := 0
		for r := range 4 { // 11 units a request, under one owner's cap
			n, _ := p.ReserveLookup("hog", fmt.Sprint("h", r), keyRange(11*r, 11*r+11), 1)
			locked += n
			c.Advance(time.Second) // the first request's eras are the oldest
		}
		return locked
	}
	if n := hog(); n != 44 {
		t.Fatalf("the hog alone locked %d of 44 units", n)
	}
	// A worker holds one of the hog's oldest units: that era stays.
	held, ok := p.HoldRead(key(0))
	if !ok {
		t.Fatal("no read lock to hold")
	}
	if n, refused := p.ReserveLookup("victim", "v", keyRange(50, 62), 1); n != 12 || refused {
		t.Fatalf("the victim beside the hog: %d of 12 units locked, refused %v", n, refused)
	}
	s := p.Stats()
	if s.LookupReclaims != 12 || s.LockedBytes > p.lookupCap() {
		t.Fatalf("%d hog eras released, %d bytes locked (cap %d)", s.LookupReclaims, s.LockedBytes, p.lookupCap())
	}
	if !p.Held(held) {
		t.Fatal("a held read lock was released for the victim")
	}
	// The oldest unheld eras went (units 1..12), the newest stayed.
	if ref, ok := p.HoldRead(key(1)); ok {
		p.ReturnRead([]ReadRef{ref})
		t.Fatal("unit 1, of the oldest request, kept its read lock")
	}
	if ref, ok := p.HoldRead(key(43)); !ok {
		t.Fatal("unit 43, of the newest request, lost its read lock")
	} else {
		p.ReturnRead([]ReadRef{ref})
	}
	// The hog, past its share, looks everything up again: the victim keeps
	// all of its locks.
	hog()
	if n, refused := p.ReserveLookup("victim", "v", keyRange(50, 62), 1); n != 12 || refused {
		t.Fatalf("the victim after the hog looked up again: %d of 12, refused %v", n, refused)
	}
	if r := p.Stats().LookupReclaims; r != 12 {
		t.Fatalf("%d eras released in all, want the 12 for the victim only", r)
	}
	p.ReleaseRead([]ReadRef{held})
}
