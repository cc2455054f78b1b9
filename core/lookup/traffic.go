package lookup

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"kvdock/core/keys"
)

// BenchModelPrefix marks benchmark traffic (keys.BenchModelPrefix): the
// lookups of such a model are counted apart (Stats.Bench) and kept out of
// the insight figures (hit ratio, tokens saved, miss breakdown, what-if),
// which are about the real workers.
const BenchModelPrefix = keys.BenchModelPrefix

// IsBench reports whether model is benchmark traffic (see BenchModelPrefix).
func IsBench(model string) bool { return keys.IsBenchModel(model) }

// traffic is one kind of traffic's lookup counters: the workers', or the
// benchmark's.
type traffic struct {
	lookups, earlyExits, failures atomic.Int64
	reqTokens, reqChunks          atomic.Int64
	hitChunks, hitTokens          atomic.Int64
	tierHits                      atomic.Int64
}

func (t *traffic) reset() {
	for _, c := range []*atomic.Int64{&t.lookups, &t.earlyExits, &t.failures, &t.reqTokens,
		&t.reqChunks, &t.hitChunks, &t.hitTokens, &t.tierHits} {
		c.Store(0)
	}
}

// BenchStats are the lookup counters of benchmark traffic (models named
// with BenchModelPrefix), which Stats' own fields leave out.
type BenchStats struct {
	Lookups, EarlyExits, Failures int64
	RequestedChunks, HitChunks    int64
}

func (t *traffic) bench() BenchStats {
	return BenchStats{Lookups: t.lookups.Load(), EarlyExits: t.earlyExits.Load(), Failures: t.failures.Load(),
		RequestedChunks: t.reqChunks.Load(), HitChunks: t.hitChunks.Load()}
}

// trafficOf is the counters a lookup of model adds to.
func (m *Module) trafficOf(model string) *traffic {
	if IsBench(model) {
		return &m.bench
	}
	return &m.work
}

// MaxUnregistered bounds the models without a registered worker that the
// module remembers being looked up; past it the least recently looked up
// goes.
const MaxUnregistered = 8

// Unregistered is a model (at a world size) that LOOKUPs named while no
// worker had registered it: each answered 0 and counted as an early exit,
// typically right after a restart, before the workers register again.
type Unregistered struct {
	Model     string
	WorldSize int
	Lookups   int64
	Last      time.Time
}

// unregistered remembers the MaxUnregistered models most recently looked
// up with no registered worker. Names are cut to keys.MaxModelLen bytes
// (the longest a registration accepts): any peer can send any name.
type unregistered struct {
	mu   sync.Mutex
	list []Unregistered // most recent last
}

func (u *unregistered) note(model string, ws int, now time.Time) {
	model = model[:min(len(model), keys.MaxModelLen)]
	u.mu.Lock()
	defer u.mu.Unlock()
	for i := range u.list {
		e := &u.list[i]
		if e.WorldSize == ws && e.Model == model {
			e.Lookups++
			e.Last = now
			v := *e
			u.list = append(append(u.list[:i], u.list[i+1:]...), v)
			return
		}
	}
	if len(u.list) >= MaxUnregistered {
		u.list = append(u.list[:0], u.list[1:]...)
	}
	u.list = append(u.list, Unregistered{Model: strings.Clone(model), WorldSize: ws, Lookups: 1, Last: now})
}

// Unregistered returns the models looked up recently with no registered
// worker that still have none, most recent first.
func (m *Module) Unregistered() []Unregistered {
	m.unreg.mu.Lock()
	defer m.unreg.mu.Unlock()
	out := make([]Unregistered, 0, len(m.unreg.list))
	for i := len(m.unreg.list) - 1; i >= 0; i-- {
		e := m.unreg.list[i]
		if ids, _ := m.layouts.Registered(e.Model, e.WorldSize); len(ids) == 0 {
			out = append(out, e)
		}
	}
	return out
}

// ResetStats zeroes the traffic counters, the per-model counters, the miss
// breakdown and the record of unregistered models, so that the figures
// that follow describe the traffic from now on. Jobs and their locks are
// left as they are.
func (m *Module) ResetStats() {
	m.work.reset()
	m.bench.reset()
	for _, c := range []*atomic.Int64{&m.replaced, &m.expired, &m.evicted, &m.answered,
		&m.freedKeys, &m.touchedKeys, &m.tierJobs, &m.tierSkipped} {
		c.Store(0)
	}
	m.models.mu.Lock()
	m.models.m = nil
	m.models.mu.Unlock()
	m.misses.Reset()
	m.unreg.mu.Lock()
	m.unreg.list = nil
	m.unreg.mu.Unlock()
}
