// Package fakeclock is the settable clock the tests inject wherever a
// package takes a Now func (pool TTLs, sessions, lookup locks, transfer
// pending maps, log rate limits), so time-dependent behaviour is tested by
// advancing time instead of sleeping through it.
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a clock that moves only when told. It is safe for concurrent use:
// the code under test reads it from its own goroutines.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// New returns a clock at a fixed instant (1,700,000,000 s after the epoch),
// so tests that print times are reproducible.
func New() *Clock { return At(time.Unix(1_700_000_000, 0)) }

// At returns a clock at t.
func At(t time.Time) *Clock { return &Clock{t: t} }

// Now is the clock's time; pass the method value (c.Now) as a Now func.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d (backward when d is negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
