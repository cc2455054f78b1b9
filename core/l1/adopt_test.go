package l1

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"time"

	"kvdock/core/l1/segment"
	"kvdock/core/testkit/fakeclock"
)

// sharedPool opens a pool of units×4096 bytes over a named segment in a
// fresh directory of /dev/shm, on clock c.
func sharedPool(t *testing.T, dir string, units int64, c *fakeclock.Clock) Options {
	t.Helper()
	return Options{Size: units * 4096, Align: 4096, Now: c.Now, OwnerLockShare: 1, TotalLockShare: 1,
		Plan: Decision{Segment: SegmentPrefix + "adopt"}, ShmDir: dir, WriteTTL: time.Minute, ReadTTL: time.Minute}
}

func testShmDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp(segment.DefaultDir, "kvdock-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func fill(p *Pool, off, n int64, b byte) {
	v, done := p.View(off, n)
	for i := range v {
		v[i] = b
	}
	done()
}

func TestKeepAdoptRestoresReadableObjectsAndHolds(t *testing.T) {
	dir := testShmDir(t)
	c := fakeclock.New()
	opts := sharedPool(t, dir, 64, c)
	p, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	// Published objects with known bytes.
	pub := keyRange(0, 8)
	res, err := p.ReserveWrite(InstanceOwner(1), pub, 5000)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		fill(p, r.Offset, r.Length, byte(i+1))
	}
	p.FinishWrite(res)
	// A reservation handed to a worker and never committed, a read hold a
	// worker still has, and a lookup's lock for a worker yet to read.
	held, _ := p.ReserveWrite(InstanceOwner(2), keyRange(100, 102), 4096)
	if n := p.ReserveReadPrefix(pub[:2], 2); n != 2 {
		t.Fatal("read prefix")
	}
	if _, ok := p.HoldRead(pub[0]); !ok {
		t.Fatal("hold")
	}
	var kept Kept
	if err := p.Keep(func(k Kept) error { kept = k; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(kept.Objects) != 10 {
		t.Fatalf("kept %d objects, want 10", len(kept.Objects))
	}

	c.Advance(time.Second)
	q, ad, err := Adopt(opts, kept)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if ad.Objects != 8 || ad.Carried != 2 || ad.Bytes != 8*8192 {
		t.Fatalf("adopted %+v", ad)
	}
	// No transfer claims the reservation: once the claims end it is held
	// for its worker as any abandoned one.
	q.EndClaims()
	if s := q.Stats(); s.Doomed != 2 {
		t.Fatalf("unclaimed reservations not held after EndClaims: %+v", s)
	}
	// Every published key is readable with its bytes, without storing again.
	if n := q.ReserveReadPrefix(pub, 1); n != len(pub) {
		t.Fatalf("%d of %d keys readable after adoption", n, len(pub))
	}
	for i, k := range pub {
		ref, ok := q.HoldRead(k)
		if !ok {
			t.Fatalf("key %d not holdable", i)
		}
		v, done := q.View(ref.Offset, ref.Length)
		if !bytes.Equal(v, bytes.Repeat([]byte{byte(i + 1)}, 5000)) {
			t.Fatalf("key %d: adopted bytes differ", i)
		}
		done()
		q.ReleaseRead([]ReadRef{ref})
	}
	// The held reservations are not readable, and their bytes are never
	// handed out again before their TTL: fill the pool and look.
	if locatable(q, keyRange(100, 101)[0]) {
		t.Fatal("a reservation that was never committed became readable")
	}
	var got []Reservation
	for i := 200; ; i++ {
		r, err := q.ReserveWrite(InstanceOwner(3), keyRange(i, i+1), 4096)
		if err != nil {
			break
		}
		got = append(got, r...)
	}
	for _, r := range got {
		for _, h := range held {
			if r.Offset == h.Offset {
				t.Fatalf("held bytes at %d handed out again before their TTL", h.Offset)
			}
		}
	}
	// The held read of pub[0] and the lookup lock on pub[1] still pin
	// those objects against eviction: the fill above did not take them.
	if !present(q, pub[0]) || !present(q, pub[1]) {
		t.Fatal("a held object was evicted")
	}
	// After the TTL the held bytes are free again.
	q.AbortWrite(got)
	c.Advance(2 * time.Minute)
	q.Maintain()
	if s := q.Stats(); s.Doomed != 0 || s.LockedBytes != 0 {
		t.Fatalf("held records outlived their TTL: %+v", s)
	}
}

func TestAdoptRefusesWhatIsNotTheKeptPool(t *testing.T) {
	dir := testShmDir(t)
	c := fakeclock.New()
	opts := sharedPool(t, dir, 16, c)
	keep := func() Kept {
		p, err := Open(opts)
		if err != nil {
			t.Fatal(err)
		}
		store(t, p, keyRange(0, 4), 4096)
		var k Kept
		if err := p.Keep(func(x Kept) error { k = x; return nil }); err != nil {
			t.Fatal(err)
		}
		return k
	}
	k := keep()
	bad := k
	bad.Objects = append([]KeptObject(nil), k.Objects...)
	bad.Objects[1].Offset = bad.Objects[0].Offset
	if _, _, err := Adopt(opts, bad); !errors.Is(err, ErrNotAdoptable) {
		t.Fatalf("overlap: %v", err)
	}
	other := opts
	other.Size *= 2
	if _, _, err := Adopt(other, k); !errors.Is(err, ErrNotAdoptable) {
		t.Fatalf("size: %v", err)
	}
	bad = k
	bad.Segment.Ino++
	if _, _, err := Adopt(opts, bad); !errors.Is(err, ErrNotAdoptable) {
		t.Fatalf("inode: %v", err)
	}
	q, _, err := Adopt(opts, k)
	if err != nil {
		t.Fatalf("the kept pool itself: %v", err)
	}
	if _, _, err := Adopt(opts, k); !errors.Is(err, ErrSegmentBusy) {
		t.Fatalf("adopted twice: %v", err)
	}
	q.Close()
}

// Under the prefix policy adopted objects are evictable: a full adopted
// pool still takes new stores, and evicts as the pool that kept it would
// have: the prompt's last chunks (its leaves) first.
func TestAdoptedObjectsEvictableUnderPrefix(t *testing.T) {
	dir := testShmDir(t)
	c := fakeclock.New()
	opts := sharedPool(t, dir, 16, c)
	opts.Policy = PolicyPrefix
	p, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	store(t, p, keyRange(0, 16), 4096)
	var k Kept
	if err := p.Keep(func(x Kept) error { k = x; return nil }); err != nil {
		t.Fatal(err)
	}
	q, ad, err := Adopt(opts, k)
	if err != nil || ad.Objects != 16 {
		t.Fatalf("adopt: %+v %v", ad, err)
	}
	defer q.Close()
	res, err := q.ReserveWrite(InstanceOwner(1), keyRange(100, 104), 4096)
	if err != nil || len(res) != 4 {
		t.Fatalf("a full adopted pool refused new stores: %v", err)
	}
	if present(q, key(15)) || present(q, key(12)) || !present(q, key(11)) || !present(q, key(0)) {
		t.Fatal("eviction did not take the adopted prompt's leaves first")
	}
}
