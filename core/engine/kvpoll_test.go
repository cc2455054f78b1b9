package engine

import (
	"context"
	"testing"

	"kvdock/core/kvevents"
	"kvdock/core/protocol"
)

// TestHostilePollKVEvents: POLL_KV_EVENTS over the wire of engine-driven-v2.
// Wrongly typed or refused polls (a str cursor, an int model, a negative
// cursor, max_events 0, two arguments) get no answer; a huge max_events,
// an unknown model and a cursor in the future get LMCache's answers; with
// the log off the answer is enabled=false and GET_EXPERIMENTAL names
// nothing.
func TestHostilePollKVEvents(t *testing.T) {
	ctx := context.Background()
	for _, logSize := range []int{0, 64} {
		cfg, _ := testConfig(t)
		cfg.Server.Protocol = "engine-driven-v2"
		cfg.KVEvents.LogSize = logSize
		e := startEngine(t, cfg)
		c := dial(t, cfg.Server.Port, "engine-driven-v2")
		var names []string
		if r, err := c.Call(ctx, protocol.GetExperimental); err != nil || r.Decode(&names) != nil {
			t.Fatalf("GET_EXPERIMENTAL: %v", err)
		}
		if (len(names) == 1 && names[0] == kvevents.Capability) != (logSize > 0) || len(names) > 1 {
			t.Fatalf("log %d: GET_EXPERIMENTAL %v", logSize, names)
		}
		for _, args := range [][]any{{"m", "0", int64(8)}, {int64(7), int64(0), int64(8)}, {"m", int64(-1), int64(8)},
			{"m", int64(0), int64(0)}, {"m", int64(0)}, {"m", int64(0), nil}} {
			if _, err := c.Call(ctx, protocol.PollKVEvents, args...); err == nil {
				t.Errorf("log %d: POLL %v answered", logSize, args)
			}
		}
		for _, args := range [][]any{{"m", int64(0), int64(1) << 62}, {"nobody", int64(0), int64(8)},
			{"m", int64(1) << 40, int64(8)}} {
			r, err := c.Call(ctx, protocol.PollKVEvents, args...)
			if err != nil {
				t.Fatalf("log %d: POLL %v: %v", logSize, args, err)
			}
			a, err := protocol.DecodeKVEventPollResult(r.Raw, protocol.DefaultLimits())
			if err != nil {
				t.Fatalf("log %d: POLL %v answered %x: %v", logSize, args, r.Raw, err)
			}
			if a.Enabled != (logSize > 0) || len(a.Events) != 0 || a.NextCursor != 0 {
				t.Errorf("log %d: POLL %v = %+v", logSize, args, a)
			}
			if logSize > 0 && a.Lost != (args[1] != int64(0)) {
				t.Errorf("log %d: POLL %v lost %v", logSize, args, a.Lost)
			}
		}
		// Only the answered polls reached the log; none changed it.
		if l := e.Snapshot().KVEvents.Log; l.Enabled != (logSize > 0) || logSize > 0 && (l.Polls != 3 || l.LostAnswers != 1 || l.Depth != 0) {
			t.Errorf("log %d: status %+v", logSize, l)
		}
	}
}
