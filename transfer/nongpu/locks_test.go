package nongpu

import (
	"bytes"
	"strings"
	"testing"

	"kvdock/core/protocol"
	"kvdock/core/workers"
)

// slotBytes copies a slot out of the pool.
func (e *env) slotBytes(s protocol.Slot) []byte {
	e.t.Helper()
	b, release := e.pool.View(s.Offset, s.Length)
	defer release()
	if b == nil {
		e.t.Fatalf("slot %+v outside the pool", s)
	}
	return bytes.Clone(b)
}

func (e *env) writeSlots(slots []protocol.Slot, seed byte) {
	e.t.Helper()
	for _, s := range slots {
		b, release := e.pool.View(s.Offset, s.Length)
		fill(b, seed)
		release()
	}
}

// storeSHM stores k for worker id through shared memory, its slots filled
// from seed, and fails the test with what when the commit is refused.
func (e *env) storeSHM(k protocol.Key, id int64, seed byte, what string) {
	e.t.Helper()
	r, _ := e.mod.PrepareStore(k, id)
	e.writeSlots(r.Slots, seed)
	if ok, _ := e.mod.CommitStore(k, id, nil); !ok {
		e.t.Fatal(what)
	}
}

// TestClearOvertakesPendingStore (write side): A prepares, the cache is
// cleared, B prepares the same size, A writes its slot late and commits.
// A's commit answers false and publishes nothing; B's slot still holds B's
// bytes, and a reader of B's key gets them. A clear that reset the
// allocator would give B A's slot and answer A's commit true.
func TestClearOvertakesPendingStore(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	e.register(2)
	ka := key(tokens(testChunk, 1000), 0, testChunk)
	kb := key(tokens(testChunk, 2000), 0, testChunk)
	ra, err := e.mod.PrepareStore(ka, 1)
	if err != nil || len(ra.Slots) != 1 {
		t.Fatalf("A prepare: %+v %v", ra, err)
	}
	e.pool.Clear()
	rb, err := e.mod.PrepareStore(kb, 2)
	if err != nil || len(rb.Slots) != 1 {
		t.Fatalf("B prepare: %+v %v", rb, err)
	}
	e.writeSlots(rb.Slots, 0xB0)
	e.writeSlots(ra.Slots, 0xA0) // A is late
	if ok, err := e.mod.CommitStore(ka, 1, nil); ok || err != nil {
		t.Fatalf("A's commit after the clear = %v %v, want false", ok, err)
	}
	if ok, err := e.mod.CommitStore(kb, 2, nil); !ok || err != nil {
		t.Fatalf("B's commit = %v %v", ok, err)
	}
	want := make([]byte, chunkBytes)
	fill(want, 0xB0)
	if !bytes.Equal(e.slotBytes(rb.Slots[0]), want) {
		t.Fatal("B's slot holds other bytes after B's commit")
	}
	if e.cached(ka) != 0 {
		t.Fatal("A's overtaken reservation was published")
	}
	e.lookupLock(kb)
	r, err := e.mod.PrepareRetrieve(kb, 2)
	if err != nil || !r.Success || len(r.Slots) != 1 {
		t.Fatalf("retrieve B: %+v %v", r, err)
	}
	if !bytes.Equal(e.slotBytes(r.Slots[0]), want) {
		t.Fatal("a reader of B's key got other bytes")
	}
	e.mod.CommitRetrieve(kb, 2)
	// Same key: after the clear nobody gets a slot of the key A still holds.
	ra, _ = e.mod.PrepareStore(ka, 1)
	e.pool.Clear()
	if rb, _ := e.mod.PrepareStore(ka, 2); len(rb.Slots) != 0 && rb.Slots[0].Offset == ra.Slots[0].Offset {
		t.Fatal("B got the slot A is writing")
	}
	if ok, _ := e.mod.CommitStore(ka, 1, nil); ok {
		t.Fatal("A's commit of the same key after a clear answered true")
	}
	if s := e.pool.Stats(); s.UsedBytes != s.LiveBytes || s.Doomed != 0 {
		t.Fatalf("pool after the transfers: %+v", s)
	}
}

// TestClearKeepsReadersBytes (read side): B holds K's slot for reading, the
// cache is cleared, C stores new data (K again and another key) and writes
// its slots; B's slot still holds K's original bytes until B's
// COMMIT_RETRIEVE, after which K is gone (C must not get B's slot, or B
// copies out C's bytes).
func TestClearKeepsReadersBytes(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	e.register(2)
	e.register(3)
	k := key(tokens(testChunk, 1000), 0, testChunk)
	e.storeSHM(k, 1, 0x10, "store K")
	e.lookupLock(k)
	rb, err := e.mod.PrepareRetrieve(k, 2)
	if err != nil || !rb.Success || len(rb.Slots) != 1 {
		t.Fatalf("B's retrieve: %+v %v", rb, err)
	}
	original := e.slotBytes(rb.Slots[0])
	e.pool.Clear()
	for _, kc := range []protocol.Key{k, key(tokens(testChunk, 3000), 0, testChunk)} {
		rc, err := e.mod.PrepareStore(kc, 3)
		if err != nil {
			t.Fatal(err)
		}
		e.writeSlots(rc.Slots, 0xC0)
		e.mod.CommitStore(kc, 3, nil)
	}
	if !bytes.Equal(e.slotBytes(rb.Slots[0]), original) {
		t.Fatal("B's slot was handed to C after the clear: B reads C's bytes")
	}
	if ok, _ := e.mod.CommitRetrieve(k, 2); !ok {
		t.Fatal("commit retrieve")
	}
	if e.cached(k) != 0 {
		t.Fatal("K survived the clear")
	}
	if s := e.pool.Stats(); s.Doomed != 0 || s.LockedBytes != 0 || s.UsedBytes != s.LiveBytes {
		t.Fatalf("pool after B's commit: %+v", s)
	}
}

// TestLockCapRefusalAnswersNoSlots: one PREPARE_STORE may not write-lock
// more than half the pool; the answer is upstream's "no slots" and the
// operator gets an event saying which cap refused it. Other instances still
// store.
func TestLockCapRefusalAnswersNoSlots(t *testing.T) {
	e := newEnv(t, true, 1<<20) // 2048 chunks of 512 bytes
	e.register(1)
	e.register(2)
	big := key(tokens(1100*testChunk, 1), 0, 1100*testChunk)
	r, err := e.mod.PrepareStore(big, 1)
	if err != nil || !r.Shm || len(r.Slots) != 0 {
		t.Fatalf("prepare of 54%% of the pool = %d slots, %v; want none", len(r.Slots), err)
	}
	evs := e.eventsOf(workers.EventNoSpace)
	if len(evs) != 1 || !strings.Contains(evs[0].Message, "lock cap") || !strings.Contains(evs[0].Message, "instance 1") {
		t.Fatalf("events %+v", evs)
	}
	if s := e.mod.Stats(); s.NoSpace != 1 {
		t.Fatalf("module stats %+v", s)
	}
	if s := e.pool.Stats(); s.WriteLocked != 0 || s.LockCapRefusals != 1 {
		t.Fatalf("pool stats %+v", s)
	}
	small := key(tokens(900*testChunk, 500000), 0, 900*testChunk)
	if r, err := e.mod.PrepareStore(small, 2); err != nil || len(r.Slots) != 900 {
		t.Fatalf("another instance's store: %d slots, %v", len(r.Slots), err)
	}
}

// TestByKeyReleaseCannotUnlockAWorkersRead: the scheduler's by-key release
// (FREE_LOOKUP_LOCKS), stale or excessive, must not unlock an object a
// worker holds between PREPARE_RETRIEVE and COMMIT_RETRIEVE: it stays
// undeletable and unevictable and keeps its bytes (a release that dropped
// the worker's lock would let Delete or eviction free the slot).
func TestByKeyReleaseCannotUnlockAWorkersRead(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	k := key(tokens(testChunk, 1000), 0, testChunk)
	e.storeSHM(k, 1, 0x10, "store")
	ks := e.lookupLock(k)
	rr, err := e.mod.PrepareRetrieve(k, 1)
	if err != nil || !rr.Success {
		t.Fatalf("retrieve %+v %v", rr, err)
	}
	want := e.slotBytes(rr.Slots[0])
	e.pool.FinishRead(ks, 5)
	if n := e.pool.Delete(ks); n != 0 {
		t.Fatal("the object a worker is reading was deleted after a by-key release")
	}
	if !bytes.Equal(e.slotBytes(rr.Slots[0]), want) {
		t.Fatal("the worker's slot changed")
	}
	// A repeated PREPARE_RETRIEVE reads the same held slot; the hold ends
	// with the second COMMIT_RETRIEVE, not the first.
	if rr2, err := e.mod.PrepareRetrieve(k, 1); err != nil || !rr2.Success || rr2.Slots[0].Offset != rr.Slots[0].Offset {
		t.Fatalf("repeated retrieve %+v %v", rr2, err)
	}
	if ok, _ := e.mod.CommitRetrieve(k, 1); !ok {
		t.Fatal("commit retrieve")
	}
	if n := e.pool.Delete(ks); n != 0 {
		t.Fatal("the first COMMIT_RETRIEVE released a hold the second prepare still reads")
	}
	if ok, _ := e.mod.CommitRetrieve(k, 1); !ok {
		t.Fatal("commit retrieve")
	}
	if n := e.pool.Delete(ks); n != 1 {
		t.Fatal("the object stayed locked after COMMIT_RETRIEVE")
	}
}

// TestHostileRepeatedRetrieveConsumesItsLookupLock: two requests of one
// worker retrieve the same prompt at once, each LOOKUP then
// PREPARE_RETRIEVE; the second prepare joins the pending read. Each
// prepare consumes its lookup's lock, as a first prepare does, so once
// both COMMIT_RETRIEVEs are in nothing stays locked. Joining without it
// would leave the second lookup's locks held to their TTL (300 s),
// charged against the lookup cap: a prompt shared by concurrent requests
// would leak them at every retrieve.
func TestHostileRepeatedRetrieveConsumesItsLookupLock(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	k := key(tokens(2*testChunk, 1100), 0, 2*testChunk)
	e.storeSHM(k, 1, 0x21, "store")
	ks := e.lookupLock(k)
	if r, err := e.mod.PrepareRetrieve(k, 1); err != nil || !r.Success {
		t.Fatalf("retrieve 1 = %+v, %v", r, err)
	}
	e.lookupLock(k)
	if r, err := e.mod.PrepareRetrieve(k, 1); err != nil || !r.Success {
		t.Fatalf("retrieve 2 = %+v, %v", r, err)
	}
	for i := range 2 {
		if ok, _ := e.mod.CommitRetrieve(k, 1); !ok {
			t.Fatalf("COMMIT_RETRIEVE %d refused", i+1)
		}
	}
	for i, ok := range ks {
		if e.pool.IsLocked(ok) {
			t.Fatalf("chunk %d stays locked after both retrieves committed: the second lookup's lock leaked", i)
		}
	}
	if st := e.pool.Stats(); st.ReadLocked != 0 {
		t.Fatalf("%d objects read-locked at the end", st.ReadLocked)
	}
}
