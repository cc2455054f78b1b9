package metrics

import (
	"testing"

	"kvdock/core/engine"
	"kvdock/core/testkit/promseries"
	"kvdock/settings"
)

// TestProtocolDetectionMetrics: every profile's detection counter exists at
// zero from the first scrape, counts the snapshot's detections, and stays
// monotonic when an engine restart resets the wire server's counters.
func TestProtocolDetectionMetrics(t *testing.T) {
	src, m := watched()
	fams := gather(t, m)
	for _, p := range settings.ProtocolProfiles() {
		if v := promseries.Value(t, fams, "kvdock_protocol_detections_total", "profile", p); v != 0 {
			t.Errorf("%s before traffic = %v", p, v)
		}
	}
	if v := promseries.Value(t, fams, "kvdock_protocol_ambiguous_detections_total"); v != 0 {
		t.Errorf("ambiguous before traffic = %v", v)
	}
	src.set(func(s *engine.Snapshot) {
		s.Requests.Detections = map[string]int64{"rpc-messages": 3, "nongpu-v1": 1}
		s.Requests.AmbiguousDetections = 1
	})
	fams = gather(t, m)
	for p, want := range map[string]float64{"rpc-messages": 3, "nongpu-v1": 1, "engine-driven": 0} {
		if v := promseries.Value(t, fams, "kvdock_protocol_detections_total", "profile", p); v != want {
			t.Errorf("%s = %v, want %v", p, v, want)
		}
	}
	if v := promseries.Value(t, fams, "kvdock_protocol_ambiguous_detections_total"); v != 1 {
		t.Errorf("ambiguous = %v, want 1", v)
	}
	// A restart: the server counts from zero again; the series does not.
	src.set(func(s *engine.Snapshot) { s.Requests.Detections = map[string]int64{"rpc-messages": 2} })
	if v := promseries.Value(t, gather(t, m), "kvdock_protocol_detections_total", "profile", "rpc-messages"); v != 5 {
		t.Errorf("rpc-messages after a restart = %v, want 5", v)
	}
}
