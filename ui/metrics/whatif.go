package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"kvdock/core/l1"
	"kvdock/core/whatif"
)

// whatIfDescs are the what-if pool size series: the estimated hit ratio at
// each pool size on the curve and what the estimate rests on.
type whatIfDescs struct {
	hitRatio, policyHitRatio, measured, sampleRate, memory *prometheus.Desc
}

func newWhatIfDescs() whatIfDescs {
	return whatIfDescs{
		hitRatio: prometheus.NewDesc("kvdock_whatif_hit_ratio",
			"Estimated share of looked-up chunks an L1 pool of pool_factor times the current size would hit with LRU eviction, for the recent traffic (0 until lookups are seen).",
			[]string{"pool_factor"}, nil),
		policyHitRatio: prometheus.NewDesc("kvdock_whatif_policy_hit_ratio",
			"The same estimate for an L1 pool with the given eviction policy (LRU, prefix), from the same samples.",
			[]string{"policy", "pool_factor"}, nil),
		measured: prometheus.NewDesc("kvdock_whatif_measured_hit_ratio",
			"The current pool's own hit ratio over the what-if estimator's recent window (the estimate at pool_factor 1 should be near it).", nil, nil),
		sampleRate: prometheus.NewDesc("kvdock_whatif_sample_rate",
			"Share of keys the what-if estimator samples (SHARDS rate).", nil, nil),
		memory: prometheus.NewDesc("kvdock_whatif_memory_bytes",
			"Memory the what-if estimator holds.", nil, nil),
	}
}

func (d whatIfDescs) describe(ch chan<- *prometheus.Desc) {
	ch <- d.hitRatio
	ch <- d.policyHitRatio
	ch <- d.measured
	ch <- d.sampleRate
	ch <- d.memory
}

// collect emits the curves; every factor exists at zero before traffic.
func (d whatIfDescs) collect(c whatif.Curve, gauge func(*prometheus.Desc, float64, ...string)) {
	lru, prefix := pointsAt(c.Points), pointsAt(c.Prefix)
	for _, f := range whatif.Factors() {
		factor := strconv.FormatFloat(f, 'g', -1, 64)
		gauge(d.hitRatio, lru[f], factor)
		gauge(d.policyHitRatio, lru[f], l1.PolicyLRU, factor)
		gauge(d.policyHitRatio, prefix[f], l1.PolicyPrefix, factor)
	}
	gauge(d.measured, c.Measured)
	gauge(d.sampleRate, c.SampleRate)
	gauge(d.memory, float64(c.MemoryBytes))
}

// pointsAt is pts by factor.
func pointsAt(pts []whatif.Point) map[float64]float64 {
	at := make(map[float64]float64, len(pts))
	for _, p := range pts {
		at[p.Factor] = p.HitRatio
	}
	return at
}
