package restart

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"kvdock/core/misses"
	"kvdock/core/series"
)

// Stats is the operator's view a stopping kvdock hands to its successor,
// so that a restart does not start the figures again: the server's rate
// histories and tokens saved, the miss breakdown, and the events.
type Stats struct {
	// Since is when the figures began (a start with nothing to carry, or
	// a reset); ResetAt is the last reset (zero when none).
	Since, ResetAt time.Time
	// Taken is when the histories' newest point was sampled.
	Taken            time.Time
	TokensSavedTotal int64
	Series           []Series
	Misses           Misses
	Events           []Event
}

// Series is one history by name, its points oldest first.
type Series struct {
	Name string
	series.State
}

// Misses is the miss breakdown: every missed chunk by reason, the contexts
// tallied one by one, and those past the tally's bound together.
type Misses struct {
	Total, Other MissCounts
	Contexts     []MissCounts
}

// MissCounts is one context's missed chunks by reason (misses.Reason order).
type MissCounts struct {
	Model      string
	WorldSize  int
	Missed     misses.Counts
	TierMissed uint64
}

// Event is one line of the events history.
type Event struct {
	Time    time.Time
	Kind    string
	Level   int
	Message string
}

// Bounds on the statistics a record may carry; past one, the part is left
// out with the reason.
const (
	MaxSeries     = 32
	MaxEvents     = 1024
	maxNameBytes  = 64
	maxWorldSize  = 1 << 16
	maxEventLevel = 16
)

// The wire form. Peer strings (model names, event texts) are bytes, so
// JSON keeps them exactly (base64), invalid UTF-8 included.
type statsWire struct {
	Since   int64        `json:"since_ns"`
	ResetAt int64        `json:"reset_at_ns,omitempty"`
	Taken   int64        `json:"taken_ns"`
	Tokens  int64        `json:"tokens_saved"`
	Series  []seriesWire `json:"series"`
	Misses  missesWire   `json:"misses"`
	Events  []eventWire  `json:"events"`
}

type seriesWire struct {
	Name    string    `json:"name"`
	Fine    []float64 `json:"fine"`
	Coarse  []float64 `json:"coarse"`
	Pending int       `json:"pending"`
}

type missWire struct {
	Model      []byte   `json:"m"`
	WorldSize  int      `json:"ws"`
	Missed     []uint64 `json:"c"`
	TierMissed uint64   `json:"l2"`
}

type missesWire struct {
	Total    missWire   `json:"total"`
	Other    missWire   `json:"other"`
	Contexts []missWire `json:"contexts"`
}

type eventWire struct {
	Time    int64  `json:"t"`
	Kind    string `json:"k"`
	Level   int    `json:"l"`
	Message []byte `json:"m"`
}

func missToWire(c MissCounts) missWire {
	return missWire{Model: []byte(c.Model), WorldSize: c.WorldSize, Missed: c.Missed[:], TierMissed: c.TierMissed}
}

// encodeStats renders s, nil when there is none.
func encodeStats(s *Stats) (json.RawMessage, error) {
	if s == nil {
		return nil, nil
	}
	w := statsWire{Since: s.Since.UnixNano(), Taken: s.Taken.UnixNano(), Tokens: s.TokensSavedTotal,
		Series: make([]seriesWire, 0, len(s.Series)), Events: make([]eventWire, 0, len(s.Events)),
		Misses: missesWire{Total: missToWire(s.Misses.Total), Other: missToWire(s.Misses.Other),
			Contexts: make([]missWire, 0, len(s.Misses.Contexts))}}
	if !s.ResetAt.IsZero() {
		w.ResetAt = s.ResetAt.UnixNano()
	}
	for _, h := range s.Series {
		w.Series = append(w.Series, seriesWire{Name: h.Name, Fine: h.Fine, Coarse: h.Coarse, Pending: h.Pending})
	}
	for _, c := range s.Misses.Contexts {
		w.Misses.Contexts = append(w.Misses.Contexts, missToWire(c))
	}
	for _, e := range s.Events {
		w.Events = append(w.Events, eventWire{Time: e.Time.UnixNano(), Kind: e.Kind, Level: e.Level, Message: []byte(e.Message)})
	}
	js, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("statistics: %w", err)
	}
	return js, nil
}

// decodeStats parses and checks the statistics of a record written at
// written. Nothing of it is trusted: a block that does not parse, or whose
// times are not those of a record written then, is left out whole; a
// series, a miss context or an event that breaks a bound is left out
// alone. ignored says what was left out and why (a few reasons, then a
// count).
func decodeStats(raw json.RawMessage, written time.Time) (s *Stats, ignored []string) {
	if len(raw) == 0 {
		return nil, nil
	}
	var w statsWire
	if err := json.Unmarshal(raw, &w); err != nil {
		return nil, []string{fmt.Sprintf("statistics left out: %v", err)}
	}
	wn := written.UnixNano()
	switch {
	case w.Since <= 0 || w.Since > wn || w.Taken < w.Since || w.Taken > wn:
		return nil, []string{fmt.Sprintf("statistics left out: since %d ns, taken %d ns, for a record written at %d ns", w.Since, w.Taken, wn)}
	case w.ResetAt != 0 && (w.ResetAt < w.Since || w.ResetAt > wn):
		return nil, []string{fmt.Sprintf("statistics left out: reset at %d ns, outside [%d, %d]", w.ResetAt, w.Since, wn)}
	case w.Tokens < 0:
		return nil, []string{fmt.Sprintf("statistics left out: %d tokens saved", w.Tokens)}
	}
	var dropped int
	drop := func(format string, args ...any) {
		if dropped++; dropped <= 4 {
			ignored = append(ignored, fmt.Sprintf(format, args...))
		}
	}
	s = &Stats{Since: time.Unix(0, w.Since), Taken: time.Unix(0, w.Taken), TokensSavedTotal: w.Tokens}
	if w.ResetAt != 0 {
		s.ResetAt = time.Unix(0, w.ResetAt)
	}
	if len(w.Series) > MaxSeries {
		drop("statistics: %d series, at most %d: the rest left out", len(w.Series), MaxSeries)
		w.Series = w.Series[:MaxSeries]
	}
	names := map[string]bool{}
	for i, h := range w.Series {
		if why := checkSeries(h); why != "" || names[h.Name] {
			if why == "" {
				why = "a second series of that name"
			}
			drop("statistics: series %d (%q) left out: %s", i, bounded(h.Name), why)
			continue
		}
		names[h.Name] = true
		s.Series = append(s.Series, Series{Name: h.Name, State: series.State{Fine: h.Fine, Coarse: h.Coarse, Pending: h.Pending}})
	}
	var ok bool
	if s.Misses.Total, ok = missFromWire(w.Misses.Total); !ok {
		drop("statistics: the miss breakdown left out: its total breaks a bound")
		w.Misses = missesWire{}
	}
	s.Misses.Other, _ = missFromWire(w.Misses.Other)
	if len(w.Misses.Contexts) > misses.MaxContexts {
		drop("statistics: %d miss contexts, at most %d: the rest left out", len(w.Misses.Contexts), misses.MaxContexts)
		w.Misses.Contexts = w.Misses.Contexts[:misses.MaxContexts]
	}
	for i, c := range w.Misses.Contexts {
		mc, ok := missFromWire(c)
		if !ok {
			drop("statistics: miss context %d left out: it breaks a bound", i)
			continue
		}
		s.Misses.Contexts = append(s.Misses.Contexts, mc)
	}
	if len(w.Events) > MaxEvents {
		drop("statistics: %d events, at most %d: the oldest left out", len(w.Events), MaxEvents)
		w.Events = w.Events[len(w.Events)-MaxEvents:]
	}
	for i, e := range w.Events {
		if e.Time <= 0 || e.Time > wn || len(e.Kind) > maxNameBytes || len(e.Message) > MaxStringBytes ||
			e.Level < -maxEventLevel || e.Level > maxEventLevel {
			drop("statistics: event %d left out: time %d ns, kind of %d bytes, level %d, text of %d bytes",
				i, e.Time, len(e.Kind), e.Level, len(e.Message))
			continue
		}
		s.Events = append(s.Events, Event{Time: time.Unix(0, e.Time), Kind: e.Kind, Level: e.Level, Message: string(e.Message)})
	}
	if dropped > 4 {
		ignored = append(ignored, fmt.Sprintf("statistics: %d more part(s) left out", dropped-4))
	}
	return s, ignored
}

// checkSeries says why h breaks a bound ("" when it does not): at most the
// server's history lengths, every point a finite rate or level (not
// negative), the fold state of a history.
func checkSeries(h seriesWire) string {
	finite := func(vs []float64) bool {
		for _, v := range vs {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return false
			}
		}
		return true
	}
	switch {
	case h.Name == "" || len(h.Name) > maxNameBytes:
		return fmt.Sprintf("a name of %d bytes", len(h.Name))
	case len(h.Fine) > series.FineLen || len(h.Coarse) > series.CoarseLen:
		return fmt.Sprintf("%d fine and %d coarse points, at most %d and %d", len(h.Fine), len(h.Coarse), series.FineLen, series.CoarseLen)
	case !finite(h.Fine) || !finite(h.Coarse):
		return "a point that is negative or not a finite number"
	case h.Pending < 0 || h.Pending >= int(series.CoarseStep/series.FineStep) || h.Pending > len(h.Fine):
		return fmt.Sprintf("%d pending points", h.Pending)
	}
	return ""
}

// missFromWire checks and converts one context's counts.
func missFromWire(c missWire) (MissCounts, bool) {
	if len(c.Model) > MaxStringBytes || c.WorldSize < 0 || c.WorldSize > maxWorldSize ||
		(len(c.Missed) != 0 && len(c.Missed) != int(misses.NumReasons)) {
		return MissCounts{}, false
	}
	m := MissCounts{Model: string(c.Model), WorldSize: c.WorldSize, TierMissed: c.TierMissed}
	copy(m.Missed[:], c.Missed)
	return m, true
}
