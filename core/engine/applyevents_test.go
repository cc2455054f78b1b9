package engine

import (
	"context"
	"strings"
	"testing"

	"kvdock/core/testkit/freeport"
	"kvdock/settings"
)

// applyEvents is the events Apply(next) records on e, with its error.
func applyEvents(t *testing.T, e *Engine, next settings.Config) ([]Event, error) {
	t.Helper()
	var last uint64
	for _, ev := range e.Snapshot().Events {
		last = max(last, ev.Seq)
	}
	_, err := e.Apply(context.Background(), next, nil)
	var out []Event
	for _, ev := range e.Snapshot().Events {
		if ev.Seq > last {
			out = append(out, ev)
		}
	}
	return out, err
}

// TestApplyRecordsOneEvent: every apply, live, restart, rebuild or rolled
// back, records exactly one event that names the keys and their class.
func TestApplyRecordsOneEvent(t *testing.T) {
	e, cfg, c := startDialed(t)
	register(t, c, 1)

	busy := busyPort(t)

	cur := cfg
	step := func(name string, change func(*settings.Config), wantErr bool, want ...string) {
		t.Helper()
		next := cur
		change(&next)
		evs, err := applyEvents(t, e, next)
		if (err != nil) != wantErr {
			t.Fatalf("%s: apply error %v", name, err)
		}
		if !wantErr {
			cur = next
		}
		if len(evs) != 1 {
			t.Fatalf("%s: %d events, want 1: %+v", name, len(evs), evs)
		}
		for _, w := range want {
			if !strings.Contains(evs[0].Message, w) {
				t.Fatalf("%s: event %q lacks %q", name, evs[0].Message, w)
			}
		}
	}
	step("live", func(c *settings.Config) { c.Eviction.Ratio = 0.5 }, false, "applied (live): eviction.ratio")
	step("restart", func(c *settings.Config) { c.Server.Port = freeport.Port(t) }, false, "applied (restart): server.port")
	step("rollback", func(c *settings.Config) { c.Server.Port = busy }, true,
		"apply (restart): server.port failed, rolled back to the running config")
	step("rebuild", func(c *settings.Config) { c.L1.AlignBytes *= 2 }, false,
		"applied (rebuild): l1.align_bytes", "1 worker contexts dropped", "SHM on: ")
}
