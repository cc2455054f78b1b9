package httpapi

import (
	"time"

	"kvdock/core/l1"
	"kvdock/core/whatif"
)

// WhatIfStatus is the what-if pool size estimate: the hit ratio the recent
// traffic would get from pools of other sizes, and what it rests on.
type WhatIfStatus struct {
	// Method names the estimator, for whoever reads the figures.
	Method string `json:"method"`
	// Points are the estimates from 0.25× to 4× the pool for LRU eviction
	// ([] before any lookup was seen).
	Points []WhatIfPoint `json:"points"`
	// Policies are the same estimates for each eviction policy, by its
	// eviction_policy name ("LRU": the points above, which stand for
	// "noop" too; "prefix"), from the same samples.
	Policies map[string][]WhatIfPoint `json:"policies"`
	// MeasuredHitRatio is the pool's own hit ratio over the same recent
	// window; the point at pool_factor 1 should be near it.
	MeasuredHitRatio float64 `json:"measured_hit_ratio"`
	SampleRate       float64 `json:"sample_rate"`
	SampledLookups   uint64  `json:"sampled_lookups"`
	WindowWeight     float64 `json:"window_weight"`
	TrackedObjects   int     `json:"tracked_objects"`
	TrackedLimit     int     `json:"tracked_limit"`
	MemoryBytes      int64   `json:"memory_bytes"`
	// WindowSince is where the window the points rest on begins (the
	// lookups before it weigh less, or there are none), WindowSeconds its
	// length at taken_at and Window the same in words ("last 10 min").
	// Benchmark lookups are not shown to the estimator.
	WindowSince   *time.Time `json:"window_since,omitempty"`
	WindowSeconds float64    `json:"window_seconds"`
	Window        string     `json:"window"`
}

// WhatIfPoint is the estimated hit ratio of one pool size.
type WhatIfPoint struct {
	PoolFactor float64 `json:"pool_factor"`
	PoolBytes  int64   `json:"pool_bytes"`
	HitRatio   float64 `json:"hit_ratio"`
}

// whatIfMethod says how the points are computed.
const whatIfMethod = "SHARDS sampled reuse distances (byte-weighted) in LRU and prefix-policy order, watermark loop replayed per size"

func whatIfStatus(c whatif.Curve) WhatIfStatus {
	return WhatIfStatus{Method: whatIfMethod, Points: whatIfPoints(c.Points),
		Policies:         map[string][]WhatIfPoint{l1.PolicyLRU: whatIfPoints(c.Points), l1.PolicyPrefix: whatIfPoints(c.Prefix)},
		MeasuredHitRatio: c.Measured, SampleRate: c.SampleRate, SampledLookups: c.Sampled,
		WindowWeight: c.Weight, TrackedObjects: c.Tracked, TrackedLimit: c.Limit, MemoryBytes: c.MemoryBytes}
}

// whatIfPoints is pts as the status shows them ([] for none).
func whatIfPoints(pts []whatif.Point) []WhatIfPoint {
	out := make([]WhatIfPoint, 0, len(pts))
	for _, p := range pts {
		out = append(out, WhatIfPoint{PoolFactor: p.Factor, PoolBytes: p.PoolBytes, HitRatio: p.HitRatio})
	}
	return out
}
