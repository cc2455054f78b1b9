// Package logcap bounds what kvdock writes to its log. Peers control much of
// what a log line carries (model names, request ids, the text of the errors
// their input causes), so every string of a record is cut to a limit, and
// records beyond a global rate are dropped and counted, with one line saying
// how many when logging resumes.
package logcap

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// Defaults of Options.
const (
	DefaultMaxString = 512
	DefaultRate      = 20  // records per second
	DefaultBurst     = 100 // records
)

// Truncate cuts s to at most max bytes (on a rune boundary) and says how
// long it was: "abc…(8388608 bytes)". Shorter strings come back unchanged.
func Truncate(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…(" + strconv.Itoa(len(s)) + " bytes)"
}

// Options configure a Handler; zero values take the defaults.
type Options struct {
	// MaxString is the most bytes kept of the message and of each string
	// value (errors and Stringers included).
	MaxString int
	// Rate and Burst size the token buckets: one for warnings and errors,
	// one for info, one for debug, so a flood at one level cannot silence
	// another.
	Rate  float64
	Burst int
	Now   func() time.Time
}

// Handler wraps another slog.Handler with truncation and the rate limit.
// Handlers derived with WithAttrs and WithGroup share the limit.
type Handler struct {
	next  slog.Handler
	max   int
	warn  *bucket // Warn and above
	info  *bucket // Info up to Warn
	debug *bucket // below Info
}

// NewHandler returns next bounded by o.
func NewHandler(next slog.Handler, o Options) *Handler {
	o.MaxString = positiveOr(o.MaxString, DefaultMaxString)
	o.Rate = positiveOr(o.Rate, DefaultRate)
	o.Burst = positiveOr(o.Burst, DefaultBurst)
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Handler{
		next:  next,
		max:   o.MaxString,
		warn:  newBucket(o.Rate, o.Burst, o.Now),
		info:  newBucket(o.Rate, o.Burst, o.Now),
		debug: newBucket(o.Rate, o.Burst, o.Now),
	}
}

// Enabled reports what the wrapped handler reports.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// Handle passes r on with its strings cut, unless its bucket is empty; the
// first record let through after a drop is preceded by a line counting the
// dropped ones.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	b, level := h.info, slog.LevelInfo
	switch {
	case r.Level >= slog.LevelWarn:
		b, level = h.warn, slog.LevelWarn
	case r.Level < slog.LevelInfo:
		b, level = h.debug, slog.LevelDebug
	}
	ok, dropped, first := b.take(r.Message, h.max)
	if !ok {
		return nil
	}
	if dropped > 0 {
		s := slog.NewRecord(r.Time, level, fmt.Sprintf("%d similar log lines suppressed (log rate limit)", dropped), 0)
		s.AddAttrs(slog.Int64("suppressed", dropped), slog.String("first", first))
		if err := h.next.Handle(ctx, s); err != nil {
			return err
		}
	}
	out := slog.NewRecord(r.Time, r.Level, Truncate(r.Message, h.max), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

// WithAttrs cuts the attributes once, here.
func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	cut := make([]slog.Attr, len(as))
	for i, a := range as {
		cut[i] = h.attr(a)
	}
	c := *h
	c.next = h.next.WithAttrs(cut)
	return &c
}

// WithGroup opens a group on the wrapped handler.
func (h *Handler) WithGroup(name string) slog.Handler {
	c := *h
	c.next = h.next.WithGroup(Truncate(name, h.max))
	return &c
}

// attr cuts the strings of a: plain strings, groups, errors, Stringers and
// byte slices. Other values pass as they are.
func (h *Handler) attr(a slog.Attr) slog.Attr {
	a.Key = Truncate(a.Key, h.max)
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		if s := v.String(); len(s) > h.max {
			v = slog.StringValue(Truncate(s, h.max))
		}
	case slog.KindGroup:
		g := v.Group()
		cut := make([]slog.Attr, len(g))
		for i, ga := range g {
			cut[i] = h.attr(ga)
		}
		v = slog.GroupValue(cut...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			if s := x.Error(); len(s) > h.max {
				v = slog.StringValue(Truncate(s, h.max))
			}
		case fmt.Stringer:
			if s := x.String(); len(s) > h.max {
				v = slog.StringValue(Truncate(s, h.max))
			}
		case []byte:
			if len(x) > h.max {
				v = slog.StringValue(string(x[:h.max]) + "…(" + strconv.Itoa(len(x)) + " bytes)")
			}
		}
	}
	a.Value = v
	return a
}

// bucket is a token bucket that counts what it refuses.
type bucket struct {
	mu      sync.Mutex
	now     func() time.Time
	rate    float64
	burst   float64
	tokens  float64
	last    time.Time
	dropped int64
	first   string // message of the first record dropped since the last pass
}

func newBucket(rate float64, burst int, now func() time.Time) *bucket {
	return &bucket{now: now, rate: rate, burst: float64(burst), tokens: float64(burst), last: now()}
}

// take spends a token for a record with message msg. When it succeeds it
// returns how many records were dropped since the last success and the
// message of the first of them.
func (b *bucket) take(msg string, max int) (ok bool, dropped int64, first string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.tokens = min(b.burst, b.tokens+dt*b.rate)
	}
	b.last = now
	if b.tokens < 1 {
		if b.dropped == 0 {
			b.first = Truncate(msg, max)
		}
		b.dropped++
		return false, 0, ""
	}
	b.tokens--
	dropped, first = b.dropped, b.first
	b.dropped, b.first = 0, ""
	return true, dropped, first
}

// positiveOr is v, or def where v is not positive: an option left unset
// takes its default. Each core leaf keeps its own, so none imports settings.
func positiveOr[T ~int | ~int64 | ~float64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}
