package l1

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
	"unsafe"

	"kvdock/core/keys"
)

// recorder keeps what the pool reported, one line an event.
type recorder struct{ got []string }

func (r *recorder) Stored(k *keys.ObjectKey, bytes int64) {
	r.got = append(r.got, fmt.Sprintf("stored %d %d", k.Chunk[0], bytes))
}

func (r *recorder) Lost(k *keys.ObjectKey, bytes int64, why Loss) {
	r.got = append(r.got, fmt.Sprintf("%v %d %d", why, k.Chunk[0], bytes))
}

func (r *recorder) Cleared() { r.got = append(r.got, "cleared all") }
func (r *recorder) Tick(watermark, ratio float64) {
	r.got = append(r.got, fmt.Sprintf("tick %v %v", watermark, ratio))
}

// take returns the events since the last take.
func (r *recorder) take() []string {
	got := r.got
	r.got = nil
	return got
}

func observed(t *testing.T, units int64, mod func(*Options)) (*Pool, *recorder, func(time.Duration)) {
	t.Helper()
	rec := &recorder{}
	p, c := newPool(t, units, func(o *Options) {
		o.Observer = rec
		if mod != nil {
			mod(o)
		}
	})
	return p, rec, c.Advance
}

func wantEvents(t *testing.T, r *recorder, want ...string) {
	t.Helper()
	if got := r.take(); !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}

func TestObserverHearsEachEvent(t *testing.T) {
	t.Run("stored with the rounded size, evicted", func(t *testing.T) {
		p, r, _ := observed(t, 4, nil)
		store(t, p, keyRange(0, 4), 100)
		wantEvents(t, r, "stored 0 4096", "stored 1 4096", "stored 2 4096", "stored 3 4096")
		store(t, p, keyRange(4, 6), 4096) // evicts 0 and 1, LRU first
		wantEvents(t, r, "evicted 0 4096", "evicted 1 4096", "stored 4 4096", "stored 5 4096")
		p.Maintain() // the loop evicts and ticks too
		wantEvents(t, r, "tick 0.8 0.2", "evicted 2 4096")
	})
	t.Run("expired", func(t *testing.T) {
		p, r, advance := observed(t, 4, func(o *Options) { o.WriteTTL = 10 * time.Second })
		res, err := p.ReserveWrite(InstanceOwner(1), keyRange(0, 2), 4096)
		if err != nil {
			t.Fatal(err)
		}
		r.take()
		p.ExpireWrite(res[:1]) // given up by the transfer: expired at once
		wantEvents(t, r, "expired 0 4096")
		advance(11 * time.Second)
		p.Maintain()
		wantEvents(t, r, "expired 1 4096", "tick 0.8 0.2")
	})
	t.Run("aborted", func(t *testing.T) {
		p, r, _ := observed(t, 4, nil)
		res, err := p.ReserveWrite(InstanceOwner(1), keyRange(0, 3), 4096)
		if err != nil {
			t.Fatal(err)
		}
		r.take()
		p.AbortWrite(res[:1])
		p.Abandon(res[1:2], nil)
		p.AbortWrite(res[:1]) // stale: nothing
		wantEvents(t, r, "aborted 0 4096", "aborted 1 4096")
		if p.FinishWrite(res) { // 0 and 1 overtaken: 2 goes too
			t.Fatal("a batch with an aborted reservation was published")
		}
		wantEvents(t, r, "aborted 2 4096")
	})
	t.Run("cleared and deleted", func(t *testing.T) {
		p, r, _ := observed(t, 8, nil)
		store(t, p, keyRange(0, 2), 4096)
		if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(2, 3), 4096); err != nil {
			t.Fatal(err)
		}
		r.take()
		p.Clear() // 2 is write-locked: doomed, reported with the others
		wantEvents(t, r, "cleared all", "cleared 0 4096", "cleared 1 4096", "cleared 2 4096")
		p.Clear() // the doomed record was reported already
		wantEvents(t, r, "cleared all")
		store(t, p, keyRange(3, 4), 4096)
		r.take()
		if p.Delete(keyRange(3, 4)) != 1 {
			t.Fatal("delete")
		}
		wantEvents(t, r, "cleared 3 4096")
	})
	t.Run("refused for space", func(t *testing.T) {
		p, r, _ := observed(t, 4, func(o *Options) { o.Policy = PolicyNoop })
		store(t, p, keyRange(0, 3), 4096)
		r.take()
		if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(2, 5), 4096); !errors.Is(err, ErrNoSpace) {
			t.Fatalf("err %v, want no space", err)
		}
		wantEvents(t, r, "refused 3 4096", "refused 4 4096") // 2 exists: not refused
		// A batch larger than the pool is refused before the table is read.
		if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(10, 15), 4096); !errors.Is(err, ErrNoSpace) {
			t.Fatalf("err %v", err)
		}
		wantEvents(t, r, "refused 10 4096", "refused 11 4096", "refused 12 4096", "refused 13 4096", "refused 14 4096")
	})
	t.Run("refused by a lock cap", func(t *testing.T) {
		p, r, _ := observed(t, 4, func(o *Options) { o.OwnerLockShare = 0.25 })
		if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(0, 2), 4096); !errors.Is(err, ErrLockCap) {
			t.Fatalf("err %v, want lock cap", err)
		}
		wantEvents(t, r, "refused 0 4096", "refused 1 4096")
	})
	t.Run("noop policy ticks nothing", func(t *testing.T) {
		p, r, _ := observed(t, 4, func(o *Options) { o.Policy = PolicyNoop })
		p.Maintain()
		wantEvents(t, r)
	})
}

// A Clear or a refusal of more objects than ObserveMax reports that many:
// for a Clear the most recently used, oldest first.
func TestObserveMaxBoundsOneCall(t *testing.T) {
	p, r, _ := observed(t, 64, func(o *Options) { o.ObserveMax = 3 })
	store(t, p, keyRange(0, 40), 4096)
	p.Touch(keyRange(0, 1)) // 0 is now the most recently used
	r.take()
	p.Clear()
	wantEvents(t, r, "cleared all", "cleared 38 4096", "cleared 39 4096", "cleared 0 4096")
	if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(100, 200), 4096); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("err %v", err)
	}
	wantEvents(t, r, "refused 100 4096", "refused 101 4096", "refused 102 4096")
}

// nopObserver counts what it is told and keeps nothing.
type nopObserver struct{ n int }

func (o *nopObserver) Stored(*keys.ObjectKey, int64)     { o.n++ }
func (o *nopObserver) Lost(*keys.ObjectKey, int64, Loss) { o.n++ }
func (o *nopObserver) Cleared()                          { o.n++ }
func (o *nopObserver) Tick(float64, float64)             { o.n++ }

// Reporting an eviction costs no allocation: the key is built in the pool.
func TestObserverAllocatesNothing(t *testing.T) {
	obs := &nopObserver{}
	p, _ := newPool(t, 4, func(o *Options) { o.Observer = obs })
	store(t, p, keyRange(0, 4), 4096)
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := testing.AllocsPerRun(100, func() { p.lost(p.t.lru, LossEvicted) }); n != 0 {
		t.Fatalf("%v allocations a report", n)
	}
	if obs.n == 0 {
		t.Fatal("nothing reported")
	}
}

func TestUnreadable(t *testing.T) {
	p, _ := newPool(t, 8, nil)
	store(t, p, keyRange(0, 2), 4096)
	if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(2, 3), 4096); err != nil {
		t.Fatal(err)
	}
	// 0, 1 readable; 2 being written; 3 absent.
	if m := p.Unreadable(keyRange(0, 4)); m != 0b1100 {
		t.Fatalf("mask %b, want 1100", m)
	}
	if !p.IsLocked(key(2)) {
		t.Fatal("2 not locked")
	}
	ks := keyRange(0, 70)
	if m := p.Unreadable(ks); m != ^uint64(0b11) {
		t.Fatalf("mask %b: keys past the 64th looked at or wrong", m)
	}
	p.ReserveReadPrefix(keyRange(0, 1), 1) // read-locked, then cleared: doomed
	p.Clear()
	if m := p.Unreadable(keyRange(0, 1)); m != 1 {
		t.Fatalf("a doomed object is readable: %b", m)
	}
}

func wsKey(i, ws, w int, model, salt string) keys.ObjectKey {
	k := key(i)
	k.Model, k.Salt, k.KVRank = model, salt, keys.KVRank(ws, w)
	return k
}

func TestStoredElsewhere(t *testing.T) {
	p, _ := newPool(t, 16, nil)
	elsewhere := func(k keys.ObjectKey) bool { return p.StoredElsewhere(&k) }
	// Workers of world size 2 stored chunk 1 (both ranks) and chunk 2 (rank 1 only).
	store(t, p, []keys.ObjectKey{wsKey(1, 2, 0, "m", ""), wsKey(1, 2, 1, "m", ""), wsKey(2, 2, 1, "m", "")}, 4096)
	for _, k := range []keys.ObjectKey{wsKey(1, 1, 0, "m", ""), wsKey(2, 1, 0, "m", ""), wsKey(1, 4, 3, "m", "")} {
		if !elsewhere(k) {
			t.Fatalf("%v: not found under world size 2", k)
		}
	}
	// Another model, another salt, another chunk, its own world size: not stored elsewhere.
	for _, k := range []keys.ObjectKey{wsKey(1, 1, 0, "n", ""), wsKey(1, 1, 0, "m", "tenant"), wsKey(3, 1, 0, "m", ""), wsKey(1, 2, 0, "m", "")} {
		if elsewhere(k) {
			t.Fatalf("%v: found elsewhere", k)
		}
	}
	// Gone from the other layout: no longer reported as stored there.
	p.Delete([]keys.ObjectKey{wsKey(1, 2, 0, "m", ""), wsKey(1, 2, 1, "m", "")})
	if elsewhere(wsKey(1, 1, 0, "m", "")) {
		t.Fatal("deleted chunk still found elsewhere")
	}
	// The world-size set is cleared with the name: a new name in that
	// slot does not inherit it.
	p.Delete([]keys.ObjectKey{wsKey(2, 2, 1, "m", "")})
	store(t, p, []keys.ObjectKey{wsKey(5, 1, 0, "x", "")}, 4096)
	if ws := p.t.nameWS[p.t.names[nameKey{"x", "", 0}]]; ws != (wsSet{1 << 1}) {
		t.Fatalf("recycled name slot holds world sizes %v", ws)
	}
	// Another layout of the same world size is elsewhere too; its own
	// layout's chunk is not, and neither is it once the other is gone.
	other := wsKey(7, 1, 0, "m", "")
	other.Layout = 2
	store(t, p, []keys.ObjectKey{other}, 4096)
	mine := other
	mine.Layout = 1
	if !elsewhere(mine) || elsewhere(other) {
		t.Fatalf("another layout's chunk: elsewhere %v for layout 1, %v for its own", elsewhere(mine), elsewhere(other))
	}
	p.Delete([]keys.ObjectKey{other})
	if elsewhere(mine) || len(p.t.layoutNames) != 1 {
		t.Fatalf("deleted layout still found elsewhere, or its name kept: %v", p.t.layoutNames)
	}
}

// A model stored under many world sizes costs a StoredElsewhere at most
// maxLayoutProbes table probes: a copy past the budget is not found.
func TestStoredElsewhereProbesBounded(t *testing.T) {
	p, _ := newPool(t, 64, nil)
	var ks []keys.ObjectKey
	for ws := 2; ws <= 30; ws++ { // world sizes 2..30 hold other chunks
		ks = append(ks, wsKey(100+ws, ws, 0, "m", ""))
	}
	ks = append(ks, wsKey(1, 255, 254, "m", "")) // chunk 1 only at the last rank of 255
	store(t, p, ks, 4096)
	if k := wsKey(1, 1, 0, "m", ""); p.StoredElsewhere(&k) { // 2+…+30 = 464 probes > 256
		t.Fatal("found past the probe budget")
	}
	// Within the budget the copy is found.
	p2, _ := newPool(t, 8, nil)
	store(t, p2, []keys.ObjectKey{wsKey(1, 200, 199, "m", "")}, 4096)
	if k := wsKey(1, 1, 0, "m", ""); !p2.StoredElsewhere(&k) {
		t.Fatal("not found within the budget")
	}
}

// The ExpireWrite of a reservation keeps its bytes until the write TTL
// while its key is free at once.
func TestExpireWriteKeepsBytes(t *testing.T) {
	p, clk := newPool(t, 4, nil)
	res, err := p.ReserveWrite(InstanceOwner(1), keyRange(0, 2), 4096)
	if err != nil {
		t.Fatal(err)
	}
	p.ExpireWrite(res[:1])
	p.AbortWrite(res[1:])
	if s := p.Stats(); s.Objects != 0 || s.UsedBytes != 4096 || s.Doomed != 1 {
		t.Fatalf("expired reservation: %+v", s)
	}
	if again, err := p.ReserveWrite(InstanceOwner(2), keyRange(0, 1), 4096); err != nil || len(again) != 1 || again[0].Offset == res[0].Offset {
		t.Fatalf("key of an expired reservation: %+v, %v", again, err)
	}
	p.ExpireWrite(res[:1]) // abandoned already: counted once
	if s := p.Stats(); s.AbandonedWrites != 1 {
		t.Fatalf("repeated expire: %+v", s)
	}
	clk.Advance(DefaultWriteTTL + time.Second)
	p.Maintain()
	if s := p.Stats(); s.UsedBytes != 0 || s.Doomed != 0 || s.LiveBytes != 0 {
		t.Fatalf("bytes of the expired reservation after its TTL: %+v", s)
	}
}

// Span covers the pool's memory until Close.
func TestSpan(t *testing.T) {
	p, _ := newPool(t, 4, nil)
	start, end, ok := p.Span()
	mem, release := p.View(0, 4*4096)
	defer release()
	if !ok || end-start != 4*4096 || start != uintptr(unsafe.Pointer(unsafe.SliceData(mem))) {
		t.Fatalf("span [%x, %x) %v", start, end, ok)
	}
	release()
	p.Close()
	if _, _, ok := p.Span(); ok {
		t.Fatal("span of a closed pool")
	}
}
