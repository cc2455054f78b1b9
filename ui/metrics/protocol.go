package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"kvdock/core/engine"
	"kvdock/settings"
)

// protocolDescs are --protocol auto's detection counters: peers settled on
// each wire table, and those settled by the tie-break (ambiguous).
type protocolDescs struct {
	detections, ambiguous *prometheus.Desc
}

func newProtocolDescs() protocolDescs {
	return protocolDescs{
		detections: prometheus.NewDesc("kvdock_protocol_detections_total",
			"Worker peers --protocol auto settled on each wire table (profile); 0 under a fixed --protocol.",
			[]string{"profile"}, nil),
		ambiguous: prometheus.NewDesc("kvdock_protocol_ambiguous_detections_total",
			"Peers --protocol auto settled by the tie-break: their messages never told the tables apart.", nil, nil),
	}
}

func (d protocolDescs) describe(ch chan<- *prometheus.Desc) {
	ch <- d.detections
	ch <- d.ambiguous
}

// collect emits the detection counters of s, every profile from the first
// scrape; count keeps them monotonic across engine restarts.
func (d protocolDescs) collect(s engine.Snapshot, count func(*prometheus.Desc, string, float64, ...string)) {
	for _, p := range settings.ProtocolProfiles() {
		count(d.detections, "detect|"+p, float64(s.Requests.Detections[p]), p)
	}
	count(d.ambiguous, "detect_ambiguous", float64(s.Requests.AmbiguousDetections))
}
