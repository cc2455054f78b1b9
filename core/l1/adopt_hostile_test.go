package l1

import (
	"bytes"
	"testing"
	"time"

	"kvdock/core/keys"
	"kvdock/core/testkit/fakeclock"
)

// keepPool opens opts, lets build fill it, and keeps it.
func keepPool(t *testing.T, opts Options, build func(p *Pool)) Kept {
	t.Helper()
	p, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	build(p)
	var k Kept
	if err := p.Keep(func(x Kept) error { k = x; return nil }); err != nil {
		t.Fatal(err)
	}
	return k
}

// adoptOK adopts k and closes the pool when the test ends.
func adoptOK(t *testing.T, opts Options, k Kept) (*Pool, Adopted) {
	t.Helper()
	q, ad, err := Adopt(opts, k)
	if err != nil {
		t.Fatalf("adopt: %v", err)
	}
	t.Cleanup(func() { q.Close() })
	return q, ad
}

// TestHostileAdoptDuplicateKeySkipsThatKey: a published key recorded twice
// costs that key, never the pool: neither copy is served (neither can be
// told to hold the key's bytes), a locked copy keeps its bytes for its
// reader until its TTL, and every other object is adopted with its bytes.
func TestHostileAdoptDuplicateKeySkipsThatKey(t *testing.T) {
	dir := testShmDir(t)
	c := fakeclock.New()
	opts := sharedPool(t, dir, 16, c)
	k := keepPool(t, opts, func(p *Pool) {
		res, err := p.ReserveWrite(InstanceOwner(1), keyRange(0, 5), 4096)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			fill(p, r.Offset, r.Length, byte(i+1))
		}
		p.FinishWrite(res)
		if p.ReserveReadPrefix(keyRange(0, 1), 1) != 1 {
			t.Fatal("read lock")
		}
	})
	// Object 1 claims object 0's key (object 0 read-locked); object 3 is
	// recorded twice, the copy unlocked.
	for i := range k.Objects {
		switch k.Objects[i].Key {
		case key(1):
			k.Objects[i].Key = key(0)
		case key(4):
			k.Objects[i].Key = key(3)
		}
	}
	q, ad := adoptOK(t, opts, k)
	if ad.Objects != 1 || ad.Held != 1 || ad.Dropped.N != 4 {
		t.Fatalf("adopted %+v; want key 2 readable, the locked copy of key 0 held, 4 objects dropped", ad)
	}
	if s := q.Stats(); s.Doomed != 1 || s.LockedBytes != 4096 {
		t.Fatalf("the locked copy is not held for its reader: %+v", s)
	}
	for _, k := range []int{0, 1, 3, 4} {
		if q.ReserveReadPrefix(keyRange(k, k+1), 1) != 0 {
			t.Fatalf("key %d readable after its key was recorded twice", k)
		}
	}
	if q.ReserveReadPrefix(keyRange(2, 3), 1) != 1 {
		t.Fatal("key 2 not readable: a duplicate cost more than its key")
	}
	ref, _ := q.HoldRead(key(2))
	v, done := q.View(ref.Offset, ref.Length)
	if !bytes.Equal(v, bytes.Repeat([]byte{3}, 4096)) {
		t.Fatal("key 2's bytes differ")
	}
	done()
}

// storeAll stores ks in batches of 4 (under one owner's lock cap).
func storeAll(t *testing.T, p *Pool, ks []keys.ObjectKey) {
	t.Helper()
	for i := 0; i < len(ks); i += 4 {
		store(t, p, ks[i:min(i+4, len(ks))], 4096)
	}
}

// TestHostileAdoptClampsCarriedLocks: a record whose locks end in a
// hundred years locks nothing past now + the TTL of their kind, and the
// lookups' read locks no worker holds count against the lock caps: of a
// pool locked whole, what passes the lookup cap is released (the most
// recently used kept), so stores find room at once.
func TestHostileAdoptClampsCarriedLocks(t *testing.T) {
	dir := testShmDir(t)
	c := fakeclock.New()
	opts := sharedPool(t, dir, 20, c)
	opts.OwnerLockShare, opts.TotalLockShare = 0, 0 // the defaults: 50 % and 90 %, lookups 70 %
	k := keepPool(t, opts, func(p *Pool) { storeAll(t, p, keyRange(0, 20)) })
	far := c.Now().Add(100 * 365 * 24 * time.Hour).UnixNano()
	for i := range k.Objects {
		k.Objects[i].Readers, k.Objects[i].Deadline = 1, far
	}
	// One write reservation among them, far in the future too.
	k.Objects[0].Held, k.Objects[0].Write, k.Objects[0].Readers = true, true, 0
	q, ad := adoptOK(t, opts, k)
	if ad.Clamped != 20 {
		t.Fatalf("%d of 20 deadlines clamped", ad.Clamped)
	}
	s := q.Stats()
	lookupCap := s.OwnerLockCap + (s.TotalLockCap-s.OwnerLockCap)/2
	if s.LockedBytes > s.TotalLockCap || s.LockedBytes-4096 > lookupCap {
		t.Fatalf("%d bytes locked after adoption (lookups %d), caps: total %d, lookups %d", s.LockedBytes, s.LockedBytes-4096, s.TotalLockCap, lookupCap)
	}
	if ad.Dropped.N != 20-1-int(lookupCap/4096) {
		t.Fatalf("%d read locks released, want %d: %v", ad.Dropped.N, 20-1-int(lookupCap/4096), ad.Dropped.Reasons())
	}
	if !q.IsLocked(key(19)) || q.IsLocked(key(1)) {
		t.Fatal("the least recently used read locks were not the ones released")
	}
	// A store up to the total cap finds room without waiting for any lock.
	if res, err := q.ReserveWrite(InstanceOwner(9), keyRange(100, 103), 4096); err != nil || !q.FinishWrite(res) {
		t.Fatalf("a store after adopting a locked pool: %v", err)
	}
	// At now + TTL every carried lock has ended.
	c.Advance(time.Minute + time.Second)
	q.Maintain()
	if s := q.Stats(); s.LockedBytes != 0 {
		t.Fatalf("%d bytes locked a TTL after adoption", s.LockedBytes)
	}
}

// TestHostileCarriedReadLocksCountAgainstLookupCap: the lookups' read
// locks a kept pool carries are charged to the lookups, so that new
// LOOKUPs in the successor stop at the lookup cap with them counted.
func TestHostileCarriedReadLocksCountAgainstLookupCap(t *testing.T) {
	dir := testShmDir(t)
	c := fakeclock.New()
	opts := sharedPool(t, dir, 20, c)
	opts.OwnerLockShare, opts.TotalLockShare = 0, 0
	var lookupCap int64
	k := keepPool(t, opts, func(p *Pool) {
		storeAll(t, p, keyRange(0, 20))
		s := p.Stats()
		lookupCap = s.OwnerLockCap + (s.TotalLockCap-s.OwnerLockCap)/2
		// Two requests lock what the lookup cap allows (14 units).
		for r, ks := range [][]int{{0, 7}, {7, 14}} {
			if n, refused := p.ReserveLookup("sched", string(rune('a'+r)), keyRange(ks[0], ks[1]), 1); n != 7 || refused {
				t.Fatalf("lookup %d: %d %v", r, n, refused)
			}
		}
	})
	if lookupCap != 14*4096 {
		t.Fatalf("lookup cap %d, the test wants 14 units", lookupCap)
	}
	q, ad := adoptOK(t, opts, k)
	if ad.Dropped.N != 0 {
		t.Fatalf("legitimate carried locks released: %v", ad.Dropped.Reasons())
	}
	// A new peer's lookup is served within its share (the cap over two
	// peers: the carried lookups are one), by releasing carried locks: had
	// they not been charged, it would have needed no release.
	if n, refused := q.ReserveLookup("sched", "c", keyRange(14, 20), 1); n != 6 || refused {
		t.Fatalf("a new lookup beside carried locks filling the lookup cap: %d of 6 locked, refused %v", n, refused)
	}
	if s := q.Stats(); s.LookupReclaims != 6 || s.LockedBytes != lookupCap {
		t.Fatalf("%d carried eras released, %d bytes locked; want 6 and the lookup cap %d", s.LookupReclaims, s.LockedBytes, lookupCap)
	}
	// Past its share (7 units) the new peer is refused: the carried
	// lookups keep theirs.
	if n, refused := q.ReserveLookup("sched", "d", keyRange(0, 14), 1); n >= 14 || !refused {
		t.Fatalf("a lookup past the new peer's share: %d locked, refused %v", n, refused)
	}
	if s := q.Stats(); s.LockedBytes > lookupCap {
		t.Fatalf("%d bytes locked, past the lookup cap %d", s.LockedBytes, lookupCap)
	}
	// A carried lock's readers serve the successor's workers.
	if !locatable(q, key(0)) {
		t.Fatal("a carried read lock cannot be held")
	}
}

// TestHostileExpiredHeldReadLockIsNotPublished: a chunk cleared while it
// was read-locked is held (never readable) until its lock ends; adopted
// after that lock's TTL, it stays unreadable and its bytes are free.
func TestHostileExpiredHeldReadLockIsNotPublished(t *testing.T) {
	dir := testShmDir(t)
	c := fakeclock.New()
	opts := sharedPool(t, dir, 8, c)
	k := keepPool(t, opts, func(p *Pool) {
		store(t, p, keyRange(0, 2), 4096)
		if p.ReserveReadPrefix(keyRange(0, 1), 1) != 1 {
			t.Fatal("read lock")
		}
		p.Clear()
	})
	if len(k.Objects) != 1 || !k.Objects[0].Held || k.Objects[0].Readers != 1 {
		t.Fatalf("kept %+v, want the cleared, read-locked chunk held", k.Objects)
	}
	c.Advance(2 * time.Minute) // past the read TTL
	q, ad := adoptOK(t, opts, k)
	if ad.Objects != 0 || ad.Held != 0 || ad.Expired != 1 || ad.ExpiredHeld != 1 || ad.Dropped.N != 0 {
		t.Fatalf("adopted %+v, want the one held object expired", ad)
	}
	if locatable(q, key(0)) || q.ReserveReadPrefix(keyRange(0, 1), 1) != 0 {
		t.Fatal("a chunk cleared while read-locked is readable after the restart")
	}
	if s := q.Stats(); s.Doomed != 0 || s.LockedBytes != 0 || s.Objects != 0 {
		t.Fatalf("the expired held chunk is still in the table: %+v", s)
	}
	if _, err := q.ReserveWrite(InstanceOwner(1), keyRange(10, 18), 4096); err != nil {
		t.Fatalf("the whole pool is not free again: %v", err)
	}
}

// TestAdoptKeepsOneChunkUnderTwoLayouts: the same chunk of a model stored
// under two of its layouts is two objects (the key index tells them apart
// by the layout ID), so a restart adopts both with their own bytes; the
// duplicate check once compared keys without the layout and dropped both
// as "key recorded twice".
func TestAdoptKeepsOneChunkUnderTwoLayouts(t *testing.T) {
	dir := testShmDir(t)
	c := fakeclock.New()
	opts := sharedPool(t, dir, 16, c)
	a, b := keyRange(0, 2), keyRange(0, 2)
	for i := range b {
		b[i].Layout = 0x5eed
	}
	k := keepPool(t, opts, func(p *Pool) {
		for n, ks := range [][]keys.ObjectKey{a, b} {
			res, err := p.ReserveWrite(InstanceOwner(1), ks, 4096)
			if err != nil || len(res) != len(ks) {
				t.Fatalf("reserve: %v (%d)", err, len(res))
			}
			for i, r := range res {
				fill(p, r.Offset, r.Length, byte(16*n+i+1))
			}
			p.FinishWrite(res)
		}
	})
	q, ad := adoptOK(t, opts, k)
	if ad.Objects != 4 || ad.Dropped.N != 0 {
		t.Fatalf("adopted %+v; want all 4 objects, none dropped (%v)", ad, ad.Dropped.Reasons())
	}
	for n, ks := range [][]keys.ObjectKey{a, b} {
		if got := q.ReserveReadPrefix(ks, 1); got != len(ks) {
			t.Fatalf("layout %d: %d of %d chunks readable after the adoption", n, got, len(ks))
		}
	}
}
