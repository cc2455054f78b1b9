package engine

import (
	"context"
	"time"
)

// every returns a loop that calls f each period until its context is done:
// the one schedule of the engine's periodic work (the pool's maintenance,
// the sweeps of sessions, lookup jobs and pending transfers, the rate
// samples). The packages offer one pass; the engine decides when it runs.
func every(period time.Duration, f func()) func(context.Context) {
	return func(ctx context.Context) {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				f()
			}
		}
	}
}
