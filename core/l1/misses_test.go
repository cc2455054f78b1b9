package l1

import (
	"errors"
	"testing"
	"time"

	"kvdock/core/keys"
	"kvdock/core/misses"
)

// why classifies the single-key chunks ks and returns the reason of each.
func why(p *Pool, ks ...keys.ObjectKey) []misses.Reason {
	out := make([]misses.Reason, len(ks))
	for i, k := range ks {
		var c misses.Counts
		p.ClassifyMisses([]keys.ObjectKey{k}, 1, misses.AfterMiss, &c)
		for r, n := range c {
			if n == 1 && c.Total() == 1 {
				out[i] = misses.Reason(r)
			}
		}
	}
	return out
}

func wantWhy(t *testing.T, p *Pool, k keys.ObjectKey, want misses.Reason) {
	t.Helper()
	if got := why(p, k)[0]; got != want {
		t.Fatalf("key %v missed as %v, want %v", k, got, want)
	}
}

func TestClassifyEachReason(t *testing.T) {
	t.Run("never stored and after miss", func(t *testing.T) {
		p, _ := newPool(t, 4, nil)
		store(t, p, keyRange(0, 1), 4096)
		wantWhy(t, p, key(9), misses.NeverStored)
		wantWhy(t, p, key(0), misses.AfterMiss)
	})
	t.Run("evicted", func(t *testing.T) {
		p, _ := newPool(t, 4, nil)
		store(t, p, keyRange(0, 4), 4096)
		store(t, p, keyRange(4, 6), 4096) // evicts 0 and 1, LRU first
		wantWhy(t, p, key(0), misses.Evicted)
		wantWhy(t, p, key(1), misses.Evicted)
		wantWhy(t, p, key(2), misses.AfterMiss)
		// The eviction loop notes too.
		p.maintain()
		if s := p.Stats(); s.Evictions < 3 {
			t.Fatalf("loop evicted nothing: %+v", s)
		}
		wantWhy(t, p, key(2), misses.Evicted)
	})
	t.Run("expired", func(t *testing.T) {
		p, c := newPool(t, 4, func(o *Options) { o.WriteTTL = 10 * time.Second })
		if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(0, 1), 4096); err != nil {
			t.Fatal(err)
		}
		wantWhy(t, p, key(0), misses.NeverStored) // being written: not stored yet
		c.Advance(11 * time.Second)
		wantWhy(t, p, key(0), misses.Expired)
	})
	t.Run("cleared", func(t *testing.T) {
		p, _ := newPool(t, 4, nil)
		store(t, p, keyRange(0, 2), 4096)
		if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(2, 3), 4096); err != nil {
			t.Fatal(err)
		}
		p.Clear() // 2 is write-locked: doomed, still cleared
		wantWhy(t, p, key(0), misses.Cleared)
		wantWhy(t, p, key(2), misses.Cleared)
		store(t, p, keyRange(3, 4), 4096)
		if p.Delete(keyRange(3, 4)) != 1 {
			t.Fatal("delete")
		}
		wantWhy(t, p, key(3), misses.Cleared)
	})
	t.Run("refused for space", func(t *testing.T) {
		p, _ := newPool(t, 4, func(o *Options) { o.Policy = PolicyNoop })
		store(t, p, keyRange(0, 3), 4096)
		if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(3, 5), 4096); !errors.Is(err, ErrNoSpace) {
			t.Fatalf("err %v, want no space", err)
		}
		wantWhy(t, p, key(3), misses.Refused)
		wantWhy(t, p, key(4), misses.Refused)
		// A batch larger than the pool is refused before the table is read.
		if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(10, 15), 4096); !errors.Is(err, ErrNoSpace) {
			t.Fatalf("err %v", err)
		}
		wantWhy(t, p, key(14), misses.Refused)
	})
	t.Run("refused by a lock cap", func(t *testing.T) {
		p, _ := newPool(t, 4, func(o *Options) { o.OwnerLockShare = 0.25 })
		if _, err := p.ReserveWrite(InstanceOwner(1), keyRange(0, 2), 4096); !errors.Is(err, ErrLockCap) {
			t.Fatalf("err %v, want lock cap", err)
		}
		wantWhy(t, p, key(1), misses.Refused)
	})
	t.Run("stored again after a miss", func(t *testing.T) {
		p, _ := newPool(t, 4, nil)
		store(t, p, keyRange(0, 1), 4096)
		p.Clear()
		store(t, p, keyRange(0, 1), 4096)
		wantWhy(t, p, key(0), misses.AfterMiss) // present: the old reason is not reported
	})
}

func wsKey(i, ws, w int, model, salt string) keys.ObjectKey {
	k := key(i)
	k.Model, k.Salt, k.KVRank = model, salt, keys.KVRank(ws, w)
	return k
}

func TestClassifyOtherLayout(t *testing.T) {
	p, _ := newPool(t, 16, nil)
	// Workers of world size 2 stored chunk 1 (both ranks) and chunk 2 (rank 1 only).
	store(t, p, []keys.ObjectKey{wsKey(1, 2, 0, "m", ""), wsKey(1, 2, 1, "m", ""), wsKey(2, 2, 1, "m", "")}, 4096)
	wantWhy(t, p, wsKey(1, 1, 0, "m", ""), misses.OtherLayout)
	wantWhy(t, p, wsKey(2, 1, 0, "m", ""), misses.OtherLayout)
	wantWhy(t, p, wsKey(1, 4, 3, "m", ""), misses.OtherLayout)
	// Another model, another salt, another chunk: not the same prefix.
	wantWhy(t, p, wsKey(1, 1, 0, "n", ""), misses.NeverStored)
	wantWhy(t, p, wsKey(1, 1, 0, "m", "tenant"), misses.NeverStored)
	wantWhy(t, p, wsKey(3, 1, 0, "m", ""), misses.NeverStored)
	// Gone from the other layout: no longer reported as stored there.
	p.Delete([]keys.ObjectKey{wsKey(1, 2, 0, "m", ""), wsKey(1, 2, 1, "m", "")})
	wantWhy(t, p, wsKey(1, 1, 0, "m", ""), misses.NeverStored)
	// The world-size set is cleared with the name: a new name in that
	// slot does not inherit it.
	p.Delete([]keys.ObjectKey{wsKey(2, 2, 1, "m", "")})
	store(t, p, []keys.ObjectKey{wsKey(5, 1, 0, "x", "")}, 4096)
	if ws := p.t.nameWS[p.t.names[nameKey{"x", ""}]]; ws != (wsSet{1 << 1}) {
		t.Fatalf("recycled name slot holds world sizes %v", ws)
	}
}

// A chunk of several ranks is judged by its first unreadable key.
func TestClassifyMultiRankChunk(t *testing.T) {
	p, _ := newPool(t, 4, nil)
	store(t, p, []keys.ObjectKey{wsKey(1, 2, 0, "m", ""), wsKey(1, 2, 1, "m", "")}, 4096)
	p.Delete([]keys.ObjectKey{wsKey(1, 2, 1, "m", "")})
	var c misses.Counts
	p.ClassifyMisses([]keys.ObjectKey{wsKey(1, 2, 0, "m", ""), wsKey(1, 2, 1, "m", ""), wsKey(2, 2, 0, "m", ""), wsKey(2, 2, 1, "m", "")}, 2, misses.AfterMiss, &c)
	if c[misses.Cleared] != 1 || c[misses.NeverStored] != 1 || c.Total() != 2 {
		t.Fatalf("counts %v", c)
	}
	// A trailing partial chunk or a zero per is ignored, never a panic.
	p.ClassifyMisses([]keys.ObjectKey{wsKey(1, 2, 0, "m", "")}, 2, misses.AfterMiss, &c)
	p.ClassifyMisses(nil, 0, misses.AfterMiss, &c)
	if c.Total() != 2 {
		t.Fatalf("counts %v", c)
	}
}

// A clear of more objects than the ghost holds notes the most recently
// used ones.
func TestClearNotesNewestWithinGhost(t *testing.T) {
	p, _ := newPool(t, 64, nil)
	p.ghost = misses.NewGhost(8)
	store(t, p, keyRange(0, 40), 4096)
	p.Touch(keyRange(0, 1)) // 0 is now the most recently used
	p.Clear()
	if got := why(p, key(0), key(39))[0]; got != misses.Cleared {
		t.Fatalf("MRU key missed as %v", got)
	}
}

// A store the transfer module gives up (no commit in time) is expired; an
// explicit abort is not a loss of anything stored.
func TestExpireWriteNotesExpired(t *testing.T) {
	p, clk := newPool(t, 4, nil)
	res, err := p.ReserveWrite(InstanceOwner(1), keyRange(0, 2), 4096)
	if err != nil {
		t.Fatal(err)
	}
	p.ExpireWrite(res[:1])
	p.AbortWrite(res[1:])
	wantWhy(t, p, key(0), misses.Expired)
	wantWhy(t, p, key(1), misses.NeverStored)
	// The expired reservation's worker may still be copying: its bytes stay
	// until the write TTL, though its key is free at once.
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
	p.maintain()
	if s := p.Stats(); s.UsedBytes != 0 || s.Doomed != 0 || s.LiveBytes != 0 {
		t.Fatalf("bytes of the expired reservation after its TTL: %+v", s)
	}
}

// A model stored under many world sizes costs a missed chunk at most
// maxLayoutProbes table probes: a copy past the budget is not found.
func TestOtherLayoutProbesBounded(t *testing.T) {
	p, _ := newPool(t, 64, nil)
	var ks []keys.ObjectKey
	for ws := 2; ws <= 30; ws++ { // world sizes 2..30 hold other chunks
		ks = append(ks, wsKey(100+ws, ws, 0, "m", ""))
	}
	ks = append(ks, wsKey(1, 255, 254, "m", "")) // chunk 1 only at the last rank of 255
	store(t, p, ks, 4096)
	wantWhy(t, p, wsKey(1, 1, 0, "m", ""), misses.NeverStored) // 2+…+30 = 464 probes > 256
	// Within the budget the copy is found.
	p2, _ := newPool(t, 8, nil)
	store(t, p2, []keys.ObjectKey{wsKey(1, 200, 199, "m", "")}, 4096)
	wantWhy(t, p2, wsKey(1, 1, 0, "m", ""), misses.OtherLayout)
}

// Lookups, stores, evictions, clears and classification race each other
// without a data race or a lost invariant (run with -race).
func TestClassifyConcurrent(t *testing.T) {
	p, _ := newPool(t, 32, nil)
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 300 {
				ks := keyRange(g*1000+i, g*1000+i+4)
				if res, err := p.ReserveWrite(InstanceOwner(int64(g)), ks, 4096); err == nil {
					p.FinishWrite(res)
				}
				var c misses.Counts
				p.ClassifyMisses(keyRange(g*1000, g*1000+i), 1, misses.AfterMiss, &c)
				if c.Total() != uint64(i) {
					t.Errorf("classified %d of %d chunks", c.Total(), i)
					return
				}
				if i%50 == 0 {
					p.Clear()
				}
			}
		}()
	}
	for range 4 {
		<-done
	}
}

func BenchmarkClassifyMisses(b *testing.B) {
	p, _ := newPool(b, 1024, nil)
	present := keyRange(0, 64)
	res, err := p.ReserveWrite(InstanceOwner(1), present, 4096)
	if err != nil || !p.FinishWrite(res) {
		b.Fatal(err)
	}
	p.Delete(present[:32]) // half the batch in the ghost, half never stored
	absent := append(keyRange(0, 32), keyRange(5000, 5032)...)
	var c misses.Counts
	b.Run("classify-64-missed", func(b *testing.B) {
		for b.Loop() {
			p.ClassifyMisses(absent, 1, misses.AfterMiss, &c)
		}
	})
	b.Run("reference-lock-64-hits", func(b *testing.B) {
		hits := keyRange(32, 64)
		for b.Loop() {
			p.ReserveReadPrefix(hits, 1)
			p.FinishRead(hits, 1)
			p.ReserveReadPrefix(hits, 1)
			p.FinishRead(hits, 1)
		}
	})
}
