package l1

import (
	"errors"
	"testing"
)

// TestAbandonFreesTheInstanceLockCharge: an abandoned reservation waits for
// its TTL charged to nobody's instance, so a worker that reconnects under the
// same instance id starts with its whole lock cap and is not refused for
// bytes it no longer holds.
func TestAbandonFreesTheInstanceLockCharge(t *testing.T) {
	p, _ := newPool(t, 16, func(o *Options) { o.OwnerLockShare, o.TotalLockShare = 0.5, 0.9 })
	owner := InstanceOwner(7)
	res, err := p.ReserveWrite(owner, keyRange(0, 6), 4096)
	if err != nil {
		t.Fatal(err)
	}
	p.Abandon(res, nil)
	if got := p.ownerBytes(owner); got != 0 {
		t.Fatalf("instance holds %d bytes locked after Abandon, want 0", got)
	}
	if got := p.ownerBytes(AbandonedOwner()); got != 6*4096 {
		t.Fatalf("abandoned owner holds %d bytes, want %d", got, 6*4096)
	}
	// 6 more units: within the instance's cap of 8 only when the abandoned 6
	// are no longer its own; within the total cap of 14 either way.
	if _, err := p.ReserveWrite(owner, keyRange(6, 12), 4096); err != nil {
		if errors.Is(err, ErrLockCap) {
			t.Fatalf("a new reservation under the same instance was refused for abandoned bytes: %v", err)
		}
		t.Fatal(err)
	}
}
