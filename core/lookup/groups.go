package lookup

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
)

// maxGroups bounds the worker groups counted apart. Only groups with a
// registered layout are counted (registrations are bounded), so the bound
// is a second fence; lookups of groups past it count in the totals only.
const maxGroups = 1024

// GroupStats are the lookup counters of one worker group: the workers of a
// model and world size, which the scheduler's LOOKUPs name.
type GroupStats struct {
	Model           string
	WorldSize       int
	Lookups         int64 // LOOKUPs with at least one full chunk
	RequestedChunks int64
	HitChunks       int64 // in L1 and, with tiers, loaded from them
	HitTokens       int64 // HitChunks × chunk size: prefill the workers did not recompute
}

type groupKey struct {
	model string
	ws    int
}

type groupCounters struct {
	lookups, reqChunks, hitChunks, hitTokens atomic.Int64
}

// groups counts lookups per worker group.
type groups struct {
	mu sync.RWMutex
	m  map[groupKey]*groupCounters
}

// add counts lookups of (model, ws) that asked for chunks and hit hit
// (a tier phase adds its hits to the lookup counted before it).
func (g *groups) add(model string, ws, lookups, chunks, hit, chunkSize int) {
	k := groupKey{model, ws}
	g.mu.RLock()
	c := g.m[k]
	g.mu.RUnlock()
	if c == nil {
		g.mu.Lock()
		if g.m == nil {
			g.m = map[groupKey]*groupCounters{}
		}
		if c = g.m[k]; c == nil && len(g.m) < maxGroups {
			c = &groupCounters{}
			g.m[k] = c
		}
		g.mu.Unlock()
		if c == nil {
			return
		}
	}
	c.lookups.Add(int64(lookups))
	c.reqChunks.Add(int64(chunks))
	c.hitChunks.Add(int64(hit))
	c.hitTokens.Add(int64(hit) * int64(chunkSize))
}

// GroupStats returns the counters of every worker group that looked up a
// full chunk, by model then world size.
func (m *Module) GroupStats() []GroupStats {
	m.groups.mu.RLock()
	out := make([]GroupStats, 0, len(m.groups.m))
	for k, c := range m.groups.m {
		out = append(out, GroupStats{Model: k.model, WorldSize: k.ws, Lookups: c.lookups.Load(),
			RequestedChunks: c.reqChunks.Load(), HitChunks: c.hitChunks.Load(), HitTokens: c.hitTokens.Load()})
	}
	m.groups.mu.RUnlock()
	slices.SortFunc(out, func(a, b GroupStats) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.WorldSize, b.WorldSize))
	})
	return out
}
