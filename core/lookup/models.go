package lookup

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
)

// maxModels bounds the worker models counted apart. Only models with a
// registered layout are counted (registrations are bounded), so the bound
// is a second fence; lookups of models past it count in the totals only.
const maxModels = 1024

// ModelStats are the lookup counters of one model at one world size, which
// the scheduler's LOOKUPs name (not a KV group of a hybrid model).
type ModelStats struct {
	Model           string
	WorldSize       int
	Lookups         int64 // LOOKUPs with at least one full chunk
	RequestedChunks int64
	HitChunks       int64 // in L1 and, with tiers, loaded from them
	HitTokens       int64 // HitChunks × chunk size: prefill the workers did not recompute
}

type modelKey struct {
	model string
	ws    int
}

type modelCounters struct {
	lookups, reqChunks, hitChunks, hitTokens atomic.Int64
}

// models counts lookups per model and world size.
type models struct {
	mu sync.RWMutex
	m  map[modelKey]*modelCounters
}

// add counts lookups of (model, ws) that asked for chunks and hit hit
// (a tier phase adds its hits to the lookup counted before it).
func (g *models) add(model string, ws, lookups, chunks, hit, chunkSize int) {
	k := modelKey{model, ws}
	g.mu.RLock()
	c := g.m[k]
	g.mu.RUnlock()
	if c == nil {
		g.mu.Lock()
		if g.m == nil {
			g.m = map[modelKey]*modelCounters{}
		}
		if c = g.m[k]; c == nil && len(g.m) < maxModels {
			c = &modelCounters{}
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

// ModelStats returns the counters of every worker group that looked up a
// full chunk, by model then world size.
func (m *Module) ModelStats() []ModelStats {
	m.models.mu.RLock()
	out := make([]ModelStats, 0, len(m.models.m))
	for k, c := range m.models.m {
		out = append(out, ModelStats{Model: k.model, WorldSize: k.ws, Lookups: c.lookups.Load(),
			RequestedChunks: c.reqChunks.Load(), HitChunks: c.hitChunks.Load(), HitTokens: c.hitTokens.Load()})
	}
	m.models.mu.RUnlock()
	slices.SortFunc(out, func(a, b ModelStats) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.WorldSize, b.WorldSize))
	})
	return out
}
