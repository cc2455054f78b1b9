package dashboard

import (
	"math"
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"

	"kvdock/core/engine"
	"kvdock/core/series"
)

func TestSparkline(t *testing.T) {
	nan := math.NaN()
	for _, c := range []struct {
		vals []float64
		w    int
		top  float64
		want string
	}{
		{[]float64{0, 1, 2, 3, 4, 5, 6, 7}, 8, 7, "▁▂▃▄▅▆▇█"},
		{[]float64{0, 0.5, 1}, 5, 1, "  ▁▅█"},  // right-aligned: the newest is on the right
		{[]float64{9, 1, 2}, 2, 0, "▅█"},       // only the newest w, scaled to their peak
		{[]float64{0.01, nan, 1}, 3, 1, "▂ █"}, // any positive value shows; no data is blank
		{[]float64{5, 50}, 2, 10, "▅█"},        // above the top is clipped
		{[]float64{0, 0}, 3, 0, " ▁▁"},         // all zero: the baseline
		{nil, 4, 1, "    "},                    // nothing yet
		{[]float64{1}, 0, 1, ""},
	} {
		if got := sparkline(c.vals, c.w, c.top); got != c.want {
			t.Errorf("sparkline(%v, %d, %v) = %q, want %q", c.vals, c.w, c.top, got, c.want)
		}
	}
}

func TestBlockChart(t *testing.T) {
	got := blockChart([]float64{1, 0.5, 0.25, 0, math.NaN()}, 6, 2, 1)
	want := []string{
		" █    ",
		" ██▄  ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("blockChart =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, l := range blockChart([]float64{3, 1}, 4, 3, 0) {
		if ansi.StringWidth(l) != 4 {
			t.Fatalf("line %q is not 4 cells", l)
		}
	}
}

// TestHeaderRatesDegradeToNumbers: the header's third line keeps the
// tokens headline and the numbers at any width, drops charts first and
// figures from the end when the width runs out.
func TestHeaderRatesDegradeToNumbers(t *testing.T) {
	for _, c := range []struct {
		w          int
		has, lacks []string
	}{
		{160, []string{"12.3 M tokens not recomputed in the last hour", "1 min avg: hit 62% ▇", "in 572 MiB/s ▁", "out 709 MiB/s"}, nil},
		// The short wording keeps every number.
		{80, []string{"12.3 M tokens saved in 1 h", "1 min avg: hit 62%", "in 572 MiB/s", "out 709 MiB/s"}, []string{"MiB/s ▁"}},
		{56, []string{"12.3 M tokens saved in 1 h", "1 min avg: hit 62%"}, []string{"in 572"}},
	} {
		m := newTestModel(t, newFakeEngine(t), c.w, 24)
		line := strings.Split(screen(m), "\n")[2]
		for _, s := range c.has {
			if !strings.Contains(line, s) {
				t.Errorf("%d columns: %q lacks %q", c.w, line, s)
			}
		}
		for _, s := range c.lacks {
			if strings.Contains(line, s) {
				t.Errorf("%d columns: %q has %q", c.w, line, s)
			}
		}
	}
}

// TestHitColumnSortsAndDegrades: the HIT% column sorts by the last
// minute's hit ratio (no lookups last), and is a number only at 60 columns.
func TestHitColumnSortsAndDegrades(t *testing.T) {
	m := newTestModel(t, newFakeEngine(t), 160, 24)
	press(t, m, "P")
	if id := selectedID(t, m); id != "4243" {
		t.Fatalf("descending by hit ratio (first) starts with %s, want 4243 (59%%)", id)
	}
	press(t, m, "P")
	if id := selectedID(t, m); id != "9001" {
		t.Fatalf("ascending by hit ratio starts with %s, want 9001 (no lookups)", id)
	}
	m = newTestModel(t, newFakeEngine(t), 60, 24)
	press(t, m, "P")
	s := screen(m)
	mustContain(t, s, "HIT%", "59%")
	for _, l := range strings.Split(s, "\n")[5:8] {
		if strings.ContainsAny(l, "▁▂▃▄▅▆▇█") {
			t.Fatalf("60 columns still draws a chart in the table: %q", l)
		}
	}
}

// TestDetailsChartsDegradeToNumbers: with room the details view draws
// charts with their scale; without, one wrapped line of numbers.
func TestDetailsChartsDegradeToNumbers(t *testing.T) {
	m := newTestModel(t, newFakeEngine(t), 120, 48)
	press(t, m, "enter")
	mustContain(t, screen(m), "hit ratio (model)", "top 100%", "top 763 MiB/s", "tokens saved 9.9 M")
	m = newTestModel(t, newFakeEngine(t), 80, 24)
	press(t, m, "enter")
	s := screen(m)
	mustContain(t, s, "last minute, model: hit 56% · lookups 4.1/s", "retrieve 277 MiB/s", "tokens saved 9.9 M")
	if strings.Contains(s, "top 100%") {
		t.Fatal("80x24 draws charts it has no room for")
	}
	// A context the sampler has not seen yet says so.
	f := newFakeEngine(t)
	f.snap.Rates = engine.Rates{}
	m = newTestModel(t, f, 120, 48)
	press(t, m, "enter")
	mustContain(t, screen(m), "no rates yet")
}

// TestPoolHistoryDegradesToNumbers: a narrow Pool pane keeps the figures.
func TestPoolHistoryDegradesToNumbers(t *testing.T) {
	m := newTestModel(t, newFakeEngine(t), 80, 24)
	if got := ansi.Strip(strings.Join(m.pc.poolHistory(30), "\n")); got != "History   used 50% now, evictions 1.0/s last min" {
		t.Fatalf("30 columns: %q", got)
	}
	m.goPane(panePool)
	mustContain(t, screen(m), "Used      ▅", "Evicted   ▁")
}

// TestChartsFollowSnapshots: a new snapshot moves the header sparkline
// (what the tmux e2e test watches on the real binary).
func TestChartsFollowSnapshots(t *testing.T) {
	f := newFakeEngine(t)
	f.snap.Rates = engine.Rates{}
	m := newTestModel(t, f, 160, 24)
	before := strings.Split(screen(m), "\n")[2]
	next := f.Snapshot()
	next.Rates.Server.StoreBytes = series.Window{Fine: []float64{0, 0, 2e9}}
	m.Update(snapMsg(next))
	after := strings.Split(screen(m), "\n")[2]
	if before == after || !strings.Contains(after, "in 636 MiB/s") || !strings.Contains(after, "▁▁█") {
		t.Fatalf("header did not follow the snapshot:\n%s\n%s", before, after)
	}
}

// TestRateText: rates read in the binary units of the sizes beside them.
func TestRateText(t *testing.T) {
	for v, want := range map[float64]string{-1: "0 B/s", 0: "0 B/s", 2_500: "2.4 KiB/s", 3.25e6: "3.1 MiB/s", 6e8: "572 MiB/s", 1.5e9: "1.4 GiB/s"} {
		if got := rateText(v); got != want {
			t.Errorf("rateText(%v) = %q, want %q", v, got, want)
		}
	}
}
