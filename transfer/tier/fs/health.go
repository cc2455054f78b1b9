// Health: a failed write moves the tier's state (degraded, out of space)
// and the state is reported to the tier layer.

package fs

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"kvdock/core/tierstate"
)

func (t *Tier) writeFailed(size int64, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.writeFailedLocked(size, err)
}

// writeFailedLocked counts a dropped write and says why the tier is
// degraded; reads keep working from what is already on disk.
func (t *Tier) writeFailedLocked(size int64, err error) {
	t.dropped.Add(1)
	if t.closed {
		return
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		t.noSpace = true
		t.setStateLocked(tierstate.Degraded, fmt.Sprintf("no space left under %s: writes are dropped until space frees (last: %d bytes)", t.base, size))
		return
	}
	t.setStateLocked(tierstate.Degraded, fmt.Sprintf("write failed under %s: %v", t.base, err))
}

func (t *Tier) setStateLocked(s tierstate.State, reason string) {
	if s == t.state && reason == t.reason {
		return
	}
	changed := s != t.state
	if changed {
		t.since = time.Now()
		switch {
		case s == tierstate.Up:
			t.log.Info("fs tier up", "was", t.state)
		case t.closed:
			// A normal stop, not a fault.
			t.log.Info("fs tier closed")
		default:
			t.log.Warn("fs tier "+string(s), "reason", reason)
		}
	}
	t.state, t.reason = s, reason
	if f := t.notify.Load(); changed && f != nil {
		(*f)(tierstate.Tier{Type: "fs", Target: t.base, State: s, Reason: reason, Since: t.since})
	}
}

// NotifyState implements tier.StateNotifier.
func (t *Tier) NotifyState(f func(tierstate.Tier)) { t.notify.Store(&f) }

// Stats is the backend part of the tier's snapshot. DroppedWrites counts
// the writes this tier could not take (disk full, I/O errors); Corrupt the
// invalid files the start scan removed.
func (t *Tier) Stats() tierstate.Tier {
	t.mu.Lock()
	defer t.mu.Unlock()
	return tierstate.Tier{
		Type: "fs", Target: t.base,
		State: t.state, Reason: t.reason, Since: t.since,
		UsedBytes: t.used, CapacityBytes: t.cfg.CapacityBytes, Objects: int64(len(t.idx)),
		DroppedWrites: t.dropped.Load(), Corrupt: t.invalid,
		ReadBytes: t.readBytes.Load(), WriteBytes: t.writeBytes.Load(),
	}
}
