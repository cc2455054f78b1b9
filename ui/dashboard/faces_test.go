package dashboard

import (
	"fmt"
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"
)

// TestPoolPaneScrolls: at 80×24 the Pool pane does not fit; pgdn shows
// the rest (the what-if chart whole), G its end, g its top again, and the
// help bar offers the keys while it does not fit.
func TestPoolPaneScrolls(t *testing.T) {
	m := newTestModel(t, newFakeEngine(t), 80, 24)
	press(t, m, "2")
	top := screen(m)
	mustContain(t, top, "more below (pgdn, G bottom)", "pgdn/ctrl+d page down")
	press(t, m, "pgdown")
	golden(t, "pool_scrolled_80x24", goldenView(m))
	press(t, m, "G")
	end := screen(m)
	mustContain(t, end, "more above (pgup, g top)", "What-if   2× pool", "100% ┤", "× pool (1.0 GiB now)", "estimate from")
	mustNotContain(t, end, "more below")
	press(t, m, "g")
	if screen(m) != top {
		t.Fatalf("g did not go back to the top:\n%s", screen(m))
	}
	// At 160×48 it fits: no scrolling, no keys offered.
	m = newTestModel(t, newFakeEngine(t), 160, 48)
	press(t, m, "2", "pgdown")
	mustNotContain(t, screen(m), "more above", "more below", "page down")
}

// TestWhatIfHeadlineWrapsBetweenWords: a headline wider than the screen
// goes on under its label rather than being cut inside a word.
func TestWhatIfHeadlineWrapsBetweenWords(t *testing.T) {
	f := newFakeEngine(t)
	f.snap.Pool.Policy = "noop"
	m := newTestModel(t, f, 80, 24)
	lines := strings.Split(ansi.Strip(strings.Join(m.pc.whatIfLines(80, whatIfChartRows), "\n")), "\n")
	text := strings.Join(lines, "\n")
	mustContain(t, text, "What-if   2× pool: hit ratio", "          with LRU eviction; this pool's policy is noop)", "       measured on those samples over the same window: 42 %")
	for _, l := range lines {
		if w := ansi.StringWidth(l); w > 80 {
			t.Errorf("line of %d columns: %q", w, l)
		}
		if strings.HasSuffix(l, "~") {
			t.Errorf("line cut: %q", l)
		}
	}
}

// TestPlainFilterMatchesEveryColumn: plain text matches every column shown
// as text (mode, state, layout, model), digits the id only; while the
// filter is typed its syntax is on screen.
func TestPlainFilterMatchesEveryColumn(t *testing.T) {
	for filter, rows := range map[string]string{"pickle": "9001", "idle": "9001", "SHM": "4242,4243", "4": "4242,4243", "x512": "9001"} {
		m := newTestModel(t, newFakeEngine(t), 80, 24)
		press(t, m, "/")
		typeText(t, m, filter)
		press(t, m, "enter")
		if got := strings.Join(rowOrder(screen(m)), ","); got != rows {
			t.Errorf("filter %q: rows %q, want %q", filter, got, rows)
		}
	}
	for _, size := range [][2]int{{80, 24}, {160, 48}} {
		m := newTestModel(t, newFakeEngine(t), size[0], size[1])
		press(t, m, "/")
		typeText(t, m, "pick")
		mustContain(t, screen(m), "text matches every column", "col:value one column (mode:pickle")
		golden(t, fmt.Sprintf("filter_typing_%dx%d", size[0], size[1]), goldenView(m))
		press(t, m, "enter")
		mustNotContain(t, screen(m), "text matches every column")
	}
}

// TestHTTPPortDialogSaysOnlyTheAPIRestarts: applying http.port restarts
// the HTTP API alone (the engine leaves http.* to its face), and the
// question says so.
func TestHTTPPortDialogSaysOnlyTheAPIRestarts(t *testing.T) {
	m := newTestModel(t, newFakeEngine(t), 160, 48)
	press(t, m, "5")
	retype(t, m, "http.port", "8181")
	press(t, m, "enter", "a")
	s := screen(m)
	mustContain(t, s, "the HTTP API restarts on its new address; the wire server, the cache and the contexts are untouched")
	mustNotContain(t, s, "the wire server restarts")
}

// TestEmptyTableAfterWorkersLeft: once workers were registered, an empty
// table says they left, not that none has registered yet.
func TestEmptyTableAfterWorkersLeft(t *testing.T) {
	f := newFakeEngine(t)
	m := newTestModel(t, f, 80, 24)
	next := f.Snapshot()
	next.Contexts = nil
	m.Update(snapMsg(next))
	s := screen(m)
	mustContain(t, s, "no worker is registered now: the workers left")
	mustNotContain(t, s, "no worker has registered yet")
}
