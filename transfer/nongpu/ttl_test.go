package nongpu

import (
	"strings"
	"testing"
	"time"

	"kvdock/core/workers"
)

// The expiry event of a pending read says which TTL its age is half of:
// the figure the Pool pane shows as "TTL read 5m00s" (the event read
// "expired after 2m30s" with no TTL in sight).
func TestExpiryEventNamesTheTTLItIsHalfOf(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(2)
	kr := key(tokens(testChunk, 500), 0, testChunk)
	e.mod.PrepareStore(kr, 2)
	e.mod.CommitStore(kr, 2, nil)
	e.lookupLock(kr)
	e.mod.PrepareRetrieve(kr, 2)
	e.clk.Advance(160 * time.Second) // ≥ 300 s / 2
	e.mod.Sweep()
	evs := e.eventsOf(workers.EventExpired)
	if len(evs) != 1 {
		t.Fatalf("%d expiry events", len(evs))
	}
	want := "instance 2: pending read of 1 chunks expired after 2m40s without a commit: given up at half the 5m0s read TTL (l1.read_ttl_seconds), its lock kept to the TTL"
	if !strings.Contains(evs[0].Message, want) {
		t.Fatalf("expiry event %q, want %q", evs[0].Message, want)
	}
}
