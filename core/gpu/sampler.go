package gpu

import (
	"context"
	"sync"
	"time"
)

// DefaultInterval is the refresh interval used when none (or a non-positive
// one) is given.
const DefaultInterval = time.Second

// Sampler reads a Source on its own goroutine (Run) and keeps the latest
// snapshot for readers, so a slow or hung driver never stalls the UI.
type Sampler struct {
	src     Source
	changed chan struct{} // wakes Run after SetInterval; buffered 1

	mu     sync.Mutex
	latest Snapshot
	every  time.Duration
}

// NewSampler returns a Sampler over src. Until the first reading, Latest
// reports Available=false with a "not sampled yet" reason. The Sampler never
// closes src; its owner does, after Run returns.
func NewSampler(src Source) *Sampler {
	return &Sampler{
		src:     src,
		changed: make(chan struct{}, 1),
		latest:  Snapshot{Reason: "GPU telemetry not sampled yet"},
		every:   DefaultInterval,
	}
}

// Run samples now and then every interval until ctx is done. every sets the
// interval (as SetInterval does); SetInterval changes it while Run runs, the
// next reading then comes one new interval after the change.
func (s *Sampler) Run(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = DefaultInterval
	}
	s.mu.Lock()
	s.every = every
	s.mu.Unlock()
	if ctx.Err() != nil {
		return
	}
	s.sample()
	t := time.NewTimer(s.interval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.changed:
			t.Reset(s.interval())
		case <-t.C:
			s.sample()
			t.Reset(s.interval())
		}
	}
}

// Latest returns a copy of the most recent snapshot. It never waits for a
// reading in progress.
func (s *Sampler) Latest() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.latest.Clone()
}

// SetInterval changes the refresh interval; d <= 0 means DefaultInterval.
func (s *Sampler) SetInterval(d time.Duration) {
	if d <= 0 {
		d = DefaultInterval
	}
	s.mu.Lock()
	s.every = d
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default: // a wake-up is already pending; Run reads the new value then
	}
}

// Interval returns the current refresh interval.
func (s *Sampler) Interval() time.Duration { return s.interval() }

func (s *Sampler) interval() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.every
}

// sample reads the source outside the lock, so Latest stays instant.
func (s *Sampler) sample() {
	snap := s.src.Sample()
	s.mu.Lock()
	s.latest = snap
	s.mu.Unlock()
}
