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
	conflict := regs[1]
	conflict.ID, conflict.Payload.InstanceID, conflict.Payload.NumLayers = 4, 4, 7
	liar := regs[1]
	liar.ID = 5

	fresh := newEnv(t, true, 1<<20)
	n, refused := fresh.mod.Restore(append(regs, bad, conflict, liar))
	if n != 2 || len(refused) != 3 {
		t.Fatalf("restored %d, refused %q", n, refused)
	}
	for _, want := range []string{"instance 3", "instance 4", "instance 5"} {
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
	if s := fresh.mod.Stats(); s.Instances != 2 || s.Reused != 0 {
		t.Fatalf("stats %+v", s)
	}
	// Into a module whose pool is not shared, SHM registrations are refused.
	pickle := newEnv(t, false, 1<<20)
	if n, refused := pickle.mod.Restore(regs); n != 0 || len(refused) != 2 {
		t.Fatalf("restored %d into a private pool, refused %q", n, refused)
	}
}
