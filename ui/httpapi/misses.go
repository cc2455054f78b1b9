package httpapi

import (
	"time"

	"kvdock/core/misses"
)

// MissesStatus says why lookups missed: every chunk a LOOKUP asked for and
// did not hit (lookup.requested_chunks - lookup.hit_chunks) counted under
// one reason, in total and per (model, world size). Reasons: never_stored,
// evicted, expired (a store's write lock ran out before its commit; objects
// never expire by age), cleared, other_layout (stored for the same model by
// workers of another world size: never shareable), refused (a store of the
// key was refused for space or a lock cap), after_miss (stored, but an
// earlier chunk of the prompt missed).
type MissesStatus struct {
	Missed      map[string]uint64 `json:"missed"`
	TotalMissed uint64            `json:"total_missed"`
	// TierMissed counts the missed chunks the L2 tiers were also asked for.
	TierMissed uint64                `json:"tier_missed"`
	Contexts   []ContextMissesStatus `json:"contexts"`
	// Other holds contexts past the per-context cap, together (null when none).
	Other *ContextMissesStatus `json:"other,omitempty"`
	// GhostEntries and GhostBytes size the pool's record of lost and
	// refused keys that tells evicted (and the rest) from never stored.
	GhostEntries int   `json:"ghost_entries"`
	GhostBytes   int64 `json:"ghost_bytes"`
	// Since is when the counts began: the start, the last reset or the
	// last pool rebuild. Benchmark lookups are not counted.
	Since *time.Time `json:"since,omitempty"`
}

// ContextMissesStatus is the miss breakdown of one lookup context.
type ContextMissesStatus struct {
	ModelName   string            `json:"model_name"`
	WorldSize   int               `json:"world_size"`
	Missed      map[string]uint64 `json:"missed"`
	TotalMissed uint64            `json:"total_missed"`
	TierMissed  uint64            `json:"tier_missed"`
}

func contextMisses(c misses.ContextCounts) ContextMissesStatus {
	return ContextMissesStatus{ModelName: c.Model, WorldSize: c.WorldSize, Missed: c.Missed.Map(),
		TotalMissed: c.Missed.Total(), TierMissed: c.TierMissed}
}

func missesStatus(r misses.Report) MissesStatus {
	out := MissesStatus{Missed: r.Total.Map(), TotalMissed: r.Total.Total(), TierMissed: r.TierMissed,
		Contexts: make([]ContextMissesStatus, 0, len(r.Contexts)), GhostEntries: r.GhostEntries, GhostBytes: r.GhostBytes}
	for _, c := range r.Contexts {
		out.Contexts = append(out.Contexts, contextMisses(c))
	}
	if r.Other.Missed.Total() > 0 {
		o := contextMisses(r.Other)
		o.ModelName = "(other)"
		out.Other = &o
	}
	return out
}
