package httpapi

import (
	"kvdock/core/engine"
	"kvdock/settings"
)

// ProtocolDetectionStatus is how workers' wire tables are chosen. Mode is
// "fixed" (one profile, Default) or "auto" (each peer's table detected from
// its first messages; Default serves what no table tells apart).
// Detections counts the peers settled on each profile (every profile
// listed under auto, at 0 until one settles; empty when fixed); Ambiguous
// those among them settled by the tie-break, their messages never telling
// the tables apart.
type ProtocolDetectionStatus struct {
	Mode       string           `json:"mode"`
	Default    string           `json:"default"`
	Detections map[string]int64 `json:"detections"`
	Ambiguous  int64            `json:"ambiguous"`
}

// protocolDetection reads the detection figures of s.
func protocolDetection(s engine.Snapshot) ProtocolDetectionStatus {
	out := ProtocolDetectionStatus{Mode: "fixed", Default: s.Config.Server.ClientProtocol(),
		Detections: map[string]int64{}, Ambiguous: s.Requests.AmbiguousDetections}
	if s.Requests.Profile != "" {
		out.Default = s.Requests.Profile
	}
	if s.Protocol == settings.ProtocolAuto {
		out.Mode = "auto"
		for _, p := range settings.ProtocolProfiles() {
			out.Detections[p] = 0
		}
	}
	for p, n := range s.Requests.Detections {
		out.Detections[p] = n
	}
	return out
}
