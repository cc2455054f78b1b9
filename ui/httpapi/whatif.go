package httpapi

import (
	"time"

	"kvdock/core/whatif"
)

// WhatIfStatus is the what-if pool size estimate: the hit ratio the recent
// traffic would get from pools of other sizes, and what it rests on.
type WhatIfStatus struct {
	// Method names the estimator, for whoever reads the figures.
	Method string `json:"method"`
	// Points are the estimates from 0.25× to 4× the pool ([] before any
	// lookup was seen).
	Points []WhatIfPoint `json:"points"`
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
const whatIfMethod = "SHARDS sampled LRU reuse distances (byte-weighted), watermark loop replayed per size"

func whatIfStatus(c whatif.Curve) WhatIfStatus {
	out := WhatIfStatus{Method: whatIfMethod, Points: make([]WhatIfPoint, 0, len(c.Points)),
		MeasuredHitRatio: c.Measured, SampleRate: c.SampleRate, SampledLookups: c.Sampled,
		WindowWeight: c.Weight, TrackedObjects: c.Tracked, TrackedLimit: c.Limit, MemoryBytes: c.MemoryBytes}
	for _, p := range c.Points {
		out.Points = append(out.Points, WhatIfPoint{PoolFactor: p.Factor, PoolBytes: p.PoolBytes, HitRatio: p.HitRatio})
	}
	return out
}
