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

// TestHostileLateCommitAfterReRegistration: worker A's instance id is
// registered again from peer B (a new worker reusing the id); B prepares a
// store and is still writing its slots when A's late COMMIT_STORE of the
// same key arrives. A's commit must publish nothing (B's half-written slots
// would be served as the key's bytes); B's own commit then publishes B's
// bytes. The read side likewise: A's COMMIT_RETRIEVE must not end B's read
// holds (the chunks could be evicted and their slots rewritten while B
// copies them); a peer that joins B's read ends its own reader only.
func TestHostileLateCommitAfterReRegistration(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	hs := e.mod.Handlers()
	call := func(peer, name string, args ...any) any {
		t.Helper()
		v, err := hs[name](context.Background(), &rpc.Request{Name: name, Args: args, Peer: []byte(peer)})
		if err != nil {
			t.Fatalf("%s from %s: %v", name, peer, err)
		}
		return v
	}
	if _, err := e.mod.RegisterThrough(payload(1), []byte("old"), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := e.mod.RegisterThrough(payload(1), []byte("new"), ""); err != nil {
		t.Fatal(err)
	}
	if s := e.mod.Stats(); s.Reused != 1 {
		t.Fatalf("re-registration from another peer not taken as a new worker: %+v", s)
	}
	k := key(tokens(testChunk, 3000), 0, testChunk)
	r := call("new", protocol.PrepareStore, k, int64(1)).(protocol.PrepareStoreResponse)
	if len(r.Slots) != 1 {
		t.Fatalf("new worker's prepare = %+v", r)
	}
	half := e.slotBytes(r.Slots[0])
	fill(half[:len(half)/2], 0x5a) // B is half-way through its copy
	b, release := e.pool.View(r.Slots[0].Offset, r.Slots[0].Length)
	copy(b, half)
	release()
	if v := call("old", protocol.CommitStore, k, int64(1), []byte{}); v != false {
		t.Fatalf("the old worker's late COMMIT_STORE answered %#v, want false", v)
	}
	if e.cached(k) != 0 {
		t.Fatal("the old worker's late commit published the new worker's half-written slot")
	}
	if s := e.mod.Stats(); s.ForeignCommits != 1 || s.PendingWrites != 1 {
		t.Fatalf("after the foreign commit: %+v; want 1 foreign commit and B's write still pending", s)
	}
	e.writeSlots(r.Slots, 0x77)
	if v := call("new", protocol.CommitStore, k, int64(1), []byte{}); v != true {
		t.Fatalf("the new worker's own commit answered %#v", v)
	}
	want := make([]byte, r.Slots[0].Length)
	fill(want, 0x77)

	// Reads: B holds k for its retrieve.
	ks := e.lookupLock(k)
	pr := call("new", protocol.PrepareRetrieve, k, int64(1)).(protocol.PrepareRetrieveResponse)
	if !pr.Success || len(pr.Slots) != 1 || !bytes.Equal(e.slotBytes(pr.Slots[0]), want) {
		t.Fatalf("new worker's retrieve = %+v", pr)
	}
	if v := call("old", protocol.CommitRetrieve, k, int64(1)); v != true {
		t.Fatalf("COMMIT_RETRIEVE answered %#v, want true as always", v)
	}
	if !e.pool.IsLocked(ks[0]) {
		t.Fatal("the old worker's COMMIT_RETRIEVE released the new worker's read hold")
	}
	if s := e.mod.Stats(); s.ForeignCommits != 2 || s.PendingReads != 1 {
		t.Fatalf("after the foreign read commit: %+v", s)
	}
	// A peer that joins the read (the same worker reconnected under a new
	// routing id, say) reads the same slots, and its commit ends its own
	// reader only.
	ar := call("other", protocol.PrepareRetrieve, k, int64(1)).(protocol.PrepareRetrieveResponse)
	if !ar.Success || len(ar.Slots) != 1 || !bytes.Equal(e.slotBytes(ar.Slots[0]), want) {
		t.Fatalf("a joining peer's retrieve = %+v", ar)
	}
	call("other", protocol.CommitRetrieve, k, int64(1))
	call("other", protocol.CommitRetrieve, k, int64(1)) // once more: foreign now
	if !e.pool.IsLocked(ks[0]) {
		t.Fatal("the joining peer's commits ended the new worker's reader")
	}
	if s := e.mod.Stats(); s.ForeignCommits != 3 {
		t.Fatalf("a commit past the joining peer's reader: %+v", s)
	}
	call("new", protocol.CommitRetrieve, k, int64(1))
	if e.pool.IsLocked(ks[0]) {
		t.Fatal("the new worker's own COMMIT_RETRIEVE did not release its hold")
	}
	if ev := e.eventsOf(workers.EventError); len(ev) == 0 || !strings.Contains(ev[len(ev)-1].Message, peerHex("old")) {
		t.Fatalf("foreign commit not reported with the peer: %+v", ev)
	}
}
