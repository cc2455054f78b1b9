package nongpu

import (
	"bytes"
	"context"
	"math"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/transfer/torchpickle"
)

// warmForUnproven is a cache that worker 1 warmed with a two-chunk prompt
// k of bytes want, and worker 2 registered, not yet proven to map the
// segment (SHM or pickle: unknown yet).
func warmForUnproven(t *testing.T) (*env, protocol.Key, []byte) {
	t.Helper()
	e := newEnv(t, true, 1<<20)
	e.register(1)
	e.register(2)
	k := key(tokens(2*testChunk, 700), 0, 2*testChunk)
	e.storeSHM(k, 1, 0x42, "warming store refused")
	want := make([]byte, chunkBytes)
	fill(want, 0x42)
	return e, k, want
}

// A worker that could not attach the segment (or chose pickle) registers
// like an SHM one, and nothing tells them apart until it stores: on a warm
// cache it only retrieves, and slots alone are a miss to it. Its replies
// carry the data beside the slots until its worker proves it maps the
// segment, so what it is counted as having received (hits, bytes out,
// tokens saved) it did receive.
func TestUnprovenSHMRetrieveCarriesTheData(t *testing.T) {
	e, k, want := warmForUnproven(t)

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

// A prepare of a read already pending (the same key again before its
// COMMIT_RETRIEVE) is answered from the pending read; for a worker not
// yet proven it must carry the data too, or the second retrieve is a
// miss to a worker that reads only the data, counted as a hit.
func TestUnprovenSHMRepeatedRetrieveCarriesTheData(t *testing.T) {
	e, k, want := warmForUnproven(t)
	// One LOOKUP's locks: the second prepare joins the pending read.
	ks := e.lookupLock(k)
	for i := range 2 {
		r, err := e.mod.PrepareRetrieve(k, 2)
		if err != nil || !r.Success || len(r.Slots) != 2 {
			t.Fatalf("retrieve %d = %+v, %v", i, r, err)
		}
		ts, err := torchpickle.Decode(r.Data, torchpickle.Limits{})
		if err != nil || len(ts) != 2 || !bytes.Equal(ts[0].Data, want) || !bytes.Equal(ts[1].Data, want) {
			t.Fatalf("retrieve %d of a pending read carries %d chunks (%v), or other bytes", i, len(ts), err)
		}
	}
	if c := contextOf(t, e.mod, 2); c.HitChunks != 4 || c.Retrieves != 2 {
		t.Fatalf("instance 2 counted %d hit chunks in %d retrieves, want 4 in 2", c.HitChunks, c.Retrieves)
	}
	for range 2 {
		if !e.pool.IsLocked(ks[0]) {
			t.Fatal("the holds ended before the last COMMIT_RETRIEVE")
		}
		if ok, _ := e.mod.CommitRetrieve(k, 2); !ok {
			t.Fatal("COMMIT_RETRIEVE refused")
		}
	}
	if e.pool.IsLocked(ks[0]) {
		t.Fatal("the holds outlived both COMMIT_RETRIEVEs")
	}
}

// TestHostileCommitsWhileTheDataIsEncoded: the chunks an unproven worker's
// reply carries are encoded after the read is published, so the worker
// can end the read's holds meanwhile (one COMMIT_RETRIEVE more than it
// prepared, running beside the prepare), and a clear and another store
// can then take the slots. The encoding holds the objects itself: the
// reply carries the bytes stored under the key, never the new store's.
func TestHostileCommitsWhileTheDataIsEncoded(t *testing.T) {
	e, k, want := warmForUnproven(t)
	e.lookupLock(k)
	var got [][]byte
	r, err := e.mod.prepareRetrieve(k, 2, []byte("peer-2"), func(ts []torchpickle.Tensor, _ [][]torchpickle.Tensor, _ []byte) error {
		for range 2 {
			_, _ = e.mod.commitRetrieve(k, 2, []byte("peer-2"))
		}
		e.pool.Clear()
		other := key(tokens(2*testChunk, 9000), 0, 2*testChunk)
		e.storeSHM(other, 1, 0x99, "the store after the clear refused")
		for _, tn := range ts {
			got = append(got, bytes.Clone(tn.Data))
		}
		return nil
	})
	if err != nil || !r.Success || len(got) != 2 {
		t.Fatalf("retrieve = %+v, %v, %d chunks encoded", r, err, len(got))
	}
	for i, b := range got {
		if !bytes.Equal(b, want) {
			t.Fatalf("chunk %d encoded from a slot another store wrote meanwhile", i)
		}
	}
}

// TestHostileManyChunkRetrieveFitsItsTicket: an unproven worker's reply
// carries the slots beside the data, and the in-flight pickle gate charges
// what it may hold before it is made; past a few hundred chunks the slot
// list alone outgrew the fixed slack, so a worker asking for long prompts
// held more reply bytes than the gate let through.
func TestHostileManyChunkRetrieveFitsItsTicket(t *testing.T) {
	const chunks = 1500
	k := key(tokens(chunks*testChunk, 700), 0, chunks*testChunk)
	fits := func(t *testing.T, e *env) {
		t.Helper()
		e.lookupLock(k)
		ticket, ok := e.mod.retrieveReplyBytes(k, 2)
		if !ok {
			t.Fatal("the reply is not gated")
		}
		var asked int
		r, err := e.mod.prepareRetrieveReply(k, 2, []byte("peer-2"), func(n int) ([]byte, error) {
			asked = n
			return make([]byte, 0, n), nil
		})
		if err != nil || r == nil || asked == 0 {
			t.Fatalf("retrieve of %d chunks: %v (reply buffer %d)", chunks, err, asked)
		}
		if int64(asked) > ticket+retrieveReplySlack {
			t.Fatalf("reply of %d bytes past its gate ticket of %d", asked, ticket+retrieveReplySlack)
		}
	}
	t.Run("unproven_shm", func(t *testing.T) {
		e := newEnv(t, true, 8<<20)
		e.register(1)
		e.register(2)
		e.storeSHM(k, 1, 0x42, "warming store refused")
		fits(t, e)
	})
	t.Run("pickle", func(t *testing.T) {
		e := newEnv(t, false, 8<<20)
		e.register(1)
		e.register(2)
		in := make([]torchpickle.Tensor, chunks)
		for i := range in {
			in[i] = tensorOf(byte(i))
		}
		if _, err := e.mod.PrepareStore(k, 1); err != nil {
			t.Fatal(err)
		}
		if ok, err := e.mod.CommitStore(k, 1, pickled(t, in...)); !ok || err != nil {
			t.Fatalf("pickle store of %d chunks = %v, %v", chunks, ok, err)
		}
		fits(t, e)
	})
}

// TestHostileHugeKeyRangeIsSizedAtOnce: the gate's ticket is sized from
// the key's range before the key is checked against its tokens; a peer
// naming a range of 2^31 tokens gets it sized in a few steps per KV group,
// not one per chunk (about 134 million here).
func TestHostileHugeKeyRangeIsSizedAtOnce(t *testing.T) {
	e := newEnv(t, false, 1<<20)
	e.register(2)
	k := key(tokens(testChunk, 700), 0, math.MaxInt32)
	n, ok := e.mod.retrieveReplyBytes(k, 2)
	if !ok || n < int64(math.MaxInt32/testChunk)*chunkBytes {
		t.Fatalf("ticket of a 2^31-token range: %d (%v)", n, ok)
	}
	if n, ok := e.mod.pickleStoreBytes(k, 2); !ok || n <= 0 {
		t.Fatalf("store ticket of a 2^31-token range: %d (%v)", n, ok)
	}
}
