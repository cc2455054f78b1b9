package metrics

import (
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"kvdock/core/misses"
)

// missDescs are the lookup miss metrics: missed chunks by reason, in total
// and per lookup context (model, world size), and those the L2 tiers missed
// too. The reason label takes the names of package misses.
type missDescs struct {
	total, byContext, tier *prometheus.Desc
}

func newMissDescs() missDescs {
	return missDescs{
		total: prometheus.NewDesc("kvdock_lookup_missed_chunks_total",
			"Chunks a LOOKUP asked for and did not hit, by reason (never_stored, evicted, expired, cleared, other_layout, refused, after_miss).",
			[]string{"reason"}, nil),
		byContext: prometheus.NewDesc("kvdock_context_lookup_missed_chunks_total",
			"Chunks a LOOKUP asked for and did not hit, by lookup context (model, world size) and reason.",
			[]string{"model", "world_size", "reason"}, nil),
		tier: prometheus.NewDesc("kvdock_lookup_tier_missed_chunks_total",
			"Missed LOOKUP chunks the L2 tiers were asked for and did not have either.", nil, nil),
	}
}

func (d missDescs) describe(ch chan<- *prometheus.Desc) {
	ch <- d.total
	ch <- d.byContext
	ch <- d.tier
}

// collectMisses emits the miss counters of r; count keeps them monotonic.
// Per-context series exist for the contexts of the current report only (at
// most misses.MaxContexts and "(other)"): the state kept for a context that
// went (a pool rebuild resets the tally) is dropped, so a long life of
// model names does not grow the collector.
func (c *snapshotCollector) collectMisses(r misses.Report, count func(*prometheus.Desc, string, float64, ...string)) {
	d := c.misses
	for i := range misses.NumReasons {
		reason := i.String()
		count(d.total, "miss|"+reason, float64(r.Total[i]), reason)
	}
	count(d.tier, "miss_tier", float64(r.TierMissed))
	ctxs := r.Contexts
	if r.Other.Missed.Total() > 0 {
		o := r.Other
		o.Model, o.WorldSize = "(other)", 0
		ctxs = append(ctxs[:len(ctxs):len(ctxs)], o)
	}
	seen := make(map[string]struct{}, len(ctxs)*int(misses.NumReasons))
	for _, cc := range ctxs {
		ws := strconv.Itoa(cc.WorldSize)
		for i := range misses.NumReasons {
			reason := i.String()
			key := missCtxPrefix + cc.Model + "|" + ws + "|" + reason
			seen[key] = struct{}{}
			count(d.byContext, key, float64(cc.Missed[i]), cc.Model, ws, reason)
		}
	}
	for key := range c.counters {
		if _, ok := seen[key]; !ok && strings.HasPrefix(key, missCtxPrefix) {
			delete(c.counters, key)
		}
	}
}

const missCtxPrefix = "miss_ctx|"
