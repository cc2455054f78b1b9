package nongpu

import (
	"strings"
	"testing"

	"kvdock/core/workers"
)

func TestRestoreRegistrationsAsRegisterChecksThem(t *testing.T) {
	old := newEnv(t, true, 1<<20)
	old.register(1)
	old.register(2)
	regs := old.mod.Registrations()
	if len(regs) != 2 || regs[0].ID != 1 || regs[0].Mode != string(workers.ModeSHM) {
		t.Fatalf("registrations %+v", regs)
	}
	bad := regs[1]
	bad.ID, bad.Payload.InstanceID, bad.Payload.DtypeStr = 3, 3, "evil"
	other := regs[1] // another layout of the model: restored beside it
	other.ID, other.Payload.InstanceID, other.Payload.NumLayers = 4, 4, 7
	liar := regs[1]
	liar.ID = 5

	fresh := newEnv(t, true, 1<<20)
	n, refused := fresh.mod.Restore(append(regs, bad, other, liar), true)
	if n != 3 || len(refused) != 2 {
		t.Fatalf("restored %d, refused %q", n, refused)
	}
	if ids, _ := fresh.layouts.Registered("m", 1); len(ids) != 2 {
		t.Fatalf("restored layouts %x, want 2", ids)
	}
	for _, want := range []string{"instance 3", "instance 5"} {
		if !strings.Contains(strings.Join(refused, "\n"), want) {
			t.Errorf("refusals %q do not name %s", refused, want)
		}
	}
	// A restored instance is served without registering again.
	toks := tokens(2*testChunk, 9)
	k := key(toks, 0, len(toks))
	if _, err := fresh.mod.PrepareStore(k, 1); err != nil {
		t.Fatalf("prepare store for a restored instance: %v", err)
	}
	// Registering it again from a worker keeps it (same id, no peer yet).
	if r, err := fresh.mod.RegisterThrough(payload(2), []byte("peer"), ""); err != nil || r.ShmName == "" {
		t.Fatalf("register again: %+v %v", r, err)
	}
	if s := fresh.mod.Stats(); s.Instances != 3 || s.Reused != 0 {
		t.Fatalf("stats %+v", s)
	}
	// Into a module whose pool is not shared, SHM registrations are refused.
	pickle := newEnv(t, false, 1<<20)
	if n, refused := pickle.mod.Restore(regs, true); n != 0 || len(refused) != 2 {
		t.Fatalf("restored %d into a private pool, refused %q", n, refused)
	}
}

// TestRestoreWithoutTheSegment: a start that did not adopt the kept
// segment restores the PICKLE registrations (they need none) and refuses
// the SHM ones, whose workers map the old segment.
func TestRestoreWithoutTheSegment(t *testing.T) {
	shm := newEnv(t, true, 1<<20)
	shm.register(1)
	pickle := newEnv(t, false, 1<<20)
	pickle.register(2)
	regs := append(shm.mod.Registrations(), pickle.mod.Registrations()...)
	for _, shared := range []bool{true, false} {
		fresh := newEnv(t, shared, 1<<20)
		n, refused := fresh.mod.Restore(regs, false)
		if n != 1 || len(refused) != 1 || !strings.Contains(refused[0], "instance 1") || !strings.Contains(refused[0], "did not adopt") {
			t.Fatalf("shared %v: restored %d, refused %q; want instance 2 restored, instance 1 refused", shared, n, refused)
		}
		if s := fresh.mod.Stats(); s.Instances != 1 {
			t.Fatalf("shared %v: %d instances", shared, s.Instances)
		}
		if resp, err := fresh.mod.PrepareStore(key(tokens(testChunk, 3), 0, testChunk), 2); err != nil || len(resp.Slots) != 0 {
			t.Fatalf("shared %v: prepare store of the restored pickle instance: %+v %v", shared, resp, err)
		}
	}
}

// TestRestoredInstanceHolder: a restored registration is held by no peer
// until one speaks for it; meanwhile every peer's UNREGISTER is refused,
// as another peer's is for a live registration. The first peer to speak
// for it holds it, is routed under its table, and may unregister it.
func TestRestoredInstanceHolder(t *testing.T) {
	old := newEnv(t, true, 1<<20)
	if _, err := old.mod.RegisterThrough(payload(1), []byte("before"), "nongpu-v1"); err != nil {
		t.Fatal(err)
	}
	fresh := newEnv(t, true, 1<<20)
	if n, refused := fresh.mod.Restore(old.mod.Registrations(), true); n != 1 {
		t.Fatalf("restored %d, refused %q", n, refused)
	}
	if p, ok := fresh.mod.InstanceTable(1); !ok || p != "nongpu-v1" {
		t.Fatalf("instance table %q %v", p, ok)
	}
	for _, peer := range []string{"squatter", "worker"} {
		if fresh.mod.UnregisterFrom(1, []byte(peer)) {
			t.Fatalf("%s's UNREGISTER of a restored instance nobody spoke for was accepted", peer)
		}
	}
	if _, ok := fresh.mod.PeerTable([]byte("worker")); ok {
		t.Fatal("a peer holds the restored instance before speaking for it")
	}
	fresh.mod.begin(1, []byte("worker"))()
	if p, ok := fresh.mod.PeerTable([]byte("worker")); !ok || p != "nongpu-v1" {
		t.Fatalf("the worker's table after it spoke: %q %v", p, ok)
	}
	fresh.mod.begin(1, []byte("squatter"))()
	if fresh.mod.UnregisterFrom(1, []byte("squatter")) {
		t.Fatal("a squatter's UNREGISTER of the instance its worker holds was accepted")
	}
	if s := fresh.mod.Stats(); s.RefusedUnregisters != 3 {
		t.Errorf("refused unregisters %d, want 3", s.RefusedUnregisters)
	}
	if !fresh.mod.UnregisterFrom(1, []byte("worker")) {
		t.Fatal("the holder's UNREGISTER was refused")
	}
	if _, ok := fresh.mod.PeerTable([]byte("worker")); ok {
		t.Error("the unregistered instance still routes its holder")
	}
	if _, ok := fresh.mod.InstanceTable(1); ok {
		t.Error("the unregistered instance still has a table")
	}
}
