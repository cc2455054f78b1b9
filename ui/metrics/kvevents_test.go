package metrics

import (
	"testing"

	"kvdock/core/engine"
	"kvdock/core/testkit/promseries"
)

func TestKVEventsMetricsOnlyWhenOn(t *testing.T) {
	src, m := watched()
	if f := gather(t, m); f["kvdock_kv_events_batches_total"] != nil {
		t.Fatal("KV event metrics with the stream off")
	}
	src.set(func(s *engine.Snapshot) {
		s.KVEvents = engine.KVEventsStatus{Enabled: true, Announced: 7, Held: 2, Batches: 5, StoredEvents: 9, RemovedEvents: 2, Dropped: 1, ReplayRequests: 3}
	})
	f := gather(t, m)
	for name, want := range map[string]float64{
		"kvdock_kv_events_announced_chunks": 7, "kvdock_kv_events_held_chunks": 2, "kvdock_kv_events_batches_total": 5,
		"kvdock_kv_events_stored_blocks_total": 9, "kvdock_kv_events_removed_blocks_total": 2,
		"kvdock_kv_events_dropped_total": 1, "kvdock_kv_events_replay_requests_total": 3,
	} {
		if v := promseries.Value(t, f, name); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
}

// The poll log's figures are present while the log is on, stream or not.
func TestKVEventLogMetrics(t *testing.T) {
	src, m := watched()
	if f := gather(t, m); f["kvdock_kv_events_log_depth"] != nil {
		t.Fatal("log metrics with the log off")
	}
	src.set(func(s *engine.Snapshot) {
		s.KVEvents = engine.KVEventsStatus{Log: engine.KVEventLogStatus{Enabled: true, Depth: 11, Capacity: 16,
			Trimmed: 4, Polls: 6, LostAnswers: 2}}
	})
	f := gather(t, m)
	for name, want := range map[string]float64{
		"kvdock_kv_events_log_depth": 11, "kvdock_kv_events_log_trimmed_total": 4,
		"kvdock_kv_events_log_polls_total": 6, "kvdock_kv_events_log_lost_answers_total": 2,
	} {
		if v := promseries.Value(t, f, name); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	if f["kvdock_kv_events_batches_total"] != nil {
		t.Error("stream metrics with the stream off")
	}
}
