// Package attack holds the hostile local peers of docs/RELIABILITY.md:
// each attack is a function run against a real kvdock, alone in its own
// test and all in sequence in TestHostilePeersCombined. After every attack
// the server must answer NOOP within 1 s; memory bounds are ratios of the
// bytes the attacker sent. The kit they use (tests/harness/attackkit) is
// shared with the other hostile tests in tests/reliability.
package attack

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/core/testkit/poll"
	"kvdock/settings"
	"kvdock/tests/harness"
	"kvdock/tests/harness/attackkit"
	"kvdock/transfer/torchpickle"
)

func clearVia(t testing.TB, srv *harness.Server, c *client.Client, zmqClear bool) {
	t.Helper()
	if !zmqClear {
		attackkit.PostClear(t, srv)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := c.Call(ctx, protocol.Clear); err != nil {
		t.Fatalf("ZMQ CLEAR: %v", err)
	}
}

// --- 1: clear during in-flight SHM transfers ---

// attackClearDuringStore: A reserves, a clear runs, B reserves, both write,
// A commits, B commits. A clear must not hand A's locked slots to B: A's
// commit answers false and publishes nothing, B reads B's bytes.
func attackClearDuringStore(t *testing.T, srv *harness.Server, base int64, zmqClear bool) {
	ctx := context.Background()
	a := harness.NewWorker(t, srv.Dial(t, srv.Protocol), base+1, "clear-store", false)
	b := harness.NewWorker(t, srv.Dial(t, srv.Protocol), base+2, "clear-store", false)
	if a.Shm == nil || b.Shm == nil {
		t.Fatal("the server advertises no segment")
	}
	clearVia(t, srv, a.C, zmqClear) // an empty pool: A gets the allocator's first slots
	ta, tb := harness.Tokens(int(base)+1, 2, a.Chunk), harness.Tokens(int(base)+2, 2, b.Chunk)
	da, db := attackkit.SeqData(int(base)+1, 2, a.ChunkBytes), attackkit.SeqData(int(base)+2, 2, b.ChunkBytes)
	psA, err := attackkit.PrepareStore(ctx, a, ta, 2, "clear-a")
	if err != nil || len(psA.Context.Slots) != 2 {
		t.Fatalf("A prepare: %d slots, %v", len(psA.Context.Slots), err)
	}
	clearVia(t, srv, a.C, zmqClear)
	psB, err := attackkit.PrepareStore(ctx, b, tb, 2, "clear-b")
	if err != nil || len(psB.Context.Slots) != 2 {
		t.Fatalf("B prepare: %d slots, %v", len(psB.Context.Slots), err)
	}
	overlap := false
	for _, x := range psA.Context.Slots {
		for _, y := range psB.Context.Slots {
			if x.Offset < y.Offset+y.Length && y.Offset < x.Offset+x.Length {
				overlap = true
			}
		}
	}
	if err := attackkit.WriteSlots(b, psB, db); err != nil {
		t.Fatal(err)
	}
	if err := attackkit.WriteSlots(a, psA, da); err != nil {
		t.Fatal(err)
	}
	okA, errA := attackkit.CommitStore(ctx, a, ta, 2, "clear-a", []byte{})
	okB, errB := attackkit.CommitStore(ctx, b, tb, 2, "clear-b", []byte{})
	t.Logf("clear during store (zmq=%v): slots overlap %v, A commit %v (%v), B commit %v (%v)", zmqClear, overlap, okA, errA, okB, errB)
	if overlap {
		t.Errorf("after the clear B was given slots that A still holds locked")
	}
	if okA {
		t.Errorf("A's commit of a reservation the clear overtook answered true")
	}
	if !okB || errB != nil {
		t.Errorf("B's commit: %v %v", okB, errB)
	}
	attackkit.ReadBack(t, b, tb, db, "clear-rb")
	if n, err := harness.Lookup(ctx, a.C, a.Model, ta, "clear-la"); err != nil || n != 0 {
		t.Errorf("A's overtaken reservation was published: %d hits (%v)", n, err)
	}
	attackkit.Alive(t, srv, time.Second, "a clear during a store")
}

// attackClearDuringRetrieve: R holds read slots of X, a clear runs, W
// stores Y; R's copy must still be X's bytes.
func attackClearDuringRetrieve(t *testing.T, srv *harness.Server, base int64, zmqClear bool) {
	ctx := context.Background()
	w := harness.NewWorker(t, srv.Dial(t, srv.Protocol), base+1, "clear-read", false)
	r := harness.NewWorker(t, srv.Dial(t, srv.Protocol), base+2, "clear-read", false)
	if w.Shm == nil || r.Shm == nil {
		t.Fatal("the server advertises no segment")
	}
	clearVia(t, srv, w.C, zmqClear)
	tx, ty := harness.Tokens(int(base)+1, 2, w.Chunk), harness.Tokens(int(base)+3, 2, w.Chunk)
	dx, dy := attackkit.SeqData(int(base)+1, 2, w.ChunkBytes), attackkit.SeqData(int(base)+3, 2, w.ChunkBytes)
	if res, err := w.Store(ctx, tx, dx, "clear-sx"); err != nil || res != "true" {
		t.Fatalf("store X: %q %v", res, err)
	}
	if n, err := harness.LookupKeep(ctx, r.C, r.Model, tx, "clear-rx"); err != nil || n != 2 {
		t.Fatalf("lookup X: %d %v", n, err)
	}
	k := r.Key(tx, 2, "clear-rx")
	rep, err := r.C.Call(ctx, protocol.PrepareRetrieve, k, r.ID)
	var pr harness.PrepRetrieve
	if err == nil {
		err = rep.Decode(&pr)
	}
	if err != nil || !pr.Success || len(pr.Context.Slots) != 2 {
		t.Fatalf("prepare retrieve X: %+v %v", pr.Success, err)
	}
	clearVia(t, srv, w.C, zmqClear)
	resY, errY := w.Store(ctx, ty, dy, "clear-sy")
	bad := 0
	for i, s := range pr.Context.Slots {
		if s.Offset < 0 || s.Offset+s.Length > int64(len(r.Shm)) {
			t.Fatalf("slot %+v outside the mapping", s)
		}
		if !bytes.Equal(r.Shm[s.Offset:s.Offset+s.Length], dx[i]) {
			bad++
		}
	}
	t.Logf("clear during retrieve (zmq=%v): store of Y after the clear %q (%v); %d of 2 read chunks changed under the reader", zmqClear, resY, errY, bad)
	if bad > 0 {
		t.Errorf("a reader holding X's slots read other bytes after a clear (%d of 2 chunks)", bad)
	}
	_, _ = r.C.Call(ctx, protocol.CommitRetrieve, k, r.ID)
	_, _ = r.C.Call(ctx, protocol.EndSession, "clear-rx")
	attackkit.ReadBack(t, w, ty, dy, "clear-ry")
	attackkit.Alive(t, srv, time.Second, "a clear during a retrieve")
}

// --- 2: a bad commit with the victim's instance id ---

func contextMode(t testing.TB, srv *harness.Server, id int64) string {
	t.Helper()
	for _, c := range srv.Status(t).Contexts {
		if c.InstanceID == id {
			return c.Mode
		}
	}
	return ""
}

func attackBadCommitMode(t *testing.T, srv *harness.Server, base int64) {
	ctx := context.Background()
	v := harness.NewWorker(t, srv.Dial(t, srv.Protocol), base+1, "victim", false)
	if v.Shm == nil {
		t.Fatal("the server advertises no segment")
	}
	atk := srv.DialWith(t, srv.Protocol, 500*time.Millisecond)
	wid := 0
	garbage := func(seed int) {
		k := protocol.Key{ModelName: "anything", WorldSize: 1, WorkerID: &wid, TokenIDs: harness.Tokens(seed, 1, v.Chunk),
			End: v.Chunk, RequestID: "evil"}
		_, _ = atk.Call(ctx, protocol.CommitStore, k, v.ID, []byte{0x00})
	}
	before := contextMode(t, srv, v.ID)
	garbage(int(base) + 9)
	after := contextMode(t, srv, v.ID)
	t.Logf("victim mode %q → %q after a garbage COMMIT_STORE with its instance id", before, after)
	if after != before {
		t.Errorf("a garbage commit with the victim's instance id switched it from %q to %q", before, after)
	}
	toks, data := harness.Tokens(int(base)+1, 2, v.Chunk), attackkit.SeqData(int(base)+1, 2, v.ChunkBytes)
	if res, err := v.Store(ctx, toks, data, "victim-1"); err != nil || res != "true" {
		t.Errorf("victim store after the bad commit: %q %v (SHM slots withheld?)", res, err)
	} else {
		attackkit.ReadBack(t, v, toks, data, "victim-r1")
	}
	// With a reservation pending: the garbage must not abort it.
	toks2, data2 := harness.Tokens(int(base)+2, 2, v.Chunk), attackkit.SeqData(int(base)+2, 2, v.ChunkBytes)
	ps, err := attackkit.PrepareStore(ctx, v, toks2, 2, "victim-2")
	if err != nil || len(ps.Context.Slots) != 2 {
		t.Fatalf("victim prepare: %d slots %v", len(ps.Context.Slots), err)
	}
	garbage(int(base) + 10)
	if err := attackkit.WriteSlots(v, ps, data2); err != nil {
		t.Fatal(err)
	}
	ok, err := attackkit.CommitStore(ctx, v, toks2, 2, "victim-2", []byte{})
	if !ok || err != nil {
		t.Errorf("victim's pending SHM store was aborted by another peer's garbage commit: %v %v", ok, err)
	} else {
		attackkit.ReadBack(t, v, toks2, data2, "victim-r2")
	}
	attackkit.Alive(t, srv, time.Second, "garbage commits with the victim's id")
}

// --- 5: nested msgpack ---

func attackNestedMsgpack(t *testing.T, srv *harness.Server, base int64) {
	const depth = 8 << 20
	raw := attackkit.DialRaw(t, srv, false)
	k := protocol.Key{ModelName: "nest", WorldSize: 1, TokenIDs: harness.Tokens(1, 1, attackkit.AttackChunk), End: attackkit.AttackChunk, RequestID: "nest"}
	before := attackkit.Handled(t, srv, protocol.Lookup)
	raw.Send(t, protocol.Lookup, attackkit.NestedMap(t, k, depth), attackkit.Enc(t, 1))
	attackkit.WaitHandled(t, srv, protocol.Lookup, before+1, 10*time.Second, "a nested LOOKUP key")
	attackkit.Alive(t, srv, time.Second, "a LOOKUP key with 8 MiB of nested arrays")
	reg := protocol.RegisterPayload{InstanceID: base + 1, ModelName: "nest", WorldSize: 1, BlockSize: 16, NumLayers: harness.WorkerLayers,
		HiddenDimSize: harness.WorkerHidden, DtypeStr: "float32"}
	before = attackkit.Handled(t, srv, protocol.RegisterKVCacheNonGPUContext)
	raw.Send(t, protocol.RegisterKVCacheNonGPUContext, attackkit.NestedMap(t, reg, depth))
	attackkit.WaitHandled(t, srv, protocol.RegisterKVCacheNonGPUContext, before+1, 10*time.Second, "a nested registration")
	attackkit.Alive(t, srv, time.Second, "a registration with 8 MiB of nested arrays")
	t.Logf("nested msgpack: 2 frames of %d levels (8 MiB each) sent, server answers", depth)
}

// --- 6: CPU bomb pickle ---

func attackCPUBomb(t *testing.T, srv *harness.Server, base int64) {
	ctx := context.Background()
	p := harness.NewWorker(t, srv.DialWith(t, srv.Protocol, 5*time.Minute), base+1, "cpu-bomb", true)
	v := harness.NewWorker(t, srv.Dial(t, srv.Protocol), base+2, "cpu-victim", false)
	toks := harness.Tokens(int(base)+1, 1, p.Chunk)
	k := p.Key(toks, 1, "bomb")
	if _, err := p.C.Call(ctx, protocol.PrepareStore, k, p.ID); err != nil {
		t.Fatal(err)
	}
	bomb := attackkit.CPUBombPickle(4096)
	before := attackkit.Handled(t, srv, protocol.CommitStore)
	go func() { _, _ = p.C.Call(ctx, protocol.CommitStore, k, p.ID, bomb) }()
	done := attackkit.WatchHandled(t, srv, protocol.CommitStore, before)
	attackkit.WaitBusy(t, srv, done, 10*time.Second)
	vctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	res, err := v.Store(vctx, harness.Tokens(int(base)+2, 1, v.Chunk), attackkit.SeqData(int(base)+2, 1, v.ChunkBytes), "cpu-victim")
	wall := time.Since(start)
	t.Logf("CPU bomb: %d-byte pickle; another worker's store took %v (%q %v)", len(bomb), wall.Round(time.Millisecond), res, err)
	if err != nil || wall > 2*time.Second {
		t.Errorf("another worker's PREPARE_STORE + COMMIT_STORE took %v (%v) behind a %d-byte pickle, bound 2 s", wall, err, len(bomb))
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Errorf("the CPU-bomb commit was still being decoded 5 s later")
	}
	attackkit.Alive(t, srv, time.Second, "a CPU-bomb pickle")
}

// --- 7: quadratic reserve ---

func attackQuadraticReserve(t *testing.T, srv *harness.Server, base int64) {
	ctx := context.Background()
	// The victim looks up chunks it stored: a registered model, so the
	// LOOKUP goes to the pool.
	v := harness.NewWorker(t, srv.DialWith(t, srv.Protocol, 30*time.Second), base+2, "quad-victim", false)
	probe := harness.Tokens(int(base)+2, 2, v.Chunk)
	if res, err := v.Store(ctx, probe, attackkit.SeqData(int(base)+2, 2, v.ChunkBytes), "quad-v"); err != nil || res != "true" {
		t.Fatalf("victim store: %q %v", res, err)
	}
	a := harness.NewWorker(t, srv.Dial(t, srv.Protocol), base+1, "quad", false) // SHM: PREPARE_STORE reserves
	n := 16 << 20
	wid := 0
	k := protocol.Key{ModelName: "quad", WorldSize: 1, WorkerID: &wid, TokenIDs: attackkit.SmallTokens(n, 5), End: n, RequestID: "quad"}
	atk := srv.DialWith(t, srv.Protocol, 2*time.Minute)
	before := attackkit.Handled(t, srv, protocol.PrepareStore)
	start := time.Now()
	done := attackkit.AwaitCall(func() error {
		_, err := atk.Call(ctx, protocol.PrepareStore, k, a.ID)
		return err
	})
	finished := attackkit.WatchHandled(t, srv, protocol.PrepareStore, before)
	var worst time.Duration
	lookups := 0
	atkRes := "no answer"
loop:
	for lookups < 5000 {
		select {
		case err := <-done:
			atkRes = fmt.Sprint("answered: ", err)
			break loop
		case <-finished:
			break loop
		default:
		}
		t0 := time.Now()
		hits, err := harness.Lookup(ctx, v.C, v.Model, probe, fmt.Sprintf("quad-%d", lookups))
		d := time.Since(t0)
		lookups++
		worst = max(worst, d)
		if err != nil || d > 2*time.Second || hits != 2 {
			t.Errorf("a LOOKUP took %v (%d of 2 hits, %v) while a %d-token PREPARE_STORE was handled, bound 2 s", d, hits, err, n)
			break
		}
	}
	select {
	case <-done:
	case <-finished:
	case <-time.After(60 * time.Second):
		t.Errorf("the %d-token PREPARE_STORE was still running 60 s later", n)
	}
	t.Logf("quadratic reserve: %d-token PREPARE_STORE (%d chunks, %s) handled in %v; %d concurrent LOOKUPs, slowest %v",
		n, n/attackkit.AttackChunk, atkRes, time.Since(start).Round(time.Millisecond), lookups, worst.Round(time.Millisecond))
	attackkit.Alive(t, srv, time.Second, "a 16M-token PREPARE_STORE")
}

// --- 8: lock pinning ---

// pinWriteTTL is the write TTL (seconds) of the servers the lock-pinning
// attack runs on: the reservations it abandons hold their bytes that long.
const pinWriteTTL = 4

func attackLockPinning(t *testing.T, srv *harness.Server, base int64) {
	ctx := context.Background()
	v := harness.NewWorker(t, srv.Dial(t, srv.Protocol), base+3, "pin-victim", false)
	victim := func(seed int, what string) {
		t.Helper()
		tv, dv := harness.Tokens(seed, 2, v.Chunk), attackkit.SeqData(seed, 2, v.ChunkBytes)
		res, err := v.Store(ctx, tv, dv, fmt.Sprintf("pin-v%d", seed))
		if err != nil || res != "true" {
			t.Errorf("another worker could not store while one peer %s: %q %v", what, res, err)
			return
		}
		if n, err := harness.Lookup(ctx, v.C, v.Model, tv, fmt.Sprintf("pin-vl%d", seed)); err != nil || n != 2 {
			t.Errorf("another worker's stored chunks while one peer %s: %d of 2 hits (%v)", what, n, err)
			return
		}
		attackkit.ReadBack(t, v, tv, dv, fmt.Sprintf("pin-vr%d", seed))
	}

	// Write pinning: PREPARE_STOREs of the whole pool (one request, then
	// batches until nothing more is granted), never committed; then the
	// attacker unregisters (its reservations go).
	w := harness.NewWorker(t, srv.Dial(t, srv.Protocol), base+1, "pin", false)
	capChunks := int(srv.Status(t).Pool.CapacityBytes / int64(w.ChunkBytes))
	ps, err := attackkit.PrepareStore(ctx, w, harness.Tokens(int(base)+2, capChunks, w.Chunk), capChunks, "pin-hog")
	granted := len(ps.Context.Slots)
	t.Logf("lock pinning: PREPARE_STORE of the whole pool (%d chunks) got %d slots (%v)", capChunks, granted, err)
	for b := 0; b < 2*capChunks/64; b++ {
		ps, err := attackkit.PrepareStore(ctx, w, harness.Tokens(int(base)*1000+b, 64, w.Chunk), 64, fmt.Sprintf("pin-hog%d", b))
		if err != nil || len(ps.Context.Slots) == 0 {
			break
		}
		granted += len(ps.Context.Slots)
	}
	st := srv.Status(t).Pool
	t.Logf("lock pinning: one peer holds %d write reservations; pool %d write-locked, %d of %d bytes used", granted, st.WriteLocked, st.UsedBytes, st.CapacityBytes)
	attackkit.Alive(t, srv, time.Second, "whole-pool PREPARE_STOREs")
	victim(int(base)+3, "write-locked the free pool")
	// Its unregister abandons the reservations: a worker's slots come back
	// at their write TTL, never under a copy that may still run.
	_, _ = w.C.Call(ctx, protocol.UnregisterKVCache, w.ID)
	poll.Until(t, 4*pinWriteTTL*time.Second, "the abandoned reservations' write TTL", func() bool {
		return srv.Status(t).Pool.WriteLocked == 0
	})

	// Read pinning: the attacker fills the pool and looks everything up
	// with tp_size 2^31, never ending its sessions.
	a := harness.NewWorker(t, srv.Dial(t, srv.Protocol), base+2, "pin", false)
	atk := srv.DialWith(t, srv.Protocol, 5*time.Second)
	const per = 64
	batches := 2 * capChunks / per // twice the pool: every chunk ends up pinned
	stored, locked := 0, 0
	for b := range batches {
		toks := harness.Tokens(int(base)*100+b, per, a.Chunk)
		if res, err := a.Store(ctx, toks, attackkit.SeqData(int(base)*100+b, per, a.ChunkBytes), fmt.Sprintf("pin-s%d", b)); err == nil && res == "true" {
			stored += per
		}
		lk := protocol.Key{ModelName: "pin", WorldSize: 1, TokenIDs: toks, End: len(toks), RequestID: fmt.Sprintf("pin-l%d", b)}
		// A refused LOOKUP gets no reply under seed profiles: wait briefly.
		lctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		if _, err := atk.Call(lctx, protocol.Lookup, lk, int64(1)<<31); err == nil {
			locked++
		}
		cancel()
	}
	attackkit.Alive(t, srv, time.Second, "LOOKUPs with tp_size 2^31")
	st = srv.Status(t).Pool
	t.Logf("lock pinning: %d chunks stored, %d LOOKUPs with tp_size 2^31; pool %d read-locked, %d of %d bytes used",
		stored, locked, st.ReadLocked, st.UsedBytes, st.CapacityBytes)
	victim(int(base)+4, "read-pinned the pool")
}

// --- 9: memory bomb pickle ---

func attackMemoryBomb(t *testing.T, srv *harness.Server, base int64) {
	size := 8 << 20
	if attackkit.AttackFull() {
		size = 32 << 20
	}
	ctx := context.Background()
	p := harness.NewWorker(t, srv.DialWith(t, srv.Protocol, 2*time.Minute), base+1, "mem-bomb", true)
	k := p.Key(harness.Tokens(int(base)+1, 1, p.Chunk), 1, "mem-bomb")
	if _, err := p.C.Call(ctx, protocol.PrepareStore, k, p.ID); err != nil {
		t.Fatal(err)
	}
	bomb := attackkit.MemoryBombPickle(size)
	var res string
	b, peak := attackkit.PeakGrowth(t, srv.PID(), func() {
		start := time.Now()
		r, err, fin := attackkit.CallHandled(t, srv, p.C, 30*time.Second, protocol.CommitStore, k, p.ID, bomb)
		var ok bool
		if err == nil && r.Present {
			_ = r.Decode(&ok)
		}
		res = fmt.Sprintf("accepted=%v (%v), handled=%v in %v", ok, err, fin, time.Since(start).Round(time.Millisecond))
		if ok {
			t.Errorf("a list of 8M ints was accepted as tensors")
		}
	})
	attackkit.Alive(t, srv, time.Second, "a memory-bomb pickle")
	t.Logf("memory bomb: %s", res)
	attackkit.CheckBound(t, "memory-bomb pickle", b, peak, 4*int64(len(bomb))/attackkit.KiB+64<<10, int64(len(bomb)))
}

// --- 10: key expansion ---

func attackKeyExpansion(t *testing.T, srv *harness.Server, base int64) {
	n := 4 << 20
	if attackkit.AttackFull() {
		n = 15 << 20
	}
	ctx := context.Background()
	c := srv.DialWith(t, srv.Protocol, 30*time.Second)
	// A layout for (expand, 255) must be registered, or LOOKUP exits early.
	if _, err := c.Call(ctx, protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{InstanceID: base + 1, ModelName: "expand",
		WorldSize: 255, BlockSize: 16, NumLayers: harness.WorkerLayers, HiddenDimSize: harness.WorkerHidden, DtypeStr: "float32"}); err != nil {
		t.Fatalf("register world_size 255: %v", err)
	}
	k := protocol.Key{ModelName: "expand", WorldSize: 255, TokenIDs: attackkit.SmallTokens(n, 7), End: n, RequestID: "expand"}
	sent := int64(len(attackkit.Enc(t, k)))
	var hits string
	b, peak := attackkit.PeakGrowth(t, srv.PID(), func() {
		start := time.Now()
		if _, err, _ := attackkit.CallHandled(t, srv, c, 20*time.Second, protocol.Lookup, k, 1); err != nil {
			hits = fmt.Sprintf("lookup: %v after %v", err, time.Since(start).Round(time.Millisecond))
			return
		}
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			r, err := c.Call(ctx, protocol.QueryPrefetchStatus, "expand")
			if err != nil {
				hits = "query: " + err.Error()
				return
			}
			if r.Present {
				var n int
				_ = r.Decode(&n)
				hits = fmt.Sprintf("%d hits after %v", n, time.Since(start).Round(time.Millisecond))
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		hits = "never answered"
	})
	_, _ = c.Call(ctx, protocol.EndSession, "expand")
	attackkit.Alive(t, srv, time.Second, "a world_size 255 LOOKUP")
	t.Logf("key expansion: LOOKUP of %d tokens, world_size 255 (%d chunks × 255 ranks): %s", n, n/attackkit.AttackChunk, hits)
	attackkit.CheckBound(t, "world_size 255 LOOKUP", b, peak, 4*sent/attackkit.KiB+64<<10, sent)
}

// --- 11: slow readers ---

func attackSlowReader(t *testing.T, srv *harness.Server, base int64) {
	const reqs = 40
	nch := 128 // 8 MiB per reply
	if attackkit.AttackFull() {
		nch = 256
	}
	ctx := context.Background()
	p := harness.NewWorker(t, srv.DialWith(t, srv.Protocol, time.Minute), base+1, "slow-reader", true)
	toks, data := harness.Tokens(int(base)+1, nch, p.Chunk), attackkit.SeqData(int(base)+1, nch, p.ChunkBytes)
	if res, err := p.Store(ctx, toks, data, "slow-s"); err != nil || res != "true" {
		t.Fatalf("store %d chunks: %q %v", nch, res, err)
	}
	// One LOOKUP with tp_size 40 takes the 40 read locks the retrieves use.
	if hits := lockReads(t, p.C, p.Model, toks, "slow-l", reqs); hits != nch {
		t.Fatalf("only %d of %d stored chunks are cached: nothing to retrieve", hits, nch)
	}
	raw := attackkit.DialRaw(t, srv, true)
	before := attackkit.Handled(t, srv, protocol.PrepareRetrieve)
	replyBytes := int64(reqs) * int64(nch) * int64(p.ChunkBytes)
	b, peak := attackkit.PeakGrowth(t, srv.PID(), func() {
		for i := range reqs {
			raw.Send(t, protocol.PrepareRetrieve, attackkit.Enc(t, p.Key(toks, nch, fmt.Sprintf("slow-%d", i))), attackkit.Enc(t, p.ID))
		}
		if !attackkit.WaitHandled(t, srv, protocol.PrepareRetrieve, before+reqs, time.Minute, "40 unread retrieves") {
			t.Errorf("40 legitimate PREPARE_RETRIEVEs were not all handled")
		}
	})
	attackkit.Alive(t, srv, time.Second, "40 PREPARE_RETRIEVEs never read")
	// What the server keeps for a peer that does not read is its reply
	// budget (server.queued_reply_bytes_per_peer, waiting here and held by
	// libzmq together), or one reply when that is larger; the Go copy of a
	// reply is garbage once it is copied out. Bound: the default budget,
	// one reply, and 64 MiB for the Go heap and malloc's slack.
	budget := settings.Default().Server.QueuedReplyBytesPerPeer
	oneReply := int64(nch) * int64(p.ChunkBytes)
	attackkit.CheckBound(t, "40 unread PREPARE_RETRIEVE replies", b, peak, (budget+oneReply)/attackkit.KiB+64<<10, replyBytes)
	raw.Close()
	_, _ = p.C.Call(ctx, protocol.UnregisterKVCache, p.ID)
}

// --- 12: inbound queue ---

// The server stops reading a peer whose queued payloads pass its share of
// --queued-request-bytes (a quarter of the 256 MiB default); libzmq then
// holds at most its receive queue of inboundRecvHWM messages for that peer,
// and TCP pushes back on the sender. Memory therefore stops growing with
// what the peer sends: the bound is the pool, that many messages plus the
// two in hand, the peer's request budget and 64 MiB, and the attack sends
// twice that. Here the peer's worker keeps up, so even a server without the
// read stop stays under the bound; the queue behind a worker that is really
// busy is core/rpc's TestQueuedRequestBytesBounded.
const inboundRecvHWM, inboundPeerBudget = 16, 64 << 20

func attackInboundQueue(t *testing.T, srv *harness.Server, base int64) {
	n, size := 64, 16<<20
	if attackkit.AttackFull() {
		size = 64 << 20
	}
	ctx := context.Background()
	// Legitimate commits of 16 MiB each (256 chunks of a real layout, each
	// message another sequence), pipelined on one peer: the worker copies
	// every one into the pool while the next ones arrive.
	p := harness.NewWorker(t, srv.DialWith(t, srv.Protocol, time.Minute), base+1, "inbound", true)
	nch := size / p.ChunkBytes
	ts := make([]torchpickle.Tensor, nch)
	for i := range ts {
		ts[i] = torchpickle.Tensor{Dtype: "float32", Shape: []int{2, harness.WorkerLayers, p.Chunk, harness.WorkerHidden}, Data: harness.ChunkData(int(base), i, p.ChunkBytes)}
	}
	pk, err := torchpickle.AppendEncode(nil, ts)
	if err != nil {
		t.Fatal(err)
	}
	payload, idf := attackkit.Enc(t, pk), attackkit.Enc(t, p.ID)
	raw := attackkit.DialRaw(t, srv, false)
	before := attackkit.Handled(t, srv, protocol.CommitStore)
	pool0 := srv.Status(t).Pool
	sent := int64(n) * int64(len(payload))
	b, peak := attackkit.PeakGrowth(t, srv.PID(), func() {
		for i := range n {
			raw.Send(t, protocol.CommitStore, attackkit.Enc(t, p.Key(harness.Tokens(int(base)+i, nch, p.Chunk), nch, "inbound")), idf, payload)
		}
		if !attackkit.WaitHandled(t, srv, protocol.CommitStore, before+int64(n), time.Minute, fmt.Sprintf("%d large commits", n)) {
			t.Errorf("%d legitimate commits were not all handled", n)
		}
	})
	raw.Close()
	attackkit.Alive(t, srv, time.Second, fmt.Sprintf("%d large requests at once", n))
	// Every chunk of every commit was reserved and published: none was
	// refused, doomed or finished stale. (Which of them the pool still
	// holds is the eviction policy's choice: prefix, the default, may let
	// the newest prompt of a pool with no reuse seen go first.)
	pool1 := srv.Status(t).Pool
	reserved := pool1.WriteReservations - pool0.WriteReservations
	last := harness.Tokens(int(base)+n-1, nch, p.Chunk)
	hits, err := harness.Lookup(ctx, p.C, p.Model, last, "inbound-l")
	t.Logf("inbound queue: %d of %d chunks reserved; the last of %d commits: %d of %d chunks cached (%v)", reserved, n*nch, n, hits, nch, err)
	if reserved != uint64(n*nch) || pool1.AllocationFailures != pool0.AllocationFailures ||
		pool1.WriteDoomed != pool0.WriteDoomed || pool1.StaleFinishes != pool0.StaleFinishes {
		t.Errorf("%d legitimate commits of %d chunks: %d chunks reserved, allocation failures %d → %d, doomed %d → %d, stale finishes %d → %d",
			n, nch, reserved, pool0.AllocationFailures, pool1.AllocationFailures, pool0.WriteDoomed, pool1.WriteDoomed, pool0.StaleFinishes, pool1.StaleFinishes)
	}
	// The pool's own pages count once touched: the bound allows for them.
	capKiB := srv.Status(t).Pool.CapacityBytes / attackkit.KiB
	bound := capKiB + (inboundRecvHWM+2)*int64(size)/attackkit.KiB + inboundPeerBudget/attackkit.KiB + 64<<10
	if sent/attackkit.KiB < 2*bound {
		t.Fatalf("the attack sends %d KiB, not twice the bound of %d KiB: it would not tell a bound from none", sent/attackkit.KiB, bound)
	}
	attackkit.CheckBound(t, fmt.Sprintf("%d × %d MiB requests", n, size>>20), b, peak, bound, sent)
}

// --- 13: unbounded ids, names and registrations ---

func attackIdsAndNames(t *testing.T, srv *harness.Server, base int64) {
	idSize, names, regs := 4<<20, 4<<20, 20000
	if attackkit.AttackFull() {
		idSize, names, regs = 8<<20, 16<<20, 200000
	}
	// A worker is registered, as it would be when a peer turns hostile.
	harness.NewWorker(t, srv.Dial(t, srv.Protocol), base+99, "ids-worker", false)
	c := srv.DialWith(t, srv.Protocol, time.Minute)
	var sent int64
	// A message the server drops unseen (libzmq's size cap) is never
	// counted: after one such, the rest of that kind would be dropped too.
	call := func(name string, args ...any) bool {
		_, _, fin := attackkit.CallHandled(t, srv, c, 10*time.Second, name, args...)
		return fin
	}
	b, peak := attackkit.PeakGrowth(t, srv.PID(), func() {
		for i := range 30 {
			id := strings.Repeat(string(rune('a'+i%26)), idSize) + fmt.Sprint(i)
			k := protocol.Key{ModelName: "ids", WorldSize: 1, TokenIDs: harness.Tokens(i, 1, attackkit.AttackChunk), End: attackkit.AttackChunk, RequestID: id}
			sent += int64(idSize)
			if !call(protocol.Lookup, k, 1) {
				break
			}
		}
		for i := range 2 {
			name := strings.Repeat("m", names) + fmt.Sprint(i)
			sent += 2 * int64(names)
			if !call(protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{InstanceID: base + 1 + int64(i),
				ModelName: name, WorldSize: 1, BlockSize: 16, NumLayers: harness.WorkerLayers, HiddenDimSize: harness.WorkerHidden, DtypeStr: "float32"}) {
				break
			}
			k := protocol.Key{ModelName: name, WorldSize: 1, TokenIDs: harness.Tokens(i, 1, attackkit.AttackChunk), End: attackkit.AttackChunk, RequestID: "n"}
			if !call(protocol.Lookup, k, 1) {
				break
			}
		}
	})
	attackkit.Alive(t, srv, time.Second, "long request ids and model names")
	attackkit.CheckBound(t, "long request ids and model names", b, peak, sent/4/attackkit.KiB+64<<10, sent)

	// The registrations are pipelined on one raw peer; their replies are
	// not read (a refused one may get none).
	raw := attackkit.DialRaw(t, srv, false)
	before := attackkit.Handled(t, srv, protocol.RegisterKVCacheNonGPUContext)
	start := time.Now()
	for i := range regs {
		raw.Send(t, protocol.RegisterKVCacheNonGPUContext, attackkit.Enc(t, protocol.RegisterPayload{InstanceID: base + 100 + int64(i),
			ModelName: "flood", WorldSize: 1, BlockSize: 16, NumLayers: harness.WorkerLayers, HiddenDimSize: harness.WorkerHidden, DtypeStr: "float32"}))
	}
	attackkit.WaitHandled(t, srv, protocol.RegisterKVCacheNonGPUContext, before+int64(regs), time.Minute, "a registration flood")
	wall := time.Since(start)
	raw.Close()
	attackkit.Alive(t, srv, time.Second, fmt.Sprintf("%d registrations", regs))
	st := srv.Status(t)
	sb := attackkit.StatusBytes(t, srv, 30*time.Second)
	t.Logf("%d registrations handled in %v; %d instances registered; /status is %d bytes", regs, wall.Round(time.Millisecond), st.Transfer.Instances, sb)
	if sb >= 1<<20 {
		t.Errorf("/status is %d bytes after %d registrations and %d-byte names, bound 1 MiB", sb, regs, names)
	}
}

// --- 14: log flood ---

func attackLogFlood(t *testing.T, srv *harness.Server, logPath string, base int64) {
	names, n := 4<<20, 2
	if attackkit.AttackFull() {
		names, n = 8<<20, 4
	}
	ctx := context.Background()
	// A registered instance whose keys name another model: each store fails
	// with both names in the reason.
	w := harness.NewWorker(t, srv.Dial(t, srv.Protocol), base+1, "log", false)
	raw := attackkit.DialRaw(t, srv, false)
	before := attackkit.FileSize(logPath)
	bp, bl, br := attackkit.Handled(t, srv, protocol.PrepareStore), attackkit.Handled(t, srv, protocol.Lookup), attackkit.Handled(t, srv, protocol.RegisterKVCacheNonGPUContext)
	var sent int64
	wid := 0
	for i := range n {
		name := strings.Repeat("L", names) + fmt.Sprint(i)
		k := protocol.Key{ModelName: name, WorldSize: 1, WorkerID: &wid, TokenIDs: harness.Tokens(i, 1, w.Chunk), End: w.Chunk, RequestID: "log"}
		raw.Send(t, protocol.PrepareStore, attackkit.Enc(t, k), attackkit.Enc(t, w.ID))
		raw.Send(t, protocol.Lookup, attackkit.Enc(t, k), attackkit.Enc(t, 1))
		// Registrations of the name with two layouts: each refused for the
		// name's length, each with the name in the reason.
		raw.Send(t, protocol.RegisterKVCacheNonGPUContext, attackkit.Enc(t, protocol.RegisterPayload{InstanceID: base + 10 + int64(2*i), ModelName: name,
			WorldSize: 1, BlockSize: 16, NumLayers: harness.WorkerLayers, HiddenDimSize: harness.WorkerHidden, DtypeStr: "float32"}))
		raw.Send(t, protocol.RegisterKVCacheNonGPUContext, attackkit.Enc(t, protocol.RegisterPayload{InstanceID: base + 11 + int64(2*i), ModelName: name,
			WorldSize: 1, BlockSize: 16, NumLayers: harness.WorkerLayers + 1, HiddenDimSize: harness.WorkerHidden, DtypeStr: "float32"}))
		sent += 4 * int64(names)
	}
	attackkit.WaitHandled(t, srv, protocol.PrepareStore, bp+int64(n), 20*time.Second, "huge model names")
	attackkit.WaitHandled(t, srv, protocol.Lookup, bl+int64(n), 20*time.Second, "huge model names")
	attackkit.WaitHandled(t, srv, protocol.RegisterKVCacheNonGPUContext, br+2*int64(n), 20*time.Second, "huge model names")
	raw.Close()
	for i := range n {
		_, _ = w.C.Call(ctx, protocol.UnregisterKVCache, base+10+int64(i))
	}
	attackkit.Alive(t, srv, time.Second, "errors with huge model names")
	grown := attackkit.FileSize(logPath) - before
	t.Logf("log flood: %d MiB of model names in %d requests; log grew %d bytes", sent>>20, 4*n, grown)
	if grown > 1<<20 {
		t.Errorf("the log grew by %d bytes on %d requests carrying %d MiB of model names, bound 1 MiB", grown, 4*n, sent>>20)
	}
}

// --- 15: idle HTTP connections ---

func attackIdleHTTP(t *testing.T, srv *harness.Server) {
	opened, closeAll := attackkit.IdleHTTP(t, srv.HTTPPort, 1100)
	defer closeAll()
	d, err := attackkit.HealthWithin(srv.HTTPPort, 2*time.Second)
	t.Logf("idle HTTP: %d keep-alive connections left idle (server limit 1,024 files); /healthcheck took %v (%v)", opened, d.Round(time.Millisecond), err)
	if err != nil {
		t.Errorf("/healthcheck did not answer within 2 s behind %d idle connections: %v", opened, err)
	}
	attackkit.Alive(t, srv, 2*time.Second, "1,100 idle HTTP connections")
}

// --- 17: layout overflow ---

func attackLayoutOverflow(t *testing.T, srv *harness.Server, base int64) {
	c := srv.DialWith(t, srv.Protocol, 2*time.Second)
	id := base + 1
	_, _, _ = attackkit.CallHandled(t, srv, c, 5*time.Second, protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{InstanceID: id,
		ModelName: "overflow", WorldSize: 1, BlockSize: 16, NumLayers: 1 << 30, HiddenDimSize: 1 << 24, DtypeStr: "float32", UseMLA: true})
	attackkit.Alive(t, srv, time.Second, "a layout overflowing int64")
	for _, ctx := range srv.Status(t).Contexts {
		if ctx.InstanceID == id {
			t.Errorf("an MLA layout of 2^30 layers × 256 tokens × 2^24 hidden float32 (2^64 bytes per chunk) registered (chunk bytes %d)", ctx.ChunkBytes)
		}
		if ctx.ChunkBytes <= 0 {
			t.Errorf("context %d registered with chunk bytes %d", ctx.InstanceID, ctx.ChunkBytes)
		}
	}
}

// --- 16: secrets in a reload diff ---

// TestHostileReloadKeepsTokenSecret: a SIGHUP that changes http.token must
// not write the old or the new token anywhere in the server's output.
func TestHostileReloadKeepsTokenSecret(t *testing.T) {
	const oldTok, newTok = "old-token-7c1f9a", "new-token-4e2b8d"
	cfg := filepath.Join(t.TempDir(), "kvdock.yaml")
	if err := os.WriteFile(cfg, []byte("http:\n  token: "+oldTok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := harness.Start(t, "--config", cfg)
	if err := os.WriteFile(cfg, []byte("http:\n  token: "+newTok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(srv.PID(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// Reloaded once /status takes the new token; main logs the outcome
	// ("SIGHUP: ...") after the apply.
	poll.Until(t, 15*time.Second, "the new token accepted", func() bool {
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/status", srv.HTTPPort), nil)
		req.Header.Set("Authorization", "Bearer "+newTok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	// Logged just after the apply; the limit only bounds a failure.
	poll.Until(t, 15*time.Second, "the reload logged", func() bool { return strings.Contains(srv.Output(), "SIGHUP: ") })
	attackkit.Alive(t, srv, 5*time.Second, "a token change by SIGHUP")
	out := srv.Output()
	for _, tok := range []string{oldTok, newTok} {
		if i := strings.Index(out, tok); i >= 0 {
			line := out[strings.LastIndex(out[:i], "\n")+1:]
			if j := strings.IndexByte(line, '\n'); j >= 0 {
				line = line[:j]
			}
			t.Errorf("the server wrote the http token %q in clear: %s", tok, line)
		}
	}
}

// --- 18: stale-segment cleanup ---

// TestHostileCleanupSparesUnlockedLiveSegment: a live pool segment of
// another name that nobody flocks (upstream LMCache does not lock its
// segment) must survive a kvdock start.
func TestHostileCleanupSparesUnlockedLiveSegment(t *testing.T) {
	name := harness.UniqueName("lmcache_l1_pool_other")
	path := filepath.Join("/dev/shm", name)
	if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(path) })
	srv := harness.Start(t)
	attackkit.Alive(t, srv, time.Second, "start")
	if _, err := os.Stat(path); err != nil {
		t.Errorf("kvdock's start removed %s, another server's unlocked segment: %v", name, err)
	}
}

// --- the tests ---

func TestHostileClearDuringStore(t *testing.T) {
	srv := attackkit.StartAttacked(t)
	t.Run("http", func(t *testing.T) { attackClearDuringStore(t, srv, 1000, false) })
	t.Run("zmq", func(t *testing.T) { attackClearDuringStore(t, srv, 1100, true) })
}

func TestHostileClearDuringRetrieve(t *testing.T) {
	srv := attackkit.StartAttacked(t)
	t.Run("zmq", func(t *testing.T) { attackClearDuringRetrieve(t, srv, 1200, true) })
	t.Run("http", func(t *testing.T) { attackClearDuringRetrieve(t, srv, 1300, false) })
}

func TestHostileBadCommitKeepsVictimMode(t *testing.T) {
	attackBadCommitMode(t, attackkit.StartAttacked(t), 2000)
}

// heavyRetrieves stores 8,000 chunks of 128 bytes (a 1-layer, hidden-1
// layout at --chunk-size 16) as one prefix, then queues 1,024 pickle
// PREPARE_RETRIEVEs of all of them from four peers that read every reply:
// each is ~8,000 copies out of the pool into a ~2 MiB reply, seconds of
// handler work in all. It returns once the first reply is in, with a
// function that waits for the readers and reports what they got.
func heavyRetrieves(t *testing.T, srv *harness.Server, id int64) func() string {
	t.Helper()
	// Chunks of 512 bytes: the pickle decoder's item budget (input/16
	// items) refuses thousands of tensors much smaller than that.
	const per, parts, peers, each, chunkTok, hid = 4000, 2, 4, 256, 16, 4
	ctx := context.Background()
	c := srv.DialWith(t, srv.Protocol, time.Minute)
	if _, err := c.Call(ctx, protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{InstanceID: id, ModelName: "heavy",
		WorldSize: 1, BlockSize: 16, NumLayers: 1, HiddenDimSize: hid, DtypeStr: "float32"}); err != nil {
		t.Fatal(err)
	}
	toks := attackkit.SmallTokens(parts*per*chunkTok, int(id))
	wid := 0
	key := func(start, end int, req string) protocol.Key {
		return protocol.Key{ModelName: "heavy", WorldSize: 1, WorkerID: &wid, TokenIDs: toks[:end], Start: start, End: end, RequestID: req}
	}
	// A pickle holds at most ~4,090 tensors (the decoder's stack): the
	// prefix is stored in two commits.
	for part := range parts {
		ts := make([]torchpickle.Tensor, per)
		for i := range ts {
			ts[i] = torchpickle.Tensor{Dtype: "float32", Shape: []int{2, 1, chunkTok, hid}, Data: harness.ChunkData(int(id), part*per+i, 2*chunkTok*hid*4)}
		}
		pk, err := torchpickle.AppendEncode(nil, ts)
		if err != nil {
			t.Fatal(err)
		}
		r, err := c.Call(ctx, protocol.CommitStore, key(part*per*chunkTok, (part+1)*per*chunkTok, "heavy-s"), id, pk)
		var ok bool
		if err == nil {
			err = r.Decode(&ok)
		}
		if err != nil || !ok {
			t.Fatalf("store part %d: %v %v", part, ok, err)
		}
	}
	// Every PREPARE_RETRIEVE consumes one read lock taken by a LOOKUP; a
	// LOOKUP with tp_size 255 takes 255 per chunk.
	for i := range (peers*each + 254) / 255 {
		lockReads(t, c, "heavy", toks, fmt.Sprintf("heavy-l%d", i), 255)
	}
	all := key(0, len(toks), "")
	raws := make([]*attackkit.RawPeer, peers)
	for i := range raws {
		raws[i] = attackkit.DialRaw(t, srv, false)
		for j := range each {
			all.RequestID = fmt.Sprintf("heavy-%d", i*each+j)
			raws[i].Send(t, protocol.PrepareRetrieve, attackkit.Enc(t, all), attackkit.Enc(t, id))
		}
	}
	// Each socket now belongs to its reader.
	var got, gotBytes atomic.Int64
	first := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for _, r := range raws {
		sock := r.Sock
		_ = sock.SetRcvtimeo(3 * time.Second)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				m, err := sock.RecvMessageBytes(0)
				if err != nil {
					return
				}
				got.Add(1)
				for _, f := range m {
					gotBytes.Add(int64(len(f)))
				}
				once.Do(func() { close(first) })
			}
		}()
	}
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("no retrieve answered within 30 s")
	}
	return func() string {
		wg.Wait()
		return fmt.Sprintf("%d of %d retrieves of %d chunks answered (%d MiB)", got.Load(), peers*each, parts*per, gotBytes.Load()>>20)
	}
}

// TestHostileStopUnderRetrieveLoad: a rebuild (SIGHUP with a changed
// l1.align_bytes) and then SIGTERM, each while more pickle retrieves are
// queued than the drain allows: the pool must not be unmapped under a
// handler (no runtime fault), the rebuild must be applied and the rebuilt
// server must serve, and SIGTERM must exit 0. Before the drain dropped
// queued requests, the backlog outlasted the drain: the rebuild was refused,
// and its rollback found the old socket still bound ("address already in
// use"), leaving the server without a wire front.
func TestHostileStopUnderRetrieveLoad(t *testing.T) {
	rounds := 1
	if attackkit.AttackFull() {
		rounds = 3
	}
	for round := range rounds {
		cfg := filepath.Join(t.TempDir(), "kvdock.yaml")
		if err := os.WriteFile(cfg, []byte("l1:\n  align_bytes: 128\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		srv := harness.Start(t, "--chunk-size", "16", "--shm-name", "", "--config", cfg, "--max-message-bytes", fmt.Sprint(128<<20))
		attackkit.CapProcess(t, srv.PID())

		wait := heavyRetrieves(t, srv, int64(3000+10*round))
		queued := attackkit.InFlight(t, srv)
		if err := os.WriteFile(cfg, []byte("l1:\n  align_bytes: 256\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := syscall.Kill(srv.PID(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		// The rebuild stops the wire server (the handlers running finish,
		// the queued requests are dropped), replaces the pool and serves
		// again. A client that connects before the old socket closes loses
		// its request with it, so the NOOP waits for the rebuild's outcome.
		poll.Until(t, 30*time.Second, "the rebuild's outcome logged", func() bool { return strings.Contains(srv.Output(), "SIGHUP: ") })
		if !strings.Contains(srv.Output(), "SIGHUP: applied") {
			t.Fatalf("round %d: the rebuild under load was not applied:\n%s", round, attackkit.GrepLines(srv.Output(), "SIGHUP"))
		}
		attackkit.Alive(t, srv, 5*time.Second, "a rebuild under retrieve load")
		t.Logf("round %d: rebuild with %d retrieves in flight; serving again after %v; %s", round, queued,
			time.Since(start).Round(time.Millisecond), wait())
		if f := attackkit.FatalIn(srv.Output()); f != "" {
			t.Fatalf("round %d: the server faulted in a rebuild under load:\n%s", round, f)
		}

		wait = heavyRetrieves(t, srv, int64(3001+10*round))
		queued = attackkit.InFlight(t, srv)
		start = time.Now()
		srv.StopWithin(t, 15*time.Second)
		wall := time.Since(start)
		t.Logf("round %d: SIGTERM with %d retrieves in flight; exit took %v; %s", round, queued, wall.Round(time.Millisecond), wait())
		if f := attackkit.FatalIn(srv.Output()); f != "" {
			t.Fatalf("round %d: the server faulted on SIGTERM under load:\n%s", round, f)
		}
	}
}

func lockReads(t testing.TB, c *client.Client, model string, toks []uint32, req string, tp int) int {
	t.Helper()
	ctx := context.Background()
	k := protocol.Key{ModelName: model, WorldSize: 1, TokenIDs: toks, End: len(toks), RequestID: req}
	if _, err := c.Call(ctx, protocol.Lookup, k, tp); err != nil {
		t.Fatalf("lookup: %v", err)
	}
	for range 500 {
		r, err := c.Call(ctx, protocol.QueryPrefetchStatus, req)
		if err != nil {
			t.Fatalf("query prefetch status: %v", err)
		}
		if r.Present {
			var n int
			if err := r.Decode(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatal("prefetch never finished")
	return 0
}

func TestHostileNestedMsgpack(t *testing.T) { attackNestedMsgpack(t, attackkit.StartAttacked(t), 4000) }

func TestHostileCPUBombPickle(t *testing.T) { attackCPUBomb(t, attackkit.StartAttacked(t), 5000) }

func TestHostileQuadraticReserve(t *testing.T) {
	attackQuadraticReserve(t, attackkit.StartAttacked(t), 6000)
}

func TestHostileLockPinning(t *testing.T) {
	attackLockPinning(t, attackkit.StartAttacked(t, "--l1-write-ttl-seconds", fmt.Sprint(pinWriteTTL)), 7000)
}

func TestHostileMemoryBombPickle(t *testing.T) { attackMemoryBomb(t, attackkit.StartAttacked(t), 8000) }

func TestHostileKeyExpansion(t *testing.T) { attackKeyExpansion(t, attackkit.StartAttacked(t), 8500) }

func TestHostileSlowReaders(t *testing.T) { attackSlowReader(t, attackkit.StartAttacked(t), 9000) }

func TestHostileInboundQueue(t *testing.T) { attackInboundQueue(t, attackkit.StartAttacked(t), 10000) }

func TestHostileIdsAndNames(t *testing.T) { attackIdsAndNames(t, attackkit.StartAttacked(t), 11000) }

func TestHostileLogFlood(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "kvdock.log")
	attackLogFlood(t, attackkit.StartAttacked(t, "--log-file", logPath), logPath, 12000)
}

func TestHostileIdleHTTPConnections(t *testing.T) { attackIdleHTTP(t, attackkit.StartAttacked(t)) }

func TestHostileLayoutOverflow(t *testing.T) {
	attackLayoutOverflow(t, attackkit.StartAttacked(t), 13000)
}

// TestHostilePeersCombined sends every attack above to one server (each
// followed by NOOP within 1 s), then a
// well-behaved SHM worker and a pickle worker store, look up and retrieve
// identical bytes, and the server's RSS returns to within 64 MiB of its
// start.
func TestHostilePeersCombined(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "kvdock.log")
	srv := attackkit.StartAttacked(t, "--log-file", logPath, "--l1-write-ttl-seconds", fmt.Sprint(pinWriteTTL))
	ctx := context.Background()
	good := []*harness.GoWorker{
		harness.NewWorker(t, srv.Dial(t, srv.Protocol), 90001, "good", false),
		harness.NewWorker(t, srv.Dial(t, srv.Protocol), 90002, "good", true),
	}
	if good[0].Shm == nil {
		t.Fatal("the server advertises no segment")
	}
	// The pickle worker fills the pool once (the server copies into every
	// page), then the cache is cleared: the pool's pages are in the
	// server's RSS from here on, and the comparison below sees only what
	// the attacks left behind.
	pw := good[1]
	per := 256
	for i := range int(srv.Status(t).Pool.CapacityBytes) / pw.ChunkBytes / per {
		if res, err := pw.Store(ctx, harness.Tokens(96000+i, per, pw.Chunk), attackkit.SeqData(96000+i, per, pw.ChunkBytes), "warm"); err != nil || res != "true" {
			t.Fatalf("warming the pool: %q %v", res, err)
		}
	}
	attackkit.PostClear(t, srv)
	startRSS := attackkit.ProcKiB(t, srv.PID(), "VmRSS")
	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"1 clear during store", func(t *testing.T) { attackClearDuringStore(t, srv, 1000, false) }},
		{"1 clear during retrieve", func(t *testing.T) { attackClearDuringRetrieve(t, srv, 1200, true) }},
		{"2 bad commit", func(t *testing.T) { attackBadCommitMode(t, srv, 2000) }},
		{"5 nested msgpack", func(t *testing.T) { attackNestedMsgpack(t, srv, 4000) }},
		{"6 CPU bomb", func(t *testing.T) { attackCPUBomb(t, srv, 5000) }},
		{"7 quadratic reserve", func(t *testing.T) { attackQuadraticReserve(t, srv, 6000) }},
		{"8 lock pinning", func(t *testing.T) { attackLockPinning(t, srv, 7000) }},
		{"9 memory bomb", func(t *testing.T) { attackMemoryBomb(t, srv, 8000) }},
		{"10 key expansion", func(t *testing.T) { attackKeyExpansion(t, srv, 8500) }},
		{"11 slow readers", func(t *testing.T) { attackSlowReader(t, srv, 9000) }},
		{"12 inbound queue", func(t *testing.T) { attackInboundQueue(t, srv, 10000) }},
		{"14 log flood", func(t *testing.T) { attackLogFlood(t, srv, logPath, 12000) }},
		{"15 idle HTTP", func(t *testing.T) { attackIdleHTTP(t, srv) }},
		{"17 layout overflow", func(t *testing.T) { attackLayoutOverflow(t, srv, 13000) }},
		// Last: a registration flood may fill --max-instances.
		{"13 ids and names", func(t *testing.T) { attackIdsAndNames(t, srv, 11000) }},
	}
	// KVDOCK_ATTACK_SKIP=5,7 leaves out the attacks of those points (while
	// their fixes are pending); a skipped step is reported as skipped.
	skip := map[string]bool{}
	for _, n := range strings.Split(os.Getenv("KVDOCK_ATTACK_SKIP"), ",") {
		skip[strings.TrimSpace(n)] = n != ""
	}
	for _, s := range steps {
		if skip[strings.Fields(s.name)[0]] {
			t.Run(s.name, func(t *testing.T) { t.Skip("KVDOCK_ATTACK_SKIP") })
			continue
		}
		if !t.Run(s.name, s.run) {
			// Keep going while the server answers: later attacks still tell.
			attackkit.Alive(t, srv, time.Second, s.name)
		}
	}
	for i, w := range good {
		toks, data := harness.Tokens(95000+i, 3, w.Chunk), attackkit.SeqData(95000+i, 3, w.ChunkBytes)
		if res, err := w.Store(ctx, toks, data, fmt.Sprintf("good-s%d", i)); err != nil || res != "true" {
			t.Errorf("%s worker store after the attacks: %q %v", w.Mode(), res, err)
			continue
		}
		if n, err := harness.Lookup(ctx, w.C, w.Model, toks, fmt.Sprintf("good-l%d", i)); err != nil || n != 3 {
			t.Errorf("%s worker lookup after the attacks: %d of 3 (%v)", w.Mode(), n, err)
		}
		attackkit.ReadBack(t, w, toks, data, fmt.Sprintf("good-r%d", i))
	}
	var rss int64
	deadline := time.Now().Add(10 * time.Second)
	for {
		rss = attackkit.ProcKiB(t, srv.PID(), "VmRSS")
		if rss-startRSS <= 64<<10 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("combined: RSS %s at start, %s after every attack and the good workers", attackkit.MiB(startRSS), attackkit.MiB(rss))
	if rss-startRSS > 64<<10 {
		t.Errorf("RSS %s after the attacks, %s at start: more than 64 MiB retained", attackkit.MiB(rss), attackkit.MiB(startRSS))
	}
}
