package reliability

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kvdock/core/engine"
	"kvdock/core/l1"
	"kvdock/core/protocol"

	"kvdock/tests/harness"
)

// TestMemoryPressure stores three times the pool through four workers (two
// SHM, two pickle) while a poller checks the live objects never exceed the
// pool's size;
// then every chunk still retrievable must be byte-correct; then, with the
// whole pool write-locked, a further reservation is an allocation failure.
func TestMemoryPressure(t *testing.T) {
	const sizeMiB, nw, per = 4, 4, 4 // chunks per store
	cfg := harness.EngineConfig(t, sizeMiB)
	e := harness.StartEngine(t, cfg)
	ws := make([]*harness.GoWorker, nw)
	for i := range ws {
		ws[i] = harness.NewWorker(t, harness.DialPort(t, cfg.Server.Port, 5*time.Second), int64(i+1), "pressure", i%2 == 1)
	}
	chunk, cb := ws[0].Chunk, ws[0].ChunkBytes
	size := e.Snapshot().Pool.Size
	seqs := int(3*size/int64(cb)) / per // three pools' worth of chunks

	live := watchLive(e)
	var wg sync.WaitGroup
	var stored, errs atomic.Int64
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := i; s < seqs; s += nw {
				data := make([][]byte, per)
				for j := range data {
					data[j] = harness.ChunkData(s, j, cb)
				}
				r, err := w.Store(context.Background(), harness.Tokens(s, per, chunk), data, fmt.Sprint("p", s))
				if err != nil {
					errs.Add(1)
					t.Errorf("store %d: %v", s, err)
					return
				}
				if r == "true" {
					stored.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	over, maxLive := live()
	p := e.Snapshot().Pool
	t.Logf("stored %d of %d sequences (%d MiB through a %d MiB pool); max live %d of %d; evictions %d",
		stored.Load(), seqs, int64(seqs*per*cb)>>20, size>>20, maxLive, size, p.Evictions)
	if over > 0 {
		t.Fatalf("live objects exceeded the pool's size in %d samples (max %d > %d)", over, maxLive, size)
	}
	if p.LiveBytes > p.Size || p.LiveBytes != p.UsedBytes {
		t.Fatalf("after the run: live %d bytes, allocated %d, size %d", p.LiveBytes, p.UsedBytes, p.Size)
	}
	if p.Evictions == 0 {
		t.Fatal("three pools' worth stored and nothing evicted")
	}
	if errs.Load() > 0 {
		t.FailNow()
	}

	// Every retrievable chunk is the right one.
	var hits, checked int
	for s := range seqs {
		w := ws[s%nw]
		got, err := w.Retrieve(context.Background(), harness.Tokens(s, per, chunk), per, fmt.Sprint("v", s))
		if err != nil {
			t.Fatalf("retrieve %d: %v", s, err)
		}
		if got == nil {
			continue
		}
		hits++
		for j, g := range got {
			checked++
			if harness.Sum(g) != harness.Sum(harness.ChunkData(s, j, cb)) {
				t.Fatalf("sequence %d chunk %d (%s worker): wrong bytes under pressure", s, j, w.Mode())
			}
		}
	}
	if hits == 0 {
		t.Fatal("nothing retrievable after the pressure run")
	}
	t.Logf("%d sequences still cached, %d chunks checked, 0 mismatches", hits, checked)

	// As much write-locked as one instance may lock (half the pool): the
	// reservations refused past that are counted, as no space or lock cap.
	if _, err := e.ClearCache(engine.ClearByHTTP); err != nil {
		t.Fatal(err)
	}
	w := ws[0]
	cleared := e.Snapshot().Pool
	before := cleared.AllocFailures + cleared.LockCapRefusals
	locked := 0
	for s := 0; ; s++ {
		k := w.Key(harness.Tokens(100000+s, per, chunk), per, fmt.Sprint("lock", s))
		r, err := w.C.Call(context.Background(), protocol.PrepareStore, k, w.ID)
		if err != nil {
			t.Fatalf("prepare_store while filling: %v", err)
		}
		var ps harness.PrepStore
		if err := r.Decode(&ps); err != nil {
			t.Fatal(err)
		}
		locked += len(ps.Context.Slots)
		if len(ps.Context.Slots) < per {
			break
		}
		if s > int(size/int64(cb)) {
			t.Fatal("the pool never filled")
		}
	}
	p = e.Snapshot().Pool
	refused := p.AllocFailures + p.LockCapRefusals
	// The pickle workers' first SHM reservations, given up by their pickle
	// commits, stay doomed until their write TTL: a worker's slots are
	// never freed under a copy that may still run. They (and any read lock
	// the clear found held, doomed too) were there before the fill: the
	// fill's write locks are the ones added since.
	// The cap is the instance's: its write locks stay within it (other
	// owners' locks, a lookup's read lock still held, count apart).
	align := int64(l1.DefaultAlign) // engineConfig keeps the default
	mine := int64(locked) * ((int64(cb) + align - 1) / align * align)
	if refused <= before || p.WriteLocked-cleared.WriteLocked != locked || p.LiveBytes > p.Size || mine > p.OwnerLockCap {
		t.Fatalf("pool full of write locks: refusals %d (before %d), write locked %d (doomed %d) of %d reserved, read locked %d, locked %d bytes (doomed %d, cap %d), live %d/%d",
			refused, before, p.WriteLocked, p.Doomed, locked, p.ReadLocked, p.LockedBytes, p.DoomedBytes, p.OwnerLockCap, p.LiveBytes, p.Size)
	}
	t.Logf("write-locked %d chunks (%d bytes, cap %d); refusals %d", locked, p.LockedBytes, p.OwnerLockCap, refused-before)
}

// watchLive samples the pool's live bytes (the sum of its objects' extents,
// doomed ones included) until the returned func is called, which reports how
// many samples exceeded the pool's size and the largest seen. UsedBytes would
// not do: it is Size minus the allocator's free bytes and cannot exceed Size
// even when extents overlap.
func watchLive(e *engine.Engine) func() (over int, maxLive int64) {
	stop := make(chan struct{})
	done := make(chan struct{})
	var n int
	var most int64
	go func() {
		defer close(done)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			p := e.Snapshot().Pool
			if p.LiveBytes > p.Size {
				n++
			}
			most = max(most, p.LiveBytes)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return func() (int, int64) {
		close(stop)
		<-done
		return n, most
	}
}
