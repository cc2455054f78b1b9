package engine

import (
	"fmt"
	"log/slog"
	"time"

	"kvdock/core/logcap"
	"kvdock/core/misses"
	"kvdock/core/restart"
	"kvdock/core/series"
)

// The operator's view across a restart follows one rule, the one a pool
// rebuild follows (StatsRule): the server's figures (hit ratio and lookup
// rates, tokens saved, bandwidth, evictions, pool use, the events) belong to
// the server, not to a process, so a restart that hands its record over
// carries them like a rebuild keeps them; the miss breakdown belongs to the
// pool, so it goes on when the restart adopts the pool and starts again
// with a new one (a rebuild, or a restart that could not adopt). The
// what-if curve, the per-context histories and the latencies start with
// each process; their windows say so. A start with no record (a first
// start, a stop that kept nothing) starts everything, and a reset starts
// every figure again.

// StatsRule says on screen and in /status what the figures cover.
const StatsRule = "figures span pool rebuilds and restarts that hand over their record; " +
	"the miss breakdown follows the pool; the what-if, per-context rates and latencies start with each process"

// The server's histories by their name in the record.
func (r *rates) serverSeries() map[string]*series.History {
	return map[string]*series.History{
		"lookups": &r.lookups.h, "asked_chunks": &r.asked.h, "hit_chunks": &r.hit.h, "tokens_saved": &r.tokens.h,
		"evictions": &r.evictions.h, "store_bytes": &r.storeB, "retrieve_bytes": &r.retrieveB, "pool_used": &r.used,
	}
}

// statsRecord is what the record carries of the figures, with the plane p
// being kept and the engine started at started.
func (e *Engine) statsRecord(p *dataPlane, started time.Time) *restart.Stats {
	e.rates.sampleMu.Lock()
	defer e.rates.sampleMu.Unlock()
	r := e.rates
	r.mu.Lock()
	s := &restart.Stats{Since: r.since, ResetAt: r.resetAt, Taken: r.taken, TokensSavedTotal: r.tokensTotal}
	if s.Since.IsZero() {
		s.Since = started
	}
	if s.ResetAt.After(s.Since) {
		s.Since = s.ResetAt
	}
	if s.Taken.Before(s.Since) {
		s.Taken = s.Since // no sample yet: nothing in the histories is older
	}
	for name, h := range r.serverSeries() {
		s.Series = append(s.Series, restart.Series{Name: name, State: h.State()})
	}
	r.mu.Unlock()
	m := p.lookup.Misses()
	toRec := func(c misses.ContextCounts) restart.MissCounts {
		return restart.MissCounts{Model: c.Model, WorldSize: c.WorldSize, Missed: c.Missed, TierMissed: c.TierMissed}
	}
	s.Misses = restart.Misses{Total: restart.MissCounts{Missed: m.Total, TierMissed: m.TierMissed}, Other: toRec(m.Other)}
	for _, c := range m.Contexts {
		s.Misses.Contexts = append(s.Misses.Contexts, toRec(c))
	}
	for _, ev := range e.events.recent(restart.MaxEvents) {
		s.Events = append(s.Events, restart.Event{Time: ev.Time, Kind: string(ev.Kind), Level: int(ev.Level), Message: ev.Message})
	}
	return s
}

// carryStats takes a predecessor's figures over at now: the histories and
// the events at once; adopted says whether its pool was adopted (then
// restoreRegistrations adds its miss breakdown to the new plane's),
// otherwise the pool's figures start now.
func (e *Engine) carryStats(st *restart.Stats, adopted bool, now time.Time) {
	if st == nil {
		return
	}
	r := e.rates
	r.sampleMu.Lock()
	r.mu.Lock()
	hs := r.serverSeries()
	for _, s := range st.Series {
		if h := hs[s.Name]; h != nil {
			h.Restore(s.State)
		}
	}
	// The first sample counts this process's counters over the time since
	// the predecessor's last sample.
	r.countFromZero()
	r.taken = st.Taken
	r.tokensTotal = st.TokensSavedTotal
	r.since, r.resetAt, r.carried = st.Since, st.ResetAt, now
	if !adopted {
		r.poolSince = now
	}
	r.marks = r.marks[:0]
	r.mu.Unlock()
	r.sampleMu.Unlock()
	evs := make([]Event, 0, len(st.Events))
	for _, ev := range st.Events {
		evs = append(evs, Event{Time: ev.Time, Kind: EventKind(ev.Kind), Level: slog.Level(ev.Level),
			Message: logcap.Truncate(ev.Message, logcap.DefaultMaxString)})
	}
	e.events.carry(evs)
	what := "the pool adopted"
	if !adopted {
		what = "a new pool: the miss breakdown starts now"
	}
	e.events.add(EventLifecycle, slog.LevelInfo, fmt.Sprintf("restart: figures since %s carried over (%s); %s",
		st.Since.Format(time.DateTime), what, StatsRule))
}

// carriedMisses is a record's miss breakdown as a report.
func carriedMisses(m restart.Misses) misses.Report {
	ctx := func(c restart.MissCounts) misses.ContextCounts {
		return misses.ContextCounts{Context: misses.Context{Model: c.Model, WorldSize: c.WorldSize}, Missed: c.Missed, TierMissed: c.TierMissed}
	}
	r := misses.Report{Total: m.Total.Missed, TierMissed: m.Total.TierMissed, Other: ctx(m.Other)}
	for _, c := range m.Contexts {
		r.Contexts = append(r.Contexts, ctx(c))
	}
	return r
}

// carry puts a predecessor's events before this process's, the newest
// that fit the ring, and numbers them all again in order. The faces
// subscribe once the engine has started, after this.
func (l *eventLog) carry(evs []Event) {
	if len(evs) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var own []Event
	if l.full {
		own = append(own, l.ring[l.next:]...)
	}
	own = append(own, l.ring[:l.next]...)
	all := append(evs[:len(evs):len(evs)], own...)
	if len(all) > len(l.ring) {
		all = all[len(all)-len(l.ring):]
	}
	clear(l.ring)
	for i := range all {
		all[i].Seq = uint64(i + 1)
		l.ring[i] = all[i]
	}
	l.seq = uint64(len(all))
	l.next = len(all) % len(l.ring)
	l.full = len(all) == len(l.ring)
}
