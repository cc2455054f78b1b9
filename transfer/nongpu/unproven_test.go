package nongpu

import (
	"bytes"
	"context"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/transfer/torchpickle"
)

// A worker that could not attach the segment (or chose pickle) registers
// like an SHM one, and nothing tells them apart until it stores: on a warm
// cache it only retrieves, and slots alone are a miss to it. Its replies
// carry the data beside the slots until its worker proves it maps the
// segment, so what it is counted as having received (hits, bytes out,
// tokens saved) it did receive.
func TestUnprovenSHMRetrieveCarriesTheData(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1) // the worker that warmed the cache
	e.register(2) // a new worker, SHM or pickle: unknown yet
	k := key(tokens(2*testChunk, 700), 0, 2*testChunk)
	e.storeSHM(k, 1, 0x42, "warming store refused")
	want := make([]byte, chunkBytes)
	fill(want, 0x42)

	ks := e.lookupLock(k)
	r, err := e.mod.PrepareRetrieve(k, 2)
	if err != nil || !r.Success || len(r.Slots) != 2 {
		t.Fatalf("unproven retrieve = %+v, %v", r, err)
	}
	ts, err := torchpickle.Decode(r.Data, torchpickle.Limits{})
	if err != nil || len(ts) != 2 {
		t.Fatalf("unproven retrieve carries no chunks: %d tensors, %v", len(ts), err)
	}
	for i, tn := range ts {
		if !bytes.Equal(tn.Data, want) || !bytes.Equal(e.slotBytes(r.Slots[i]), want) {
			t.Fatalf("chunk %d: data or slot holds other bytes", i)
		}
	}
	if !e.pool.IsLocked(ks[0]) {
		t.Fatal("the holds went before COMMIT_RETRIEVE: an SHM worker may still be reading the slots")
	}
	if ok, _ := e.mod.CommitRetrieve(k, 2); !ok || e.pool.IsLocked(ks[0]) {
		t.Fatal("COMMIT_RETRIEVE did not end the holds")
	}

	// Through the wire (the gated, exact-sized reply buffer): the same
	// document, the chunks and the slots.
	_, dial := serveWireAt(t, e.mod)
	c := dial()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.lookupLock(k)
	rep, err := c.Call(ctx, protocol.PrepareRetrieve, k, int64(2))
	if err != nil {
		t.Fatalf("wire retrieve: %v", err)
	}
	var doc struct {
		Success bool           `msgpack:"success"`
		Data    []byte         `msgpack:"data"`
		Context map[string]any `msgpack:"context"`
	}
	if err := rep.Decode(&doc); err != nil || !doc.Success {
		t.Fatalf("wire reply success %v, %v", doc.Success, err)
	}
	if ts, err := torchpickle.Decode(doc.Data, torchpickle.Limits{}); err != nil || len(ts) != 2 || !bytes.Equal(ts[1].Data, want) {
		t.Fatalf("wire reply's data: %d tensors, %v, or other bytes", len(ts), err)
	}
	if sl, _ := doc.Context["slots"].([]any); len(sl) != 2 {
		t.Fatalf("wire reply context %v: want the two slots", doc.Context)
	}
	if _, err := c.Call(ctx, protocol.CommitRetrieve, k, int64(2)); err != nil {
		t.Fatalf("wire commit retrieve: %v", err)
	}

	// Once it wrote and committed an SHM store, slots alone.
	e.storeSHM(key(tokens(testChunk, 900), 0, testChunk), 2, 0x11, "the new worker's SHM store refused")
	e.lookupLock(k)
	r, err = e.mod.PrepareRetrieve(k, 2)
	if err != nil || !r.Success || len(r.Slots) != 2 || len(r.Data) != 0 {
		t.Fatalf("proven retrieve = success %v, %d slots, %d data bytes, %v; want slots alone", r.Success, len(r.Slots), len(r.Data), err)
	}
	if c := contextOf(t, e.mod, 2); c.HitChunks != 6 || c.Retrieves != 3 {
		t.Fatalf("instance 2 counted %d hit chunks in %d retrieves, want 6 in 3", c.HitChunks, c.Retrieves)
	}
}
