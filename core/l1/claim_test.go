package l1

import (
	"bytes"
	"testing"
	"time"

	"kvdock/core/testkit/fakeclock"
)

// TestCarriedTransfersClaimedOnce: a write reservation and a worker's read
// hold live through Keep and Adopt as a carried transfer's: the successor
// claims the reservation for the worker's instance, whose commit publishes
// the bytes the worker wrote into it, and the hold, whose release ends the
// read lock. Neither is readable or reusable before; neither is claimed
// twice.
func TestCarriedTransfersClaimedOnce(t *testing.T) {
	dir := testShmDir(t)
	c := fakeclock.New()
	opts := sharedPool(t, dir, 16, c)
	var wOffs []int64
	var rOff int64
	k := keepPool(t, opts, func(p *Pool) {
		store(t, p, keyRange(0, 1), 4096)
		if p.ReserveReadPrefix(keyRange(0, 1), 1) != 1 {
			t.Fatal("read lock")
		}
		ref, ok := p.HoldRead(key(0))
		if !ok {
			t.Fatal("hold")
		}
		rOff = ref.Offset
		res, err := p.ReserveWrite(InstanceOwner(7), keyRange(1, 3), 4096)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			fill(p, r.Offset, r.Length, byte(0x40+i))
			wOffs = append(wOffs, r.Offset)
		}
	})
	q, ad := adoptOK(t, opts, k)
	if ad.Carried != 2 {
		t.Fatalf("adopted %+v, want 2 carried reservations", ad)
	}
	if q.ReserveReadPrefix(keyRange(1, 2), 1) != 0 {
		t.Fatal("a carried reservation is readable before its commit")
	}
	if _, err := q.ReserveWrite(InstanceOwner(8), keyRange(1, 2), 4096); err != nil {
		t.Fatalf("a second store of a carried key: %v", err)
	}
	res, ok := q.ClaimWrites(InstanceOwner(7), wOffs)
	if !ok || len(res) != 2 {
		t.Fatalf("claim of the carried reservations: %v %v", res, ok)
	}
	if _, again := q.ClaimWrites(InstanceOwner(9), wOffs); again {
		t.Fatal("a carried reservation claimed twice")
	}
	if _, bad := q.ClaimWrites(InstanceOwner(9), []int64{rOff}); bad {
		t.Fatal("a published object claimed as a reservation")
	}
	if !q.FinishWrite(res) {
		t.Fatal("the claimed reservations did not publish")
	}
	for i := range 2 {
		ref, ok := q.HoldRead(key(1 + i))
		if ok {
			t.Fatalf("key %d: a hold without a read lock", 1+i)
		}
		if q.ReserveReadPrefix(keyRange(1+i, 2+i), 1) != 1 {
			t.Fatalf("key %d not readable after its commit", 1+i)
		}
		ref, _ = q.HoldRead(key(1 + i))
		v, done := q.View(ref.Offset, ref.Length)
		if !bytes.Equal(v, bytes.Repeat([]byte{byte(0x40 + i)}, 4096)) {
			t.Fatalf("key %d: the bytes the worker wrote before the restart differ", 1+i)
		}
		done()
		q.ReleaseRead([]ReadRef{ref})
	}
	refs, ok := q.ClaimHolds([]int64{rOff})
	if !ok {
		t.Fatal("the carried read hold was not claimed")
	}
	if _, bad := q.ClaimHolds([]int64{rOff + 1}); bad {
		t.Fatal("a hold claimed at an offset where no object starts")
	}
	q.EndClaims()
	if _, late := q.ClaimHolds([]int64{rOff}); late {
		t.Fatal("a claim after EndClaims")
	}
	q.ReleaseRead(refs)
	if s := q.Stats(); s.LockedBytes != 0 {
		t.Fatalf("locks left after the carried transfers ended: %+v", s)
	}
}

// TestHostileUnclaimedReservationEndsAtItsDeadline: a carried reservation
// no commit claims is never readable and its bytes come back at its
// (clamped) deadline; a record that marks a published object live is
// adopted with it published, not as a reservation.
func TestHostileUnclaimedReservationEndsAtItsDeadline(t *testing.T) {
	dir := testShmDir(t)
	c := fakeclock.New()
	opts := sharedPool(t, dir, 16, c)
	k := keepPool(t, opts, func(p *Pool) {
		store(t, p, keyRange(0, 1), 4096)
		if _, err := p.ReserveWrite(InstanceOwner(7), keyRange(1, 2), 4096); err != nil {
			t.Fatal(err)
		}
	})
	for i := range k.Objects {
		if !k.Objects[i].Write {
			k.Objects[i].Live = true // hostile: a published object marked live
		}
	}
	q, ad := adoptOK(t, opts, k)
	if ad.Carried != 1 || ad.Objects != 1 {
		t.Fatalf("adopted %+v, want 1 carried reservation and 1 published object", ad)
	}
	if q.ReserveReadPrefix(keyRange(0, 1), 1) != 1 {
		t.Fatal("the published object marked live is not readable")
	}
	q.FinishRead(keyRange(0, 1), 1)
	q.EndClaims()
	if _, err := q.ReserveWrite(InstanceOwner(8), keyRange(1, 2), 4096); err != nil {
		t.Fatalf("a new store of an unclaimed carried key after EndClaims: %v", err)
	}
	c.Advance(opts.WriteTTL + time.Second)
	q.Maintain()
	if q.ReserveReadPrefix(keyRange(1, 2), 1) != 0 {
		t.Fatal("an unclaimed carried reservation became readable")
	}
	if s := q.Stats(); s.Doomed != 0 {
		t.Fatalf("an unclaimed carried reservation outlived its deadline: %+v", s)
	}
}
