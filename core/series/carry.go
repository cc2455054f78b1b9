package series

// State is a History's points, oldest first, and its fine points not yet
// folded into a coarse one: what a restart hands to the next process so
// the charts and the totals over an hour go on where they were.
type State struct {
	Fine, Coarse []float64
	Pending      int
}

// State copies h's points.
func (h *History) State() State {
	return State{Fine: h.Fine.Tail(nil, h.Fine.Len()), Coarse: h.Coarse.Tail(nil, h.Coarse.Len()),
		Pending: h.pending}
}

// Restore replaces h's points with s's, keeping the newest that fit its
// rings; the points not yet folded are the newest Pending fine ones (the
// next coarse point starts afresh when they were not kept).
func (h *History) Restore(s State) {
	*h = NewHistoryOf(h.Fine.Cap(), h.Coarse.Cap())
	for _, v := range s.Coarse {
		h.Coarse.Push(v)
	}
	for _, v := range s.Fine {
		h.Fine.Push(v)
	}
	if s.Pending > 0 && s.Pending < coarseEvery && s.Pending <= h.Fine.Len() {
		h.sum, h.pending = h.Fine.Sum(s.Pending), s.Pending
	}
}
