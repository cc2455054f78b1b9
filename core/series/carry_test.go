package series

import (
	"slices"
	"testing"
	"time"
)

// A restored history has the points, the totals and the fold state of the
// one it was taken from, and goes on folding where that one was.
func TestHistoryStateRestores(t *testing.T) {
	h := NewHistory()
	for i := range 37 {
		h.Push(float64(i))
	}
	g := NewHistory()
	g.Restore(h.State())
	if g.Total(time.Hour) != h.Total(time.Hour) || !slices.Equal(g.Window(FineLen, CoarseLen).Fine, h.Window(FineLen, CoarseLen).Fine) ||
		!slices.Equal(g.Window(FineLen, CoarseLen).Coarse, h.Window(FineLen, CoarseLen).Coarse) {
		t.Fatalf("restored %+v, from %+v", g.State(), h.State())
	}
	for range 3 {
		h.Push(1)
		g.Push(1)
	}
	if !slices.Equal(g.State().Coarse, h.State().Coarse) {
		t.Fatalf("folding after the restore: %v, want %v", g.State().Coarse, h.State().Coarse)
	}
	// A shorter history keeps the newest points; a fold state its points
	// do not cover starts afresh.
	s := NewHistoryOf(2, 1)
	s.Restore(State{Fine: []float64{1, 2, 3, 4}, Coarse: []float64{5, 6}, Pending: 3})
	if st := s.State(); !slices.Equal(st.Fine, []float64{3, 4}) || !slices.Equal(st.Coarse, []float64{6}) || st.Pending != 0 {
		t.Fatalf("short history %+v", st)
	}
}
