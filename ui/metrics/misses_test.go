package metrics

import (
	"fmt"
	"strings"
	"testing"

	"kvdock/core/engine"
	"kvdock/core/misses"
	"kvdock/core/testkit/promseries"
)

func TestMissMetricsByReasonAndContext(t *testing.T) {
	src, m := watched()
	f := gather(t, m)
	for i := range misses.NumReasons { // every reason exists at zero
		if v := promseries.Value(t, f, "kvdock_lookup_missed_chunks_total", "reason", i.String()); v != 0 {
			t.Fatalf("%v = %v before traffic", i, v)
		}
	}
	var c misses.Counts
	c[misses.Evicted], c[misses.Refused] = 4, 1
	src.set(func(s *engine.Snapshot) {
		s.Misses = misses.Report{Total: c, TierMissed: 2,
			Contexts: []misses.ContextCounts{{Context: misses.Context{Model: "llama", WorldSize: 2}, Missed: c}}}
	})
	f = gather(t, m)
	if v := promseries.Value(t, f, "kvdock_lookup_missed_chunks_total", "reason", "evicted"); v != 4 {
		t.Fatalf("evicted = %v", v)
	}
	if v := promseries.Value(t, f, "kvdock_context_lookup_missed_chunks_total", "model", "llama", "world_size", "2", "reason", "refused"); v != 1 {
		t.Fatalf("llama/2 refused = %v", v)
	}
	if v := promseries.Value(t, f, "kvdock_lookup_tier_missed_chunks_total"); v != 2 {
		t.Fatalf("tier missed = %v", v)
	}
	// A pool rebuild resets the tally: the total stays monotonic, the
	// context series of the old tally go, and the collector forgets them.
	c2 := misses.Counts{}
	c2[misses.Evicted] = 1
	src.set(func(s *engine.Snapshot) {
		s.Misses = misses.Report{Total: c2,
			Contexts: []misses.ContextCounts{{Context: misses.Context{Model: "qwen", WorldSize: 1}, Missed: c2}}}
	})
	f = gather(t, m)
	if v := promseries.Value(t, f, "kvdock_lookup_missed_chunks_total", "reason", "evicted"); v != 5 {
		t.Fatalf("evicted after reset = %v, want 5", v)
	}
	for _, mt := range f["kvdock_context_lookup_missed_chunks_total"].GetMetric() {
		for _, l := range mt.GetLabel() {
			if l.GetValue() == "llama" {
				t.Fatal("series of a context gone from the tally still exported")
			}
		}
	}
	n := 0
	for k := range m.snap.counters {
		if strings.HasPrefix(k, missCtxPrefix) {
			n++
		}
	}
	if n != int(misses.NumReasons) {
		t.Fatalf("collector keeps %d context counters, want %d", n, misses.NumReasons)
	}
	// Many contexts over time: the collector's state follows the report.
	for i := range 50 {
		src.set(func(s *engine.Snapshot) {
			s.Misses = misses.Report{Contexts: []misses.ContextCounts{{Context: misses.Context{Model: fmt.Sprint("m", i), WorldSize: 1}}}}
		})
		gather(t, m)
	}
	if len(m.snap.counters) > 100 {
		t.Fatalf("collector grew to %d counters over 50 short-lived contexts", len(m.snap.counters))
	}
}
