package ctl

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"kvdock/ui/httpapi"
)

// statusCount prints a count compactly: exact below 10 000, else with a
// decimal unit (12.3 M).
func statusCount(n int64) string {
	f := float64(n)
	switch {
	case n < 10_000:
		return fmt.Sprint(n)
	case f < 1e6:
		return fmt.Sprintf("%.1f k", f/1e3)
	case f < 1e9:
		return fmt.Sprintf("%.1f M", f/1e6)
	}
	return fmt.Sprintf("%.1f G", f/1e9)
}

// tokensText is the tokens saved: since the start and in the last hour.
func tokensText(t httpapi.TokensSavedStatus) string {
	return fmt.Sprintf("%s prefill tokens not recomputed in the last hour, %s since the start",
		statusCount(t.LastHour), statusCount(t.Total))
}

// missesText is the missed LOOKUP chunks by reason, largest first, with
// the reasons' /status names ("never stored" for never_stored).
func missesText(m httpapi.MissesStatus) string {
	if m.TotalMissed == 0 {
		return "none"
	}
	type reason struct {
		name string
		n    uint64
	}
	var rs []reason
	for name, n := range m.Missed {
		if n > 0 {
			rs = append(rs, reason{name, n})
		}
	}
	slices.SortFunc(rs, func(a, b reason) int {
		if c := cmp.Compare(b.n, a.n); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	})
	parts := make([]string, 0, len(rs))
	for _, r := range rs {
		parts = append(parts, fmt.Sprintf("%s %s", statusCount(int64(r.n)), strings.ReplaceAll(r.name, "_", " ")))
	}
	out := fmt.Sprintf("%s chunks: %s", statusCount(int64(m.TotalMissed)), strings.Join(parts, ", "))
	if m.TierMissed > 0 {
		out += fmt.Sprintf(" (%s missed the L2 tiers too)", statusCount(int64(m.TierMissed)))
	}
	return out
}

// protocolText is the protocol line: the profile, or under auto the
// default and the peers settled on each table.
func protocolText(st httpapi.Status) string {
	d := st.ProtocolDetection
	if d.Mode != "auto" {
		return st.Protocol
	}
	var parts []string
	for _, p := range slices.Sorted(maps.Keys(d.Detections)) {
		if n := d.Detections[p]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", p, n))
		}
	}
	det := "no peer settled yet"
	if len(parts) > 0 {
		det = "peers: " + strings.Join(parts, ", ")
	}
	if d.Ambiguous > 0 {
		det += fmt.Sprintf(" (%d by the tie-break)", d.Ambiguous)
	}
	return fmt.Sprintf("%s (default %s; %s)", st.Protocol, d.Default, det)
}
