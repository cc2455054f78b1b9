package nongpu

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

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

func TestConflictingRegistrationNamesBothPeers(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	if _, err := e.mod.RegisterThrough(payload(1), []byte("squatter"), ""); err != nil {
		t.Fatal(err)
	}
	p := payload(2)
	p.NumLayers = 3
	_, err := e.mod.RegisterThrough(p, []byte("victim"), "")
	if !errors.Is(err, ErrLayoutConflict) {
		t.Fatalf("conflicting registration: %v", err)
	}
	if s := e.mod.Stats(); s.Conflicts != 1 || s.Instances != 1 {
		t.Fatalf("after the conflict: %+v", s)
	}
	ev := e.eventsOf(workers.EventError)
	if len(ev) != 1 || !strings.Contains(ev[0].Message, "instance 1 ("+peerText("squatter")+")") ||
		!strings.Contains(ev[0].Message, peerText("victim")) {
		t.Fatalf("conflict event %+v does not name both peers", ev)
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
