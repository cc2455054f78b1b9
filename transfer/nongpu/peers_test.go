package nongpu

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"kvdock/core/keys"
	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/core/workers"
)

// One peer must not end another's registration, nor leave its requests
// unanswered, by messages alone.

func TestUnregisterFromAnotherLivePeerIsRefused(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	if _, err := e.mod.RegisterThrough(payload(1), []byte("victim"), ""); err != nil {
		t.Fatal(err)
	}
	// The squatter naming the id (a PING, a request) takes nothing.
	e.mod.Touch(1, []byte("squatter"))
	e.mod.begin(1, []byte("squatter"))()
	if e.mod.UnregisterFrom(1, []byte("squatter")) {
		t.Fatal("another live peer's UNREGISTER ended the registration")
	}
	if s := e.mod.Stats(); s.Instances != 1 || s.RefusedUnregisters != 1 {
		t.Fatalf("after the refused UNREGISTER: %+v", s)
	}
	ev := e.eventsOf(workers.EventUnregister)
	if len(ev) != 1 || !strings.Contains(ev[0].Message, peerHex("squatter")) || !strings.Contains(ev[0].Message, peerHex("victim")) {
		t.Fatalf("refusal event %+v does not name both peers", ev)
	}
	if c := contextOf(t, e.mod, 1); c.Peer != peerHex("victim") {
		t.Fatalf("holder shown as %q, want the victim's", c.Peer)
	}
	// The holder's own UNREGISTER is served.
	if !e.mod.UnregisterFrom(1, []byte("victim")) || e.mod.Stats().Instances != 0 {
		t.Fatal("the holder's UNREGISTER was refused")
	}
}

func TestUnregisterFromAnotherPeerOnceTheHolderIsSilent(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.mod.SetLiveness(Liveness{Timeout: 30 * time.Second})
	if _, err := e.mod.RegisterThrough(payload(1), []byte("dead"), ""); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(29 * time.Second)
	if e.mod.UnregisterFrom(1, []byte("other")) {
		t.Fatal("unregistered while the holder spoke within the reap timeout")
	}
	e.clk.Advance(time.Second)
	if !e.mod.UnregisterFrom(1, []byte("other")) {
		t.Fatal("a silent holder's instance was not unregistered (a dead worker's id stays)")
	}
}

func TestReconnectedWorkerHoldsItsInstanceAfterTheWindow(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	if _, err := e.mod.RegisterThrough(payload(1), []byte("before"), ""); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(DefaultPeerWindow)
	e.mod.begin(1, []byte("after"))() // the same worker, a new routing id
	if c := contextOf(t, e.mod, 1); c.Peer != peerHex("after") {
		t.Fatalf("holder %q after the old connection went silent", c.Peer)
	}
	if e.mod.UnregisterFrom(1, []byte("before")) {
		t.Fatal("the old routing id still holds the instance")
	}
	if !e.mod.UnregisterFrom(1, []byte("after")) {
		t.Fatal("the reconnected worker could not unregister")
	}
}

// TestHostileSquatterLayoutKeepsChunksApart: a peer registers the victim's
// model first with another layout of the same chunk size (bfloat16 for
// float16, so a foreign chunk would fit the victim's slots unnoticed) and
// stores the victim's prompt. The victim registers all the same; the
// squatter's chunks are not the victim's (the victim's store of the
// prompt gets slots of its own), and once both stored the prompt, a lookup over
// every registered layout locks each layout's chunks for its own worker,
// and each reads its own bytes.
func TestHostileSquatterLayoutKeepsChunksApart(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	sq := payload(1)
	sq.DtypeStr = "bfloat16"
	if _, err := e.mod.RegisterThrough(sq, []byte("squatter"), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := e.mod.RegisterThrough(payload(2), []byte("victim"), ""); err != nil {
		t.Fatalf("the victim's registration of a squatted model: %v", err)
	}
	if s := e.mod.Stats(); s.Conflicts != 0 || s.Instances != 2 {
		t.Fatalf("after both registrations: %+v", s)
	}
	k := key(tokens(2*testChunk, 50), 0, 2*testChunk)
	e.storeSHM(k, 1, 0xAA, "the squatter's store refused")
	// The victim's PREPARE_STORE of the same prompt gets slots: the
	// squatter's chunks do not count as the victim's.
	r, err := e.mod.PrepareStore(k, 2)
	if err != nil || len(r.Slots) != 2 {
		t.Fatalf("the victim's prepare store after the squatter's: %d slots, %v", len(r.Slots), err)
	}
	e.writeSlots(r.Slots, 0x55)
	if ok, _ := e.mod.CommitStore(k, 2, nil); !ok {
		t.Fatal("the victim's commit refused")
	}
	ids, groups := e.layouts.Registered("m", 1)
	if len(ids) != 2 || ids[0] == ids[1] {
		t.Fatalf("registered layouts %x", ids)
	}
	ks, err := e.sessions.Keys(keys.KeyRequest{RequestID: k.RequestID, Model: "m", WorldSize: 1, Worker: intptr(0),
		Tokens: k.TokenIDs, Start: k.Start, End: k.End})
	if err != nil {
		t.Fatal(err)
	}
	all := ks.WithLayouts(ids, groups).All()
	if n := e.pool.ReserveReadPrefix(all, 1); n != len(all) {
		t.Fatalf("lookup over both layouts locked %d of %d keys", n, len(all))
	}
	for _, w := range []struct {
		id   int64
		seed byte
	}{{1, 0xAA}, {2, 0x55}} {
		r, err := e.mod.PrepareRetrieve(k, w.id)
		if err != nil || !r.Success || len(r.Slots) != 2 {
			t.Fatalf("instance %d retrieve: %+v, %v", w.id, r, err)
		}
		want := make([]byte, chunkBytes)
		fill(want, w.seed)
		for i, sl := range r.Slots {
			if !bytes.Equal(e.slotBytes(sl), want) {
				t.Fatalf("instance %d chunk %d: another layout's bytes", w.id, i)
			}
		}
		if ok, _ := e.mod.CommitRetrieve(k, w.id); !ok {
			t.Fatalf("instance %d commit retrieve refused", w.id)
		}
	}
}

// TestUnregisteredInstanceAnsweredAsFailure: every transfer request naming
// an instance that is not registered gets its failure reply, not an error
// (which seed profiles leave unanswered), and is counted.
func TestUnregisteredInstanceAnsweredAsFailure(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	hs := e.mod.Handlers()
	call := func(name string, args ...any) (any, error) {
		return hs[name](context.Background(), &rpc.Request{Name: name, Args: args, Peer: []byte("victim")})
	}
	k := key(tokens(testChunk, 1), 0, testChunk)
	v, err := call(protocol.PrepareStore, k, int64(7))
	if ps, ok := v.(protocol.PrepareStoreResponse); err != nil || !ok || ps.Shm || len(ps.Slots) != 0 {
		t.Fatalf("PREPARE_STORE of an unregistered instance = %#v, %v; want an empty context", v, err)
	}
	for _, c := range []struct {
		name string
		args []any
	}{
		{protocol.CommitStore, []any{k, int64(7), []byte{}}},
		{protocol.CommitStoreGroup, []any{k, int64(7), int64(0), []byte{1}}},
		{protocol.CommitRetrieve, []any{k, int64(7)}},
	} {
		if v, err := call(c.name, c.args...); err != nil || v != false {
			t.Fatalf("%s of an unregistered instance = %#v, %v; want false", c.name, v, err)
		}
	}
	v, err = call(protocol.PrepareRetrieve, k, int64(7))
	if pr, ok := v.(protocol.PrepareRetrieveResponse); err != nil || !ok || pr.Success {
		t.Fatalf("PREPARE_RETRIEVE of an unregistered instance = %#v, %v; want success false", v, err)
	}
	if s := e.mod.Stats(); s.Unknown != 5 {
		t.Fatalf("unknown-instance requests counted %d, want 5", s.Unknown)
	}
	// Bad input is still an error.
	if _, err := call(protocol.PrepareStore, k, "7"); err == nil {
		t.Fatal("a string instance id accepted")
	}
}
