// Package series keeps the recent history of the engine's rates for the
// faces: fixed-size rings of one point a second for ten minutes and one
// point every ten seconds for two hours, the per-second rate of a
// cumulative counter, and a latency histogram whose per-second quantiles
// feed the same rings.
//
// Memory is fixed when a History is made (about 10 KiB); pushing a sample
// allocates nothing, so a sampler can run every second for the life of the
// process. Nothing here is safe for concurrent use except Latency.Observe:
// the engine's sampler owns the histories and copies them out under its
// own lock.
package series

import (
	"math"
	"time"
)

// The two resolutions.
const (
	FineStep    = time.Second
	FineLen     = 600 // ten minutes of FineStep
	CoarseStep  = 10 * time.Second
	CoarseLen   = 720 // two hours of CoarseStep
	coarseEvery = int(CoarseStep / FineStep)
)

// Ring is a fixed-capacity ring of float64: a push past capacity drops the
// oldest value.
type Ring struct {
	buf  []float64
	head int // index of the next write
	n    int
}

// NewRing returns an empty ring holding up to size values (size >= 1).
func NewRing(size int) Ring {
	return Ring{buf: make([]float64, max(1, size))}
}

// Push appends v, dropping the oldest value when the ring is full.
func (r *Ring) Push(v float64) {
	r.buf[r.head] = v
	r.head++
	if r.head == len(r.buf) {
		r.head = 0
	}
	if r.n < len(r.buf) {
		r.n++
	}
}

// Len is how many values the ring holds; Cap how many it can.
func (r *Ring) Len() int { return r.n }

// Cap is the ring's capacity.
func (r *Ring) Cap() int { return len(r.buf) }

// At is the i-th newest value (0 = the newest); i must be < Len.
func (r *Ring) At(i int) float64 {
	j := r.head - 1 - i
	if j < 0 {
		j += len(r.buf)
	}
	return r.buf[j]
}

// Tail appends the newest min(n, Len) values to dst, oldest first.
func (r *Ring) Tail(dst []float64, n int) []float64 {
	n = min(n, r.n)
	for i := n - 1; i >= 0; i-- {
		dst = append(dst, r.At(i))
	}
	return dst
}

// Sum is the sum of the newest min(n, Len) values.
func (r *Ring) Sum(n int) float64 {
	var s float64
	for i := range min(n, r.n) {
		s += r.At(i)
	}
	return s
}

// History is one quantity at both resolutions: each coarse point is the mean
// of the ten fine points before it (or, for quantiles, what the caller
// computed over those ten seconds).
type History struct {
	Fine, Coarse Ring
	sum          float64 // of the fine points not yet folded into Coarse
	pending      int
}

// NewHistory returns an empty history of FineLen and CoarseLen points.
func NewHistory() History { return NewHistoryOf(FineLen, CoarseLen) }

// NewHistoryOf returns an empty history of fine and coarse points (the
// per-context histories are shorter: there can be many contexts).
func NewHistoryOf(fine, coarse int) History {
	return History{Fine: NewRing(fine), Coarse: NewRing(coarse)}
}

// Push records one fine point; every tenth folds the last ten into a coarse
// point, their mean.
func (h *History) Push(v float64) {
	h.Fine.Push(v)
	h.sum += v
	h.pending++
	if h.pending == coarseEvery {
		h.Coarse.Push(h.sum / float64(coarseEvery))
		h.sum, h.pending = 0, 0
	}
}

// pushWith records one fine point and, every tenth, coarse instead of the
// mean (quantiles do not average).
func (h *History) pushWith(v float64, coarse func() float64) {
	h.Fine.Push(v)
	h.pending++
	if h.pending == coarseEvery {
		h.Coarse.Push(coarse())
		h.sum, h.pending = 0, 0
	}
}

// Total is the integral of a per-second rate over the last d (at most the
// coarse span): the fine points not yet folded, then whole coarse points.
func (h *History) Total(d time.Duration) float64 {
	secs := int(d / FineStep)
	p := min(h.pending, secs)
	t := h.Fine.Sum(p)
	rest := (secs - p) / coarseEvery
	return t + h.Coarse.Sum(rest)*float64(coarseEvery)
}

// Window is a copy of a History's newest points, oldest first, for the
// faces: Fine one a second, Coarse one every ten seconds.
type Window struct {
	Fine   []float64 `json:"fine"`
	Coarse []float64 `json:"coarse,omitempty"`
}

// Window copies the newest fine and coarse points (it allocates: it is for
// the faces, once per snapshot).
func (h *History) Window(fine, coarse int) Window {
	w := Window{Fine: h.Fine.Tail(make([]float64, 0, min(fine, h.Fine.Len())), fine)}
	if coarse > 0 && h.Coarse.Len() > 0 {
		w.Coarse = h.Coarse.Tail(make([]float64, 0, min(coarse, h.Coarse.Len())), coarse)
	}
	return w
}

// Ratio is num[i]/den[i] for the aligned newest points of num and den,
// oldest first, NaN where den is 0 (a second without lookups has no hit
// ratio; a chart leaves it blank).
func Ratio(num, den []float64) []float64 {
	n := min(len(num), len(den))
	num, den = num[len(num)-n:], den[len(den)-n:]
	out := make([]float64, n)
	for i := range out {
		out[i] = math.NaN()
		if den[i] > 0 {
			out[i] = num[i] / den[i]
		}
	}
	return out
}

// SumRatio is sum(num)/sum(den) over the newest n aligned points, false
// when den sums to 0.
func SumRatio(num, den []float64, n int) (float64, bool) {
	n = min(n, len(num), len(den))
	var a, b float64
	for i := 1; i <= n; i++ {
		a += num[len(num)-i]
		b += den[len(den)-i]
	}
	if b <= 0 {
		return 0, false
	}
	return a / b, true
}

// Mean is the mean of the newest n fine points, 0 when there is none.
func (w Window) Mean(n int) float64 {
	n = min(n, len(w.Fine))
	if n == 0 {
		return 0
	}
	var s float64
	for _, v := range w.Fine[len(w.Fine)-n:] {
		s += v
	}
	return s / float64(n)
}

// Last is the newest fine point, 0 when there is none.
func (w Window) Last() float64 {
	if len(w.Fine) == 0 {
		return 0
	}
	return w.Fine[len(w.Fine)-1]
}

// Counter turns a cumulative counter into a per-second rate.
type Counter struct {
	prev float64
	seen bool
}

// Rate is the counter's increase per second since the previous reading, v
// read after elapsed. The first reading gives 0 (nothing to compare with);
// a counter that went down was reset (a pool rebuild restarts the modules'
// counters), so it counts from zero; a non-positive elapsed gives 0.
func (c *Counter) Rate(v float64, elapsed time.Duration) float64 {
	d := c.Delta(v)
	if elapsed <= 0 {
		return 0
	}
	return d / elapsed.Seconds()
}

// Delta is the counter's increase since the previous reading (v itself after
// a reset, 0 on the first reading).
func (c *Counter) Delta(v float64) float64 {
	prev, seen := c.prev, c.seen
	c.prev, c.seen = v, true
	switch {
	case !seen:
		return 0
	case v < prev:
		return v
	}
	return v - prev
}
