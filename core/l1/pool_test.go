package l1

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"kvdock/core/keys"
	"kvdock/core/testkit/chunks"
	"kvdock/core/testkit/fakeclock"
)

func key(i int) keys.ObjectKey { return chunks.Key(i) }

func keyRange(from, to int) []keys.ObjectKey { return chunks.Keys(from, to) }

// newPool returns an anonymous pool of units×4096 bytes on a test clock.
func newPool(t testing.TB, units int64, mod func(*Options)) (*Pool, *fakeclock.Clock) {
	t.Helper()
	c := fakeclock.New()
	// No lock caps unless a test sets them: the state-machine tests lock
	// whole pools on purpose.
	o := Options{Size: units * 4096, Align: 4096, Now: c.Now, OwnerLockShare: 1, TotalLockShare: 1}
	if mod != nil {
		mod(&o)
	}
	p, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, c
}

// store reserves and publishes ks.
func store(t *testing.T, p *Pool, ks []keys.ObjectKey, size int64) {
	t.Helper()
	res, err := p.ReserveWrite(InstanceOwner(1), ks, size)
	if err != nil {
		t.Fatal(err)
	}
	if !p.FinishWrite(res) {
		t.Fatal("FinishWrite of a fresh reservation answered false")
	}
}

// locatable reports whether a worker could hold k's read lock now; the hold
// is given back.
func locatable(p *Pool, k keys.ObjectKey) bool {
	ref, ok := p.HoldRead(k)
	if ok {
		p.ReturnRead([]ReadRef{ref})
	}
	return ok
}

func present(p *Pool, k keys.ObjectKey) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.t.find(k) != nilRec
}

func TestOpenValidates(t *testing.T) {
	for _, o := range []Options{
		{Size: 0},
		{Size: 1 << 20, Align: 3000},
		{Size: 100, Align: 4096},
		{Size: 1 << 20, Policy: "ARC"},
		{Size: 1 << 20, Watermark: 1.5},
		{Size: 1 << 20, Ratio: -1},
		{Size: 1 << 20, WriteTTL: -time.Second},
	} {
		if p, err := Open(o); err == nil {
			p.Close()
			t.Errorf("Open(%+v) accepted", o)
		}
	}
}

func TestStateMachine(t *testing.T) {
	p, _ := newPool(t, 16, nil)
	ks := keyRange(0, 2)
	res, err := p.ReserveWrite(InstanceOwner(1), ks, 5000)
	if err != nil || len(res) != 2 {
		t.Fatalf("ReserveWrite: %v %v", res, err)
	}
	for j, r := range res {
		if r.Index != j || r.Key != ks[j] || r.Length != 5000 || r.Offset%4096 != 0 {
			t.Fatalf("reservation %d: %+v", j, r)
		}
	}
	if res[0].Offset == res[1].Offset {
		t.Fatal("two reservations share an offset")
	}
	// Write-locked: not readable, not locatable, not deletable, not re-reservable.
	if n := p.ReserveReadPrefix(ks, 1); n != 0 {
		t.Fatalf("write-locked object readable: prefix %d", n)
	}
	if locatable(p, ks[0]) {
		t.Fatal("write-locked object locatable")
	}
	if n := p.Delete(ks); n != 0 {
		t.Fatalf("Delete removed %d write-locked objects", n)
	}
	if again, err := p.ReserveWrite(InstanceOwner(1), ks, 5000); err != nil || len(again) != 0 {
		t.Fatalf("mode new reserved existing keys again: %v %v", again, err)
	}
	if s := p.Stats(); s.WriteLocked != 2 || s.Objects != 2 || s.UsedBytes != 4*4096 || s.WriteExisting != 2 {
		t.Fatalf("stats after reserve: %+v", s)
	}
	if !p.FinishWrite(res) {
		t.Fatal("FinishWrite = false")
	}
	if p.FinishWrite(res) {
		t.Fatal("a second FinishWrite of the same reservations answered true")
	}
	// Ready, unlocked: not locatable until read-locked.
	if locatable(p, ks[0]) {
		t.Fatal("unlocked ready object locatable")
	}
	if n := p.ReserveReadPrefix(ks, 1); n != 2 {
		t.Fatalf("prefix %d, want 2", n)
	}
	ref, ok := p.HoldRead(ks[1])
	if !ok || ref.Offset != res[1].Offset || ref.Length != 5000 {
		t.Fatalf("HoldRead = %+v %v, want %d 5000 true", ref, ok, res[1].Offset)
	}
	if locatable(p, ks[1]) {
		t.Fatal("a second worker held the one read lock")
	}
	p.ReturnRead([]ReadRef{ref})
	if s := p.Stats(); s.WriteLocked != 0 || s.ReadLocked != 2 || s.ReadHits != 2 {
		t.Fatalf("stats after read lock: %+v", s)
	}
	if n := p.Delete(ks); n != 0 {
		t.Fatalf("Delete removed %d read-locked objects", n)
	}
	p.FinishRead(ks, 1)
	if locatable(p, ks[0]) {
		t.Fatal("object locatable after its last read lock was released")
	}
	if n := p.Delete(ks[:1]); n != 1 || present(p, ks[0]) {
		t.Fatalf("Delete of an unlocked object removed %d", n)
	}
	if s := p.Stats(); s.Objects != 1 || s.UsedBytes != 2*4096 || s.ReadLocked != 0 {
		t.Fatalf("stats after delete: %+v", s)
	}
	// Clear drops unlocked objects; locked ones are doomed: invisible, their
	// space kept until their lock ends.
	p.ReserveReadPrefix(ks[1:], 1)
	wr, _ := p.ReserveWrite(InstanceOwner(1), keyRange(10, 12), 1)
	if n := p.Clear(); n != 3 {
		t.Fatalf("Clear = %d, want 3", n)
	}
	if s := p.Stats(); s.Objects != 0 || s.Doomed != 3 || s.UsedBytes != 4*4096 || s.LiveBytes != s.UsedBytes || s.WriteLocked != 2 || s.ReadLocked != 1 {
		t.Fatalf("stats after clear: %+v", s)
	}
	if p.ReserveReadPrefix(ks[1:], 1) != 0 {
		t.Fatal("a doomed object was readable after the clear")
	}
	if p.FinishWrite(wr) {
		t.Fatal("a reservation overtaken by the clear was published")
	}
	p.FinishRead(ks[1:], 1)
	if s := p.Stats(); s.Objects != 0 || s.Doomed != 0 || s.UsedBytes != 0 || s.LiveBytes != 0 || s.WriteLocked != 0 || s.ReadLocked != 0 || s.LockedBytes != 0 || s.LockOwners != 0 {
		t.Fatalf("stats after the doomed locks ended: %+v", s)
	}
	store(t, p, keyRange(0, 16), 4096) // the whole pool is usable again
}

func TestAbortWriteFreesAndNeverPublishes(t *testing.T) {
	p, _ := newPool(t, 4, nil)
	ks := keyRange(0, 4)
	res, err := p.ReserveWrite(InstanceOwner(1), ks, 4096)
	if err != nil {
		t.Fatal(err)
	}
	p.AbortWrite(res[:3])
	if p.FinishWrite(res[:3]) { // too late: they are gone
		t.Fatal("FinishWrite of aborted reservations answered true")
	}
	if n := p.ReserveReadPrefix(ks[:3], 1); n != 0 {
		t.Fatalf("aborted object readable: prefix %d", n)
	}
	if s := p.Stats(); s.Objects != 1 || s.UsedBytes != 4096 || s.WriteLocked != 1 {
		t.Fatalf("stats after abort: %+v", s)
	}
	// AbortWrite of a ready object does nothing.
	p.FinishWrite(res[3:])
	p.AbortWrite(res[3:])
	if !present(p, ks[3]) {
		t.Fatal("AbortWrite dropped a ready object")
	}
}

func TestWriteTTLExpiry(t *testing.T) {
	p, c := newPool(t, 4, func(o *Options) { o.WriteTTL = 10 * time.Second })
	ks := keyRange(0, 2)
	res, err := p.ReserveWrite(InstanceOwner(1), ks, 4096)
	if err != nil {
		t.Fatal(err)
	}
	c.Advance(9 * time.Second)
	p.Maintain()
	if s := p.Stats(); s.WriteLocked != 2 {
		t.Fatalf("write lock expired early: %+v", s)
	}
	c.Advance(time.Second)
	p.Maintain()
	if s := p.Stats(); s.WriteLocked != 0 || s.Objects != 0 || s.UsedBytes != 0 || s.ExpiredWriteLocks != 2 {
		t.Fatalf("after the write TTL: %+v", s)
	}
	if p.FinishWrite(res) { // the reservation is gone; nothing is published
		t.Fatal("FinishWrite of expired reservations answered true")
	}
	if n := p.ReserveReadPrefix(ks, 1); n != 0 {
		t.Fatal("expired reservation was published")
	}
	// Lazily, without the loop: an expired reservation is absent for ReserveWrite.
	if res, err := p.ReserveWrite(InstanceOwner(1), ks[:1], 4096); err != nil || len(res) != 1 {
		t.Fatal(err)
	}
	c.Advance(10 * time.Second)
	if res, err := p.ReserveWrite(InstanceOwner(1), ks[:1], 4096); err != nil || len(res) != 1 {
		t.Fatalf("re-reserve after expiry: %v %v", res, err)
	}
	// A TTL changed live applies to new locks.
	if err := p.SetTTLs(time.Hour, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ReserveWrite(InstanceOwner(1), ks[1:], 4096); err != nil {
		t.Fatal(err)
	}
	c.Advance(30 * time.Minute)
	p.Maintain()
	if s := p.Stats(); s.WriteLocked != 1 {
		t.Fatalf("new write TTL not applied: %+v", s)
	}
}

func TestReadTTLExpiry(t *testing.T) {
	p, c := newPool(t, 4, func(o *Options) { o.ReadTTL = 5 * time.Second })
	ks := keyRange(0, 2)
	store(t, p, ks, 100)
	if n := p.ReserveReadPrefix(ks, 3); n != 2 {
		t.Fatal(n)
	}
	c.Advance(4 * time.Second)
	if !locatable(p, ks[0]) {
		t.Fatal("read lock expired early")
	}
	p.ReserveReadPrefix(ks[1:], 1) // renews the TTL of ks[1]
	c.Advance(time.Second)
	if locatable(p, ks[0]) {
		t.Fatal("read lock did not expire after the read TTL")
	}
	if !locatable(p, ks[1]) {
		t.Fatal("renewed read lock expired")
	}
	c.Advance(5 * time.Second)
	p.Maintain()
	if s := p.Stats(); s.ReadLocked != 0 || s.Objects != 2 || s.ExpiredReadLocks != 2 {
		t.Fatalf("after the read TTL: %+v", s)
	}
	if n := p.Delete(ks); n != 2 {
		t.Fatalf("objects with expired read locks not deletable: %d", n)
	}
}

func TestMLAExtraLocks(t *testing.T) {
	p, _ := newPool(t, 4, nil)
	ks := keyRange(0, 2)
	store(t, p, ks, 100)
	if n := p.ReserveReadPrefix(ks, 3); n != 2 { // tp=4 over world size 2 → 1 + 2 extra
		t.Fatal(n)
	}
	for i := range 2 {
		p.FinishRead(ks, 1)
		if !locatable(p, ks[0]) {
			t.Fatalf("unlocked after %d of 3 releases", i+1)
		}
		if p.Delete(ks) != 0 {
			t.Fatal("deleted while read locks remain")
		}
	}
	p.FinishRead(ks, 1)
	if locatable(p, ks[0]) {
		t.Fatal("still locked after 3 releases")
	}
	// Over-release never goes below zero or leaks into the next lock.
	p.FinishRead(ks, 5)
	p.ReserveReadPrefix(ks, 1)
	p.FinishRead(ks, 1)
	if s := p.Stats(); s.ReadLocked != 0 {
		t.Fatalf("lock leak: %+v", s)
	}
	if p.ReserveReadPrefix(ks, 0) != 0 {
		t.Fatal("count 0 locked something")
	}
}

func TestReadPrefixStopsAtFirstMiss(t *testing.T) {
	p, _ := newPool(t, 8, nil)
	store(t, p, keyRange(0, 2), 100)
	store(t, p, keyRange(3, 4), 100)
	if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(4, 5), 100); err != nil { // write-locked
		t.Fatal(err)
	}
	if n := p.ReserveReadPrefix(keyRange(0, 4), 1); n != 2 {
		t.Fatalf("prefix %d, want 2", n)
	}
	if locatable(p, key(3)) {
		t.Fatal("key after the miss was locked")
	}
	if n := p.ReserveReadPrefix([]keys.ObjectKey{key(3), key(4)}, 1); n != 1 {
		t.Fatalf("prefix over a write-locked key: %d, want 1", n)
	}
	if s := p.Stats(); s.ReadMisses != 2 || s.ReadHits != 3 {
		t.Fatalf("stats %+v", s)
	}
	// Model and salt separate objects.
	k := key(0)
	k.Salt = "tenant"
	if p.ReserveReadPrefix([]keys.ObjectKey{k}, 1) != 0 {
		t.Fatal("salted key hit an unsalted object")
	}
	k = key(0)
	k.Model = "other"
	if p.ReserveReadPrefix([]keys.ObjectKey{k}, 1) != 0 {
		t.Fatal("other model hit")
	}
}

func TestBatchAllOrNothing(t *testing.T) {
	p, _ := newPool(t, 10, func(o *Options) { o.Policy = PolicyNoop })
	store(t, p, keyRange(0, 6), 4096)
	_, err := p.ReserveWrite(InstanceOwner(1), keyRange(6, 11), 4096) // 5 new, 4 units free
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("oversized batch: %v, want ErrNoSpace", err)
	}
	for i := 6; i < 11; i++ {
		if present(p, key(i)) {
			t.Fatalf("key %d reserved by a failed batch", i)
		}
	}
	if s := p.Stats(); s.UsedBytes != 6*4096 || s.AllocFailures != 1 || s.Evictions != 0 {
		t.Fatalf("stats after failed batch: %+v", s)
	}
	// Existing keys do not count: 4 old + 4 new fits.
	res, err := p.ReserveWrite(InstanceOwner(1), keyRange(2, 10), 4096)
	if err != nil || len(res) != 4 || res[0].Index != 4 {
		t.Fatalf("mixed batch: %+v %v", res, err)
	}
	// Duplicates are reserved once.
	p.Clear()
	res, err = p.ReserveWrite(InstanceOwner(1), []keys.ObjectKey{key(1), key(1), key(2)}, 4096)
	if err != nil || len(res) != 2 || res[1].Index != 2 {
		t.Fatalf("duplicates: %+v %v", res, err)
	}
	if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(0, 1), 0); err == nil {
		t.Fatal("size 0 accepted")
	}
	if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(50, 51), 11*4096); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("object larger than the pool: %v", err)
	}
}

func TestOnDemandEvictionLRU(t *testing.T) {
	p, _ := newPool(t, 10, nil)
	for i := range 10 {
		store(t, p, keyRange(i, i+1), 4096)
	}
	p.Touch(keyRange(0, 1))                // 0 becomes MRU: order is now 1..9, 0
	p.ReserveReadPrefix(keyRange(1, 2), 1) // reading 1 makes it MRU and locks it
	res, err := p.ReserveWrite(InstanceOwner(1), keyRange(100, 102), 4096)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range map[int]bool{0: true, 1: true, 2: false, 3: false, 4: true} {
		if present(p, key(i)) != want {
			t.Errorf("key %d present = %v, want %v", i, !want, want)
		}
	}
	if s := p.Stats(); s.Evictions != 2 {
		t.Fatalf("evictions %d, want 2", s.Evictions)
	}
	// Everything locked: nothing evictable, the batch fails, nothing is lost.
	p.FinishRead(keyRange(1, 2), 1)
	p.AbortWrite(res)
	p.Clear()
	store(t, p, keyRange(0, 10), 4096)
	p.ReserveReadPrefix(keyRange(0, 8), 1)
	if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(100, 103), 4096); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("batch larger than the evictable space: %v", err)
	}
	if s := p.Stats(); s.Objects != 10 || s.Evictions != 2 {
		t.Fatalf("a batch that could not fit evicted objects: %+v", s)
	}
	if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(100, 102), 4096); err != nil {
		t.Fatal(err)
	}
	// noop never evicts.
	if err := p.SetEviction("noop", 0.8, 0.2); err != nil {
		t.Fatal(err)
	}
	p.FinishRead(keyRange(0, 8), 1)
	if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(200, 201), 4096); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("noop policy evicted: %v", err)
	}
}

func TestEvictionLoop(t *testing.T) {
	p, _ := newPool(t, 10, nil)
	store(t, p, keyRange(0, 7), 4096)
	p.Maintain() // 70% < 80%
	if s := p.Stats(); s.Evictions != 0 || s.EvictionTicks != 1 {
		t.Fatalf("evicted below the watermark: %+v", s)
	}
	store(t, p, keyRange(7, 10), 4096)
	p.ReserveReadPrefix(keyRange(0, 1), 1) // locked and MRU; key 1 is now LRU
	p.Maintain()                           // 100%: evict 20% of 10 = 2
	if s := p.Stats(); s.Evictions != 2 || s.Objects != 8 {
		t.Fatalf("first eviction round: %+v", s)
	}
	if present(p, key(1)) || present(p, key(2)) || !present(p, key(0)) || !present(p, key(3)) {
		t.Fatal("eviction did not follow LRU order")
	}
	p.Maintain() // 80% ≥ 80%: int(0.2*8) = 1
	if s := p.Stats(); s.Evictions != 3 {
		t.Fatalf("second round: %+v", s)
	}
	p.Maintain() // 70%: nothing
	if s := p.Stats(); s.Evictions != 3 || s.EvictionTicks != 4 {
		t.Fatalf("third round: %+v", s)
	}
	// At least one object even when ratio × objects < 1.
	if err := p.SetEviction("lru", 0.1, 0.01); err != nil {
		t.Fatal(err)
	}
	p.Maintain()
	if s := p.Stats(); s.Evictions != 4 || s.Policy != PolicyLRU || s.Watermark != 0.1 {
		t.Fatalf("ratio floor: %+v", s)
	}
	// Locked objects are never evicted by the loop.
	p.FinishRead(keyRange(0, 1), 1)
	p.Clear()
	store(t, p, keyRange(0, 10), 4096)
	p.ReserveReadPrefix(keyRange(0, 10), 1)
	p.Maintain()
	if s := p.Stats(); s.Objects != 10 {
		t.Fatalf("loop evicted locked objects: %+v", s)
	}
	if err := p.SetEviction("ARC", 0.8, 0.2); err == nil || !strings.Contains(err.Error(), "LRU, prefix or noop") {
		t.Fatalf("bad policy: %v", err)
	}
	if err := p.SetTTLs(0, time.Second); err == nil {
		t.Fatal("zero write TTL accepted")
	}
}

func TestViewBounds(t *testing.T) {
	p, _ := newPool(t, 2, nil)
	b, release := p.View(4096, 4096)
	if len(b) != 4096 || p.Stats().Views != 1 {
		t.Fatalf("len %d, views %d", len(b), p.Stats().Views)
	}
	release()
	release() // idempotent
	if v := p.Stats().Views; v != 0 {
		t.Fatalf("views %d after release", v)
	}
	for _, r := range [][2]int64{{-1, 1}, {0, -1}, {8192, 1}, {4096, 4097}, {1 << 62, 1 << 62}} {
		if b, release := p.View(r[0], r[1]); b != nil {
			t.Errorf("View(%d, %d) not nil", r[0], r[1])
		} else {
			release()
		}
	}
	p.Close()
	if b, _ := p.View(0, 1); b != nil {
		t.Fatal("View after Close")
	}
}

func TestConcurrentUse(t *testing.T) {
	p, _ := newPool(t, 64, nil)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				ks := keyRange(g*1000+i%40, g*1000+i%40+4)
				if res, err := p.ReserveWrite(InstanceOwner(1), ks, 4096); err == nil {
					for _, r := range res {
						b, release := p.View(r.Offset, r.Length)
						copy(b, "x")
						release()
					}
					p.FinishWrite(res)
				}
				n := p.ReserveReadPrefix(ks, 1)
				p.FinishRead(ks[:n], 1)
				if i%50 == 0 {
					p.Maintain()
					p.Stats()
				}
			}
		}()
	}
	wg.Wait()
	if s := p.Stats(); s.WriteLocked != 0 || s.ReadLocked != 0 {
		t.Fatalf("locks leaked: %+v", s)
	}
}
