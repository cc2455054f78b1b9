package reliability

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"kvdock/core/protocol"

	"kvdock/tests/harness"
)

// prepareSlots sends PREPARE_STORE for n chunks of toks and decodes the slots.
func prepareSlots(t *testing.T, w *harness.GoWorker, toks []uint32, n int, req string) []slot {
	t.Helper()
	ps, err := w.Worker().PrepareStore(context.Background(), w.Key(toks, n, req))
	if err != nil {
		t.Fatalf("prepare_store: %v", err)
	}
	return ps.Slots
}

// commitSHM sends an SHM COMMIT_STORE (empty data) and decodes the answer.
func commitSHM(t *testing.T, w *harness.GoWorker, toks []uint32, n int, req string) bool {
	t.Helper()
	ok, err := w.Worker().CommitStore(context.Background(), w.Key(toks, n, req), nil)
	if err != nil {
		t.Fatalf("commit_store: %v", err)
	}
	return ok
}

func writeSlot(w *harness.GoWorker, s slot, data []byte) {
	if err := w.W.WriteSlot(s, data); err != nil {
		panic(err) // the slot came from prepare; one that does not fit is a server bug
	}
}

func readSlot(w *harness.GoWorker, s slot) []byte {
	v, err := w.W.SlotView(s)
	if err != nil {
		panic(err)
	}
	return bytes.Clone(v)
}

// TestClearDuringSHMTransfers sends CLEAR over the wire while SHM transfers
// are in flight. Write side: A prepares, CLEAR, B
// prepares the same size, B writes, A writes its slot late and commits: A's
// commit answers false and B reads back its own bytes. Read side: B holds K
// for reading (LOOKUP + PREPARE_RETRIEVE), CLEAR, C stores K again and a new
// key and writes its slots: B's slot still holds K's bytes until its
// COMMIT_RETRIEVE. A CLEAR that reset the allocator would give B A's slot,
// answer A's commit true, and land C's bytes in B's slot.
func TestClearDuringSHMTransfers(t *testing.T) {
	cfg := harness.EngineConfig(t, 4)
	harness.StartEngine(t, cfg)
	ctl := harness.DialPort(t, cfg.Server.Port, 5*time.Second)
	a := harness.NewWorker(t, harness.DialPort(t, cfg.Server.Port, 5*time.Second), 1, "clear", false)
	b := harness.NewWorker(t, harness.DialPort(t, cfg.Server.Port, 5*time.Second), 2, "clear", false)
	c := harness.NewWorker(t, harness.DialPort(t, cfg.Server.Port, 5*time.Second), 3, "clear", false)
	if a.Shm == nil || b.Shm == nil || c.Shm == nil {
		t.Fatal("workers did not attach the segment")
	}
	clearCache := func() {
		t.Helper()
		if _, err := ctl.Call(context.Background(), protocol.Clear); err != nil {
			t.Fatalf("CLEAR: %v", err)
		}
	}
	chunk, cb := a.Chunk, a.ChunkBytes

	// Write side.
	ta, tb := harness.Tokens(1, 1, chunk), harness.Tokens(2, 1, chunk)
	da, db := harness.ChunkData(1, 0, cb), harness.ChunkData(2, 0, cb)
	sa := prepareSlots(t, a, ta, 1, "a")
	clearCache()
	sb := prepareSlots(t, b, tb, 1, "b")
	if len(sa) != 1 || len(sb) != 1 {
		t.Fatalf("slots: A %v, B %v", sa, sb)
	}
	writeSlot(b, sb[0], db)
	writeSlot(a, sa[0], da) // A is late
	if commitSHM(t, a, ta, 1, "a") {
		t.Fatal("A's COMMIT_STORE of a reservation CLEAR overtook answered true")
	}
	if !commitSHM(t, b, tb, 1, "b") {
		t.Fatal("B's COMMIT_STORE answered false")
	}
	got, err := b.Retrieve(context.Background(), tb, 1, "rb")
	if err != nil || len(got) != 1 || !bytes.Equal(got[0], db) {
		t.Fatalf("B's chunk read back wrong after the clear (err %v)", err)
	}
	if n, _ := harness.Lookup(context.Background(), ctl, "clear", ta, "la"); n != 0 {
		t.Fatal("A's overtaken chunk was published")
	}

	// Read side.
	if n, err := harness.LookupKeep(context.Background(), ctl, "clear", tb, "hold"); err != nil || n != 1 {
		t.Fatalf("lookup of B's chunk: %d %v", n, err)
	}
	k := b.Key(tb, 1, "hold")
	pr, err := b.Worker().PrepareRetrieve(context.Background(), k)
	if err != nil || !pr.Success || len(pr.Slots) != 1 {
		t.Fatalf("prepare_retrieve: %+v %v", pr, err)
	}
	held := pr.Slots[0]
	clearCache()
	tc := harness.Tokens(3, 1, chunk)
	for _, toks := range [][]uint32{tb, tc} {
		for _, s := range prepareSlots(t, c, toks, 1, "c") {
			writeSlot(c, s, harness.ChunkData(3, 0, cb))
		}
		commitSHM(t, c, toks, 1, "c")
	}
	if !bytes.Equal(readSlot(b, held), db) {
		t.Fatal("B's held slot was handed out after CLEAR: B reads another chunk's bytes")
	}
	if _, err := b.Worker().CommitRetrieve(context.Background(), k); err != nil {
		t.Fatal(err)
	}
	if n, _ := harness.Lookup(context.Background(), ctl, "clear", tb, "after"); n != 0 {
		t.Fatal("B's chunk survived the clear after its read ended")
	}
}

// TestLockCapOverTheWire: one PREPARE_STORE of more than half the pool is
// answered with no slots, the operator sees a lock-cap event, and another
// instance still stores. Without the cap one instance could write-lock the
// whole pool for the write TTL.
func TestLockCapOverTheWire(t *testing.T) {
	cfg := harness.EngineConfig(t, 4) // 1024 chunks of 4 KiB
	e := harness.StartEngine(t, cfg)
	a := harness.NewWorker(t, harness.DialPort(t, cfg.Server.Port, 5*time.Second), 1, "cap", false)
	b := harness.NewWorker(t, harness.DialPort(t, cfg.Server.Port, 5*time.Second), 2, "cap", false)
	if s := prepareSlots(t, a, harness.Tokens(1, 600, a.Chunk), 600, "big"); len(s) != 0 {
		t.Fatalf("one instance write-locked %d of 1024 chunks", len(s))
	}
	p := e.Snapshot().Pool
	if p.LockCapRefusals != 1 || p.WriteLocked != 0 {
		t.Fatalf("pool after the refusal: %+v", p)
	}
	found := false
	for _, ev := range e.Snapshot().Events {
		if strings.Contains(ev.Message, "lock cap") && strings.Contains(ev.Message, "instance 1") {
			found = true
		}
	}
	if !found {
		t.Fatal("no event says why the store was refused")
	}
	if s := prepareSlots(t, b, harness.Tokens(2, 400, b.Chunk), 400, "ok"); len(s) != 400 {
		t.Fatalf("another instance got %d of 400 slots", len(s))
	}
}
