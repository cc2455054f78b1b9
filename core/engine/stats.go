package engine

import (
	"fmt"
	"log/slog"
	"time"

	"kvdock/core/keys"
	"kvdock/core/lookup"
	"kvdock/core/whatif"
	"kvdock/settings"
)

// StatsWindow says what the insight figures (hit ratio, tokens saved, miss
// breakdown, what-if) cover, so that every face can label them.
type StatsWindow struct {
	// Since is when the figures started: the engine's start or the last
	// reset, whichever is later. The miss breakdown and the what-if also
	// restart with a pool rebuild (Snapshot.Rebuilt).
	Since time.Time
	// ResetAt is the last reset (zero when none).
	ResetAt time.Time
	// WhatIfFrom is where the what-if curve's window begins: it weighs
	// the last whatif.DefaultWindow sampled lookups most, and this is when
	// the oldest of them came. Zero when all its lookups since Since (or
	// the rebuild) still count in full.
	WhatIfFrom time.Time

	// Across a restart (carry.go, StatsRule): Carried is when this process
	// took its predecessor's figures over (zero when it did not: Since is
	// then this process's start or a reset); PoolSince is when the pool the
	// miss breakdown describes began, when later than Since (a restart that
	// carried the figures and not the pool); Started is this process's
	// start, where the figures of each process (what-if) begin.
	Carried, PoolSince, Started time.Time
	// Rule is StatsRule.
	Rule string
}

// ResetStats zeroes the insight figures: the lookup counters and per-model
// figures, the miss breakdown, the what-if curve's counts, and the hit,
// lookup and tokens-saved histories. What the cache holds, the jobs and
// the locks stay as they are. by says who asked, for the events.
func (e *Engine) ResetStats(by ClearOrigin) (time.Time, error) {
	p := e.cur.Load().dataPlane
	if p == nil || !p.gate.enter() {
		return time.Time{}, errNotRunning
	}
	defer p.gate.exit()
	now := e.opts.Now()
	// Under the sampler's lock: a reading of the counters taken before the
	// reset must not be rated against the zeroed histories.
	e.rates.sampleMu.Lock()
	p.lookup.ResetStats()
	p.whatif.ResetCounts()
	e.rates.resetInsight(now)
	e.rates.sampleMu.Unlock()
	e.events.add(EventLifecycle, slog.LevelInfo, fmt.Sprintf("statistics reset by %s: hit ratio, tokens saved, miss breakdown and what-if start again", by))
	e.log.Info("statistics reset", "by", string(by))
	return now, nil
}

// whatifMarkEvery is how often the sampler notes the what-if's sampled
// lookups; whatifMarks how many notes it keeps (an hour).
const (
	whatifMarkEvery = 10 * time.Second
	whatifMarks     = 360
)

// whatifMark is the what-if's sampled lookups at a time.
type whatifMark struct {
	at      time.Time
	sampled uint64
}

// markWhatIf notes the what-if's sampled lookups now, at most once every
// whatifMarkEvery. A count below the last one (a reset, a rebuild) starts
// the notes again. Called with sampleMu held.
func (r *rates) markWhatIf(now time.Time, est *whatif.Estimator) {
	n := len(r.marks)
	if n > 0 && now.Sub(r.marks[n-1].at) < whatifMarkEvery {
		return
	}
	sampled := est.Curve().Sampled
	if n > 0 && sampled < r.marks[n-1].sampled {
		r.marks = r.marks[:0]
	}
	if len(r.marks) == whatifMarks {
		r.marks = append(r.marks[:0], r.marks[1:]...)
	}
	r.marks = append(r.marks, whatifMark{now, sampled})
}

// whatifFrom is when the last whatif.DefaultWindow sampled lookups began
// (to whatifMarkEvery), zero when fewer came since the notes began.
func (r *rates) whatifFrom(sampled uint64) time.Time {
	r.sampleMu.Lock()
	defer r.sampleMu.Unlock()
	if sampled < whatif.DefaultWindow {
		return time.Time{}
	}
	for i := len(r.marks) - 1; i >= 0; i-- {
		if r.marks[i].sampled <= sampled-whatif.DefaultWindow {
			return r.marks[i].at
		}
	}
	return time.Time{}
}

// statsWindow is the window of the insight figures for a snapshot whose
// engine started at started and whose what-if sampled so many lookups.
func (r *rates) statsWindow(started time.Time, sampled uint64) StatsWindow {
	w := StatsWindow{Since: started, WhatIfFrom: r.whatifFrom(sampled), Started: started, Rule: StatsRule}
	r.mu.Lock()
	w.ResetAt, w.Carried, w.PoolSince = r.resetAt, r.carried, r.poolSince
	if !r.since.IsZero() {
		w.Since = r.since
	}
	r.mu.Unlock()
	if w.ResetAt.After(w.Since) {
		w.Since = w.ResetAt
	}
	return w
}

// UnregisteredMessage says, for the faces, that lookups of model at
// worldSize find no registered worker.
func UnregisteredMessage(model string, worldSize int) string {
	return fmt.Sprintf("no worker registered for model %s (world size %d): lookups answer 0", model, worldSize)
}

// WindowLabel names a window that began at from, seen at now: "1 min",
// "10 min", "2 h" (rounded; "<1 min" under half a minute).
func WindowLabel(from, now time.Time) string {
	d := now.Sub(from)
	switch {
	case d < 30*time.Second:
		return "<1 min"
	case d < 90*time.Minute:
		return fmt.Sprintf("%d min", int(d.Round(time.Minute)/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h", int(d.Round(time.Hour)/time.Hour))
	}
	return fmt.Sprintf("%d d", int(d.Round(24*time.Hour)/(24*time.Hour)))
}

// PlaneStart is where the figures that follow the pool (the miss
// breakdown) begin: Since, or the later rebuild or new pool.
func (w StatsWindow) PlaneStart(rebuilt time.Time) time.Time {
	return latest(w.Since, rebuilt, w.PoolSince)
}

// WhatIfStart is where the what-if curve's window begins: WhatIfFrom when
// older lookups weigh less, else PlaneStart or this process's start.
func (w StatsWindow) WhatIfStart(rebuilt time.Time) time.Time {
	if !w.WhatIfFrom.IsZero() {
		return w.WhatIfFrom
	}
	return latest(w.PlaneStart(rebuilt), w.Started)
}

// latest is the latest of ts.
func latest(ts ...time.Time) time.Time {
	var l time.Time
	for _, t := range ts {
		if t.After(l) {
			l = t
		}
	}
	return l
}

// warnMemory says, in the log and the events, that cfg's pool leaves the
// host little memory (settings.MemoryWarning).
func (e *Engine) warnMemory(cfg settings.Config) {
	if e.opts.Memory == nil {
		return
	}
	if avail, err := e.opts.Memory.MemAvailable(); err == nil {
		e.warnMemoryAt(cfg, avail)
	}
}

// warnMemoryAt is warnMemory with the available memory known.
func (e *Engine) warnMemoryAt(cfg settings.Config, avail int64) {
	if w := settings.MemoryWarning(cfg, avail); w != "" {
		e.log.Warn(w)
		e.events.add(EventLifecycle, slog.LevelWarn, w)
	}
}

// unregisteredKey names a model looked up with no registered worker.
type unregisteredKey struct {
	model string
	ws    int
}

// tellEvery is how often an event repeats that a model's lookups find no
// registered worker while they go on.
const tellEvery = time.Minute

// tellUnregistered adds an event for each model looked up since the last
// sample with no registered worker, at most once a tellEvery per model:
// after a restart the scheduler's lookups answer 0 until the workers
// register again, which the hit ratio alone does not explain. Called with
// sampleMu held.
func (e *Engine) tellUnregistered(now time.Time, list []lookup.Unregistered) {
	r := e.rates
	if r.told == nil {
		r.told = map[unregisteredKey]time.Time{}
	}
	seen := make(map[unregisteredKey]bool, len(list))
	for _, u := range list {
		k := unregisteredKey{u.Model, u.WorldSize}
		seen[k] = true
		if last, ok := r.told[k]; ok && (now.Sub(last) < tellEvery || !u.Last.After(last)) {
			continue
		}
		r.told[k] = now
		e.events.add(EventLifecycle, slog.LevelWarn, fmt.Sprintf("%s (%d so far)",
			UnregisteredMessage(keys.Clip(u.Model), u.WorldSize), u.Lookups))
	}
	for k := range r.told {
		if !seen[k] {
			delete(r.told, k)
		}
	}
}
