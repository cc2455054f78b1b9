package metrics

import (
	"net/http/httptest"
	"strings"
	"testing"

	"kvdock/core/engine"
	"kvdock/core/testkit/promseries"
	"kvdock/core/whatif"
)

func TestWhatIfSeries(t *testing.T) {
	src, m := watched()
	// Before traffic every factor exists, at zero.
	fams := gather(t, m)
	for _, f := range []string{"0.25", "0.5", "0.75", "1", "1.5", "2", "3", "4"} {
		if got := promseries.Value(t, fams, "kvdock_whatif_hit_ratio", "pool_factor", f); got != 0 {
			t.Errorf("pool_factor %s before traffic = %v, want 0", f, got)
		}
	}
	src.set(func(s *engine.Snapshot) {
		s.WhatIf = whatif.Curve{
			Points:   []whatif.Point{{Factor: 0.5, HitRatio: 0.2}, {Factor: 1, HitRatio: 0.41}, {Factor: 2, HitRatio: 0.63}},
			Prefix:   []whatif.Point{{Factor: 0.5, HitRatio: 0.3}, {Factor: 1, HitRatio: 0.47}, {Factor: 2, HitRatio: 0.66}},
			Measured: 0.4, SampleRate: 0.01, MemoryBytes: 7000,
		}
	})
	fams = gather(t, m)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"kvdock_whatif_hit_ratio", []string{"pool_factor", "2"}, 0.63},
		{"kvdock_whatif_hit_ratio", []string{"pool_factor", "1"}, 0.41},
		{"kvdock_whatif_hit_ratio", []string{"pool_factor", "0.5"}, 0.2},
		{"kvdock_whatif_policy_hit_ratio", []string{"policy", "LRU", "pool_factor", "1"}, 0.41},
		{"kvdock_whatif_policy_hit_ratio", []string{"policy", "prefix", "pool_factor", "1"}, 0.47},
		{"kvdock_whatif_policy_hit_ratio", []string{"policy", "prefix", "pool_factor", "2"}, 0.66},
		{"kvdock_whatif_measured_hit_ratio", nil, 0.4},
		{"kvdock_whatif_sample_rate", nil, 0.01},
		{"kvdock_whatif_memory_bytes", nil, 7000},
	} {
		if got := promseries.Value(t, fams, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), `kvdock_whatif_hit_ratio{pool_factor="2"} 0.63`) {
		t.Errorf("exposition lacks the 2x point:\n%s", grepLines(rec.Body.String(), "whatif"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
