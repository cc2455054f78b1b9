package engine

import (
	"errors"
	"testing"
	"time"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/misses"
	"kvdock/core/testkit/chunks"
	"kvdock/core/testkit/fakeclock"
	"kvdock/core/whatif"
)

func ikey(i int) keys.ObjectKey { return chunks.Key(i) }

func ikeys(from, to int) []keys.ObjectKey { return chunks.Keys(from, to) }

// observedPool is a pool of units×4096 bytes wired as buildDataPlane wires it:
// its observer feeds the ghost the classifier reads.
func observedPool(t testing.TB, units int64, mod func(*l1.Options)) (*l1.Pool, *misses.Classifier, *fakeclock.Clock) {
	t.Helper()
	c := fakeclock.New()
	ghost := misses.NewGhost(misses.DefaultGhostEntries)
	o := l1.Options{Size: units * 4096, Align: 4096, Now: c.Now, OwnerLockShare: 1, TotalLockShare: 1,
		Observer: insight{whatif.New(whatif.Options{PoolBytes: units * 4096}), ghost, nil}, ObserveMax: ghost.Entries()}
	if mod != nil {
		mod(&o)
	}
	p, err := l1.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, misses.NewClassifier(p, ghost), c
}

func storeKeys(t testing.TB, p *l1.Pool, ks []keys.ObjectKey) {
	t.Helper()
	res, err := p.ReserveWrite(l1.InstanceOwner(1), ks, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if !p.FinishWrite(res) {
		t.Fatal("FinishWrite of a fresh reservation answered false")
	}
}

func wantWhy(t *testing.T, cl *misses.Classifier, k keys.ObjectKey, want misses.Reason) {
	t.Helper()
	var c misses.Counts
	cl.ClassifyMisses([]keys.ObjectKey{k}, 1, misses.AfterMiss, &c)
	if c[want] != 1 || c.Total() != 1 {
		t.Fatalf("key %d missed as %v, want %v", k.Chunk[0], c, want)
	}
}

// Each way the pool loses a key reaches the miss reasons through the
// observer.
func TestInsightClassifiesEachReason(t *testing.T) {
	t.Run("never stored and after miss", func(t *testing.T) {
		p, cl, _ := observedPool(t, 4, nil)
		storeKeys(t, p, ikeys(0, 1))
		wantWhy(t, cl, ikey(9), misses.NeverStored)
		wantWhy(t, cl, ikey(0), misses.AfterMiss)
	})
	t.Run("evicted", func(t *testing.T) {
		p, cl, _ := observedPool(t, 4, nil)
		storeKeys(t, p, ikeys(0, 4))
		storeKeys(t, p, ikeys(4, 6)) // evicts 0 and 1, LRU first
		wantWhy(t, cl, ikey(0), misses.Evicted)
		wantWhy(t, cl, ikey(2), misses.AfterMiss)
	})
	t.Run("expired, aborted", func(t *testing.T) {
		p, cl, c := observedPool(t, 4, func(o *l1.Options) { o.WriteTTL = 10 * time.Second })
		res, err := p.ReserveWrite(l1.InstanceOwner(1), ikeys(0, 3), 4096)
		if err != nil {
			t.Fatal(err)
		}
		wantWhy(t, cl, ikey(0), misses.NeverStored) // being written: not stored yet
		p.ExpireWrite(res[1:2])
		p.AbortWrite(res[2:])
		wantWhy(t, cl, ikey(1), misses.Expired)
		wantWhy(t, cl, ikey(2), misses.NeverStored) // aborted: never readable
		c.Advance(11 * time.Second)
		wantWhy(t, cl, ikey(0), misses.Expired)
	})
	t.Run("cleared", func(t *testing.T) {
		p, cl, _ := observedPool(t, 4, nil)
		storeKeys(t, p, ikeys(0, 2))
		if _, err := p.ReserveWrite(l1.InstanceOwner(1), ikeys(2, 3), 4096); err != nil {
			t.Fatal(err)
		}
		p.Clear() // 2 is write-locked: doomed, still cleared
		wantWhy(t, cl, ikey(0), misses.Cleared)
		wantWhy(t, cl, ikey(2), misses.Cleared)
		storeKeys(t, p, ikeys(3, 4))
		p.Delete(ikeys(3, 4))
		wantWhy(t, cl, ikey(3), misses.Cleared)
		storeKeys(t, p, ikeys(0, 1))
		wantWhy(t, cl, ikey(0), misses.AfterMiss) // present again: the old reason is not reported
	})
	t.Run("refused", func(t *testing.T) {
		p, cl, _ := observedPool(t, 4, func(o *l1.Options) { o.Policy = l1.PolicyNoop })
		storeKeys(t, p, ikeys(0, 3))
		if _, err := p.ReserveWrite(l1.InstanceOwner(1), ikeys(3, 5), 4096); !errors.Is(err, l1.ErrNoSpace) {
			t.Fatalf("err %v, want no space", err)
		}
		wantWhy(t, cl, ikey(4), misses.Refused)
	})
	t.Run("other layout", func(t *testing.T) {
		p, cl, _ := observedPool(t, 4, nil)
		k := ikey(1)
		k.KVRank = keys.KVRank(2, 1)
		storeKeys(t, p, []keys.ObjectKey{k})
		wantWhy(t, cl, ikey(1), misses.OtherLayout)
	})
}

// Stores, evictions, clears and classification race each other without a
// data race or a lost chunk (run with -race).
func TestInsightClassifyConcurrent(t *testing.T) {
	p, cl, _ := observedPool(t, 32, nil)
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 300 {
				ks := ikeys(g*1000+i, g*1000+i+4)
				if res, err := p.ReserveWrite(l1.InstanceOwner(int64(g)), ks, 4096); err == nil {
					p.FinishWrite(res)
				}
				var c misses.Counts
				cl.ClassifyMisses(ikeys(g*1000, g*1000+i), 1, misses.AfterMiss, &c)
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
	p, cl, _ := observedPool(b, 1024, nil)
	storeKeys(b, p, ikeys(0, 64))
	p.Delete(ikeys(0, 32)) // half the batch in the ghost, half never stored
	absent := append(ikeys(0, 32), ikeys(5000, 5032)...)
	var c misses.Counts
	b.Run("classify-64-missed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			cl.ClassifyMisses(absent, 1, misses.AfterMiss, &c)
		}
	})
	b.Run("reference-lock-64-hits", func(b *testing.B) {
		hits := ikeys(32, 64)
		for b.Loop() {
			p.ReserveReadPrefix(hits, 1)
			p.FinishRead(hits, 1)
			p.ReserveReadPrefix(hits, 1)
			p.FinishRead(hits, 1)
		}
	})
}
