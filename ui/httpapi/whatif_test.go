package httpapi_test

import (
	"encoding/json"
	"strings"
	"testing"

	"kvdock/core/engine"
	"kvdock/core/whatif"
	"kvdock/ui/httpapi"
)

func TestStatusWhatIf(t *testing.T) {
	// Before traffic: the section is there, with an empty array of points.
	b, err := json.Marshal(httpapi.NewStatus(engine.Snapshot{}))
	if err != nil || !strings.Contains(string(b), `"whatif":{"method":`) || !strings.Contains(string(b), `"points":[]`) ||
		!strings.Contains(string(b), `"policies":{"LRU":[],"prefix":[]}`) {
		t.Fatalf("no traffic: %s %v", b, err)
	}
	s := engine.Snapshot{WhatIf: whatif.Curve{
		Points:   []whatif.Point{{Factor: 0.5, PoolBytes: 1 << 29, HitRatio: 0.25}, {Factor: 2, PoolBytes: 1 << 31, HitRatio: 0.63}},
		Prefix:   []whatif.Point{{Factor: 0.5, PoolBytes: 1 << 29, HitRatio: 0.3}, {Factor: 2, PoolBytes: 1 << 31, HitRatio: 0.66}},
		Measured: 0.41, SampleRate: 0.125, Sampled: 900, Weight: 640.5, Tracked: 90, Limit: 256, MemoryBytes: 7000,
	}}
	b, err = json.Marshal(httpapi.NewStatus(s))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		WhatIf map[string]any `json:"whatif"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"measured_hit_ratio": 0.41, "sample_rate": 0.125, "sampled_lookups": 900.0,
		"window_weight": 640.5, "tracked_objects": 90.0, "tracked_limit": 256.0, "memory_bytes": 7000.0}
	for k, w := range want {
		if doc.WhatIf[k] != w {
			t.Errorf("whatif.%s = %v, want %v", k, doc.WhatIf[k], w)
		}
	}
	pts, _ := doc.WhatIf["points"].([]any)
	if len(pts) != 2 {
		t.Fatalf("points = %v", doc.WhatIf["points"])
	}
	if p := pts[1].(map[string]any); p["pool_factor"] != 2.0 || p["pool_bytes"] != float64(1<<31) || p["hit_ratio"] != 0.63 {
		t.Errorf("points[1] = %v", p)
	}
	// Each policy's points, LRU's the same as points.
	pol, _ := doc.WhatIf["policies"].(map[string]any)
	for name, want := range map[string]float64{"LRU": 0.63, "prefix": 0.66} {
		pts, _ := pol[name].([]any)
		if len(pts) != 2 {
			t.Fatalf("policies[%s] = %v", name, pol[name])
		}
		if p := pts[1].(map[string]any); p["pool_factor"] != 2.0 || p["hit_ratio"] != want {
			t.Errorf("policies[%s][1] = %v, want hit ratio %v", name, p, want)
		}
	}
}
