package bench

import (
	"sync"
	"time"
)

// verifyGate keeps the bench's own checksums of retrieved chunks apart from
// every worker's timed retrieve work: a retrieve runs inside enter/leave
// (shared), a checksum inside alone (exclusive). With 16 workers on a few
// CPUs the checksums otherwise ran beside the other workers' timed copies
// and took about half their CPU (F16's SHM retrieve measured ×0.54 of the
// segment memcpy while its store, which verifies nothing, met ×0.95).
//
// Because the workers then take turns with the checksums, their timed
// spans no longer all overlap, and the longest worker's timed work would
// understate the phase. The gate therefore also keeps the union of the
// timed spans: the time during which at least one worker was in its timed
// work, which is the retrieve phase's busy time.
type verifyGate struct {
	rw sync.RWMutex

	mu     sync.Mutex
	active int
	since  time.Time
	union  time.Duration
}

// enter starts a span of timed work; it waits while a checksum runs.
func (g *verifyGate) enter() {
	g.rw.RLock()
	g.mu.Lock()
	if g.active == 0 {
		g.since = time.Now()
	}
	g.active++
	g.mu.Unlock()
}

// leave ends the span enter started.
func (g *verifyGate) leave() {
	g.mu.Lock()
	g.active--
	if g.active == 0 {
		g.union += time.Since(g.since)
	}
	g.mu.Unlock()
	g.rw.RUnlock()
}

// alone runs f while no timed work runs (called outside any span).
func (g *verifyGate) alone(f func()) {
	g.rw.Lock()
	defer g.rw.Unlock()
	f()
}

// take returns the union of the spans since the last take, and resets it.
func (g *verifyGate) take() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	u := g.union
	g.union = 0
	return u
}
