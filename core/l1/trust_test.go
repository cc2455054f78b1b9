package l1

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestClearKeepsLockedObjects: a Clear during transfers drops only unlocked
// objects; a reservation it overtook is never published and its slot is not
// handed out again; a read-locked object keeps its bytes for its reader.
func TestClearKeepsLockedObjects(t *testing.T) {
	p, _ := newPool(t, 8, nil)
	store(t, p, keyRange(0, 2), 4096) // 0 will be read-locked, 1 unlocked
	if p.ReserveReadPrefix(keyRange(0, 1), 1) != 1 {
		t.Fatal("read lock")
	}
	ref, ok := p.HoldRead(key(0)) // a worker reads key 0
	if !ok {
		t.Fatal("hold")
	}
	a, err := p.ReserveWrite(InstanceOwner(1), keyRange(10, 11), 4096)
	if err != nil {
		t.Fatal(err)
	}
	if n := p.Clear(); n != 3 {
		t.Fatalf("Clear = %d, want 3", n)
	}
	// B reserves the rest of the pool: none of it may be A's or the reader's.
	b, err := p.ReserveWrite(InstanceOwner(2), keyRange(20, 26), 4096)
	if err != nil || len(b) != 6 {
		t.Fatalf("B's reservation after the clear: %v %v", b, err)
	}
	for _, r := range b {
		if r.Offset == a[0].Offset || r.Offset == ref.Offset {
			t.Fatalf("B got offset %d, still held by a transfer the clear overtook", r.Offset)
		}
	}
	// The cleared keys are invisible: not readable, not re-reservable.
	if p.ReserveReadPrefix(keyRange(0, 1), 1) != 0 {
		t.Fatal("doomed object readable")
	}
	if again, err := p.ReserveWrite(InstanceOwner(3), append(keyRange(0, 1), key(10)), 4096); err == nil && len(again) != 0 {
		t.Fatalf("doomed keys reserved again: %+v", again)
	}
	if p.FinishWrite(a) {
		t.Fatal("A's commit of a reservation the clear overtook answered true")
	}
	if !p.FinishWrite(b) {
		t.Fatal("B's commit failed")
	}
	// The reader's object stays locked until it releases; nobody else can
	// hold it, and a by-key release of the scheduler's locks does not touch
	// the hold.
	p.FinishRead(keyRange(0, 1), 5)
	if !p.IsLocked(key(0)) {
		t.Fatal("reader lost its object")
	}
	if _, ok := p.HoldRead(key(0)); ok {
		t.Fatal("a second hold on a single read lock")
	}
	p.ReleaseRead([]ReadRef{ref})
	p.ReleaseRead([]ReadRef{ref}) // a second release is stale
	s := p.Stats()
	if s.Doomed != 0 || s.Objects != 6 || s.UsedBytes != 6*4096 || s.LiveBytes != s.UsedBytes || s.LockedBytes != 0 || s.StaleFinishes == 0 {
		t.Fatalf("stats after the transfers ended: %+v", s)
	}
	store(t, p, keyRange(30, 32), 4096) // the doomed space came back
}

// TestFinishWriteAllOrNothing: one overtaken reservation makes the whole
// batch fail, and the rest of the batch is freed, not published.
func TestFinishWriteAllOrNothing(t *testing.T) {
	p, c := newPool(t, 8, func(o *Options) { o.WriteTTL = 10 * time.Second })
	a, err := p.ReserveWrite(InstanceOwner(1), keyRange(0, 2), 4096)
	if err != nil {
		t.Fatal(err)
	}
	c.Advance(5 * time.Second)
	b, err := p.ReserveWrite(InstanceOwner(1), keyRange(2, 3), 4096)
	if err != nil {
		t.Fatal(err)
	}
	c.Advance(6 * time.Second) // a expired, b did not
	if p.FinishWrite(append(a, b...)) {
		t.Fatal("a batch with expired reservations was published")
	}
	if s := p.Stats(); s.Objects != 0 || s.UsedBytes != 0 || s.WriteLocked != 0 {
		t.Fatalf("the batch's live reservation was kept or published: %+v", s)
	}
}

// TestLateFinishNeverTouchesAnotherLock: a reservation that expired and was
// re-reserved by another worker (same key, maybe the same record and
// offset) is not the late worker's to publish or abort; a read released
// after its lock expired does not release a newer lock.
func TestLateFinishNeverTouchesAnotherLock(t *testing.T) {
	p, c := newPool(t, 1, func(o *Options) { o.WriteTTL = 10 * time.Second; o.ReadTTL = 10 * time.Second })
	a, err := p.ReserveWrite(InstanceOwner(1), keyRange(0, 1), 4096)
	if err != nil {
		t.Fatal(err)
	}
	c.Advance(11 * time.Second)
	b, err := p.ReserveWrite(InstanceOwner(2), keyRange(0, 1), 4096)
	if err != nil || len(b) != 1 || b[0].Offset != a[0].Offset {
		t.Fatalf("re-reservation %+v %v (the test wants the same slot)", b, err)
	}
	if p.FinishWrite(a) {
		t.Fatal("A's late commit answered true")
	}
	p.AbortWrite(a)
	if s := p.Stats(); s.WriteLocked != 1 {
		t.Fatalf("A's late commit or abort acted on B's reservation: %+v", s)
	}
	if p.ReserveReadPrefix(keyRange(0, 1), 1) != 0 {
		t.Fatal("B's half-written slot was published by A's commit")
	}
	if !p.FinishWrite(b) {
		t.Fatal("B's commit failed")
	}
	// Reads: R locks, its lock expires, S locks; R's late release is stale.
	p.ReserveReadPrefix(keyRange(0, 1), 1)
	r, _ := p.HoldRead(key(0))
	c.Advance(11 * time.Second)
	p.ReserveReadPrefix(keyRange(0, 1), 1)
	p.ReleaseRead([]ReadRef{r})
	p.ReturnRead([]ReadRef{r})
	if !p.IsLocked(key(0)) || !locatable(p, key(0)) {
		t.Fatal("a late release took a newer reader's lock")
	}
}

// TestReserveWriteHugeBatchIsQuick: a batch of 65,536 keys (16 M tokens at
// 256 per chunk) is refused or reserved quickly. A quadratic dedupe before
// the capacity check takes seconds here, holding the mutex.
func TestReserveWriteHugeBatchIsQuick(t *testing.T) {
	ks := keyRange(0, 65536)
	small, _ := newPool(t, 16, nil)
	start := time.Now()
	if _, err := small.ReserveWrite(InstanceOwner(1), ks, 4096); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("batch larger than the pool: %v", err)
	}
	refused := time.Since(start)
	big, _ := newPool(t, 65536+1000, nil)
	start = time.Now()
	res, err := big.ReserveWrite(InstanceOwner(1), append(ks, ks[:1000]...), 4096)
	if err != nil || len(res) != len(ks) {
		t.Fatalf("batch that fits: %d reserved, %v", len(res), err)
	}
	reserved := time.Since(start)
	t.Logf("65,536 keys: refused in %v, reserved in %v", refused, reserved)
	if refused > time.Second || reserved > 5*time.Second {
		t.Fatalf("too slow: refused in %v, reserved in %v", refused, reserved)
	}
}

// TestLockCaps: one owner may lock half the pool, everyone together 90%;
// refusals are ErrLockCap (distinct from no space) and counted, read locks
// of lookups stop at the cap, and owner entries go when they hold nothing.
func TestLockCaps(t *testing.T) {
	p, _ := newPool(t, 20, func(o *Options) { o.OwnerLockShare = DefaultOwnerLockShare; o.TotalLockShare = DefaultTotalLockShare })
	if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(0, 11), 4096); !errors.Is(err, ErrLockCap) || !strings.Contains(err.Error(), "instance 1") {
		t.Fatalf("11 of 20 units for one instance: %v, want ErrLockCap", err)
	}
	a, err := p.ReserveWrite(InstanceOwner(1), keyRange(0, 10), 4096)
	if err != nil {
		t.Fatalf("half the pool: %v", err)
	}
	if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(10, 11), 4096); !errors.Is(err, ErrLockCap) {
		t.Fatalf("past half: %v", err)
	}
	b, err := p.ReserveWrite(InstanceOwner(2), keyRange(10, 18), 4096)
	if err != nil {
		t.Fatalf("another instance: %v", err)
	}
	if _, err := p.ReserveWrite(InstanceOwner(3), keyRange(18, 19), 4096); !errors.Is(err, ErrLockCap) || !strings.Contains(err.Error(), "total") {
		t.Fatalf("past 90%% in total: %v", err)
	}
	if s := p.Stats(); s.LockCapRefusals != 3 || s.LockOwners != 2 || s.LockedBytes != 18*4096 || s.OwnerLockCap != 10*4096 || s.TotalLockCap != 18*4096 {
		t.Fatalf("stats %+v", s)
	}
	p.FinishWrite(a)
	p.FinishWrite(b)
	if s := p.Stats(); s.LockOwners != 0 || s.LockedBytes != 0 {
		t.Fatalf("owner entries kept after their locks ended: %+v", s)
	}
	// Lookups: 18 ready objects, read locks stop at half the pool.
	if n := p.ReserveReadPrefix(keyRange(0, 18), 1); n != 10 {
		t.Fatalf("lookup locked %d objects, want 10 (its cap)", n)
	}
	// Joining locks already held costs nothing.
	if n := p.ReserveReadPrefix(keyRange(0, 10), 1); n != 10 {
		t.Fatalf("re-lock of locked objects: %d", n)
	}
	if _, err := Open(Options{Size: 1 << 20, OwnerLockShare: 1.5}); err == nil {
		t.Fatal("share 1.5 accepted")
	}
}

// TestCloseWaitsForViews: copies through views race Close; Close must wait
// for them (an unmap under a copy is "unexpected fault address", a fatal
// error). Both anonymous and shared pools.
func TestCloseWaitsForViews(t *testing.T) {
	for round := range 60 {
		seg := ""
		if round%2 == 1 {
			seg = fmt.Sprintf("%skvdocktest_%d_%08x", SegmentPrefix, os.Getpid(), rand.Uint32())
		}
		p, err := Open(Options{Size: 1 << 20, Plan: Decision{Segment: seg}})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		started := make(chan struct{})
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				src := make([]byte, 256<<10)
				for i := 0; ; i++ {
					b, release := p.View(int64(g)*(256<<10), 256<<10)
					if i == 0 && g == 0 {
						close(started)
					}
					if b == nil {
						release()
						return
					}
					copy(b, src)
					copy(src[:4096], b)
					release()
				}
			}()
		}
		<-started
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
	}
}

// TestCloseDetachesWhenViewsStayOut: a view not returned by the deadline
// keeps the mapping alive (writes through it still work) while the name
// and the flock are released, so the segment can be created again.
func TestCloseDetachesWhenViewsStayOut(t *testing.T) {
	name := fmt.Sprintf("%skvdocktest_%d_%08x", SegmentPrefix, os.Getpid(), rand.Uint32())
	p, err := Open(Options{Size: 1 << 20, Plan: Decision{Segment: name}})
	if err != nil {
		t.Fatal(err)
	}
	b, release := p.View(0, 4096)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := p.CloseContext(ctx); err == nil || !strings.Contains(err.Error(), "views still out") {
		t.Fatalf("CloseContext with a view out: %v", err)
	}
	copy(b, "still mapped") // would fault if Close had unmapped
	release()
	if _, err := os.Stat(filepath.Join("/dev/shm", name)); !os.IsNotExist(err) {
		t.Fatalf("segment name kept: %v", err)
	}
	q, err := Open(Options{Size: 1 << 20, Plan: Decision{Segment: name}})
	if err != nil {
		t.Fatalf("reopen after detach: %v", err)
	}
	q.Close()
	if p.Close() != nil {
		t.Fatal("second Close")
	}
}

// TestConcurrentClearNeverServesWrongBytes: writers store f(key) through
// their slots, readers lock, locate, copy and check, and a clearer clears
// all the while. A reader must only ever see f(key) under key's lock, and
// when everything is done no lock, doomed object or space is left over.
func TestConcurrentClearNeverServesWrongBytes(t *testing.T) {
	p, _ := newPool(t, 64, nil)
	const universe = 200
	pattern := func(b []byte, k int) {
		for i := range b {
			b[i] = byte(k) ^ byte(i*31)
		}
	}
	var wg sync.WaitGroup
	var bad sync.Once
	var badMsg string
	stop := make(chan struct{})
	for g := range 4 {
		wg.Add(1)
		go func() { // writer
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 3000 {
				k := r.IntN(universe)
				res, err := p.ReserveWrite(InstanceOwner(int64(g)), keyRange(k, k+1), 4096)
				if err != nil || len(res) == 0 {
					continue
				}
				runtime.Gosched() // widen the window for a clear to overtake us
				b, release := p.View(res[0].Offset, res[0].Length)
				pattern(b, k)
				release()
				if r.IntN(10) == 0 {
					p.AbortWrite(res)
				} else {
					p.FinishWrite(res)
				}
			}
		}()
		wg.Add(1)
		go func() { // reader
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 2))
			want := make([]byte, 4096)
			for range 3000 {
				k := r.IntN(universe)
				if p.ReserveReadPrefix(keyRange(k, k+1), 1) != 1 {
					continue
				}
				ref, ok := p.HoldRead(key(k))
				if !ok {
					bad.Do(func() { badMsg = fmt.Sprintf("key %d read-locked but not locatable", k) })
					continue
				}
				b, release := p.View(ref.Offset, ref.Length)
				pattern(want, k)
				runtime.Gosched()
				if !bytes.Equal(b, want) {
					bad.Do(func() { badMsg = fmt.Sprintf("key %d served other bytes", k) })
				}
				release()
				p.ReleaseRead([]ReadRef{ref})
			}
		}()
	}
	clearer := make(chan struct{})
	go func() {
		defer close(clearer)
		for {
			select {
			case <-stop:
				return
			default:
				p.Clear()
				p.Maintain()
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-clearer
	if badMsg != "" {
		t.Fatal(badMsg)
	}
	p.Clear()
	if s := p.Stats(); s.Objects != 0 || s.Doomed != 0 || s.LockedBytes != 0 || s.LockOwners != 0 || s.UsedBytes != 0 || s.LiveBytes != 0 || s.WriteLocked+s.ReadLocked != 0 {
		t.Fatalf("left over after the run: %+v", s)
	}
}

// TestHeldEndsWithTheHoldsEra: Held is true while a hold is in force, also
// across a Clear (the object is doomed but its bytes stay), and false once
// its era ended: released, or expired even when a newer reader locked the
// same object again.
func TestHeldEndsWithTheHoldsEra(t *testing.T) {
	p, c := newPool(t, 4, func(o *Options) { o.ReadTTL = 10 * time.Second })
	store(t, p, keyRange(0, 2), 4096)
	p.ReserveReadPrefix(keyRange(0, 2), 1)
	a, _ := p.HoldRead(key(0))
	b, _ := p.HoldRead(key(1))
	if !p.Held(a) || !p.Held(b) {
		t.Fatal("fresh holds not held")
	}
	p.Clear()
	if !p.Held(a) {
		t.Fatal("a Clear ended a hold whose bytes it must keep")
	}
	p.ReleaseRead([]ReadRef{a})
	if p.Held(a) {
		t.Fatal("released hold still held")
	}
	store(t, p, keyRange(2, 3), 4096)
	p.ReserveReadPrefix(keyRange(2, 3), 1)
	r, _ := p.HoldRead(key(2))
	c.Advance(11 * time.Second)
	p.ReserveReadPrefix(keyRange(2, 3), 1) // a new era on the same object
	if p.Held(r) || p.Held(b) {
		t.Fatal("an expired hold is still held")
	}
	if p.Held(ReadRef{}) || p.Held(ReadRef{rec: 1 << 20, lock: 1}) {
		t.Fatal("a zero or out-of-range ref is held")
	}
}

// TestReholdOutlastsTheHoldsItCopies: Rehold's holds keep an object whose
// other holds all ended (its bytes stay through a Clear and a store that
// needs the room), all or none; a released ref cannot be re-held.
func TestReholdOutlastsTheHoldsItCopies(t *testing.T) {
	p, _ := newPool(t, 2, func(o *Options) { o.ReadTTL = 10 * time.Second })
	store(t, p, keyRange(0, 2), 4096)
	p.ReserveReadPrefix(keyRange(0, 2), 1)
	a, _ := p.HoldRead(key(0))
	b, _ := p.HoldRead(key(1))
	extra, ok := p.Rehold([]ReadRef{a, b})
	if !ok || len(extra) != 2 {
		t.Fatalf("Rehold of two live holds = %d, %v", len(extra), ok)
	}
	p.ReleaseRead([]ReadRef{a, b})
	p.Clear()
	if !p.HeldAll(extra) {
		t.Fatal("the re-held objects went with the holds they copied")
	}
	if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(2, 3), 4096); err == nil {
		t.Fatal("a store took the room of objects still re-held (pool of two)")
	}
	p.ReleaseRead(extra)
	if p.HeldAll(extra) {
		t.Fatal("released re-holds still held")
	}
	if _, ok := p.Rehold([]ReadRef{a}); ok {
		t.Fatal("a released ref was re-held")
	}
}
