package dashboard

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"kvdock/core/engine"
	"kvdock/core/workers"
)

// longValues makes the fake engine's figures as long as a server that ran
// for days shows them: an 11-day uptime behind a long profile name, a
// restart with its adoption, four-digit counts, an idle context and tiers.
func longValues(t *testing.T, f *fakeEngine) {
	t.Helper()
	withTiers(t, f, fakeTiers())
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &f.snap
	s.Endpoint = "tcp://127.0.0.1:35655"
	s.Protocol = "engine-driven-v2-early"
	s.Uptime = 11*24*time.Hour + 4*time.Hour + 7*time.Minute
	s.Restart = engine.Restart{Adopted: true, Objects: 12345, Bytes: 3 << 30, Contexts: 3, Gap: 1234 * time.Millisecond, StatsCarried: true}
	s.Misses.TierMissed = 1233
	s.Transfer = workers.Stats{PendingWrites: 1024, PendingReads: 2048, NoSpace: 4096, Rejected: 1234, Fallbacks: 10}
	c := s.Contexts[2]
	c.State, c.LastRequest = workers.StateIdle, t0.Add(-5*time.Minute-3*time.Second)
	s.Contexts[2] = c
}

// TestGolden80x24LongValues: every pane at 80x24 with the long figures
// above; no line ends cut inside a number or a word (papercut: "up 11~",
// "restarte~", "(1233 m~", "10 fallbac~", "idle 5m~").
func TestGolden80x24LongValues(t *testing.T) {
	f := newFakeEngine(t)
	longValues(t, f)
	m := newTestModel(t, f, 80, 24)
	for p := range paneCount {
		m.goPane(p)
		view := goldenView(m)
		for i, line := range strings.Split(view, "\n") {
			if cut := cutInsideWord(line); cut != "" {
				t.Errorf("%s line %d cut inside a word (%q): %q", paneNames[p], i, cut, line)
			}
		}
		if !t.Failed() {
			golden(t, "long_"+strings.ToLower(paneNames[p])+"_80x24", view)
		}
	}
	m.goPane(paneContexts)
	press(t, m, "enter")
	view := goldenView(m)
	golden(t, "long_details_80x24", view)
	for i, line := range strings.Split(view, "\n") {
		if cut := cutInsideWord(line); cut != "" {
			t.Errorf("details line %d cut inside a word (%q): %q", i, cut, line)
		}
	}
	for _, want := range []string{"up 11d04h", " · restarted", "10 fallbacks", "idle 5m ", "(1233 missed L2"} {
		if !strings.Contains(strings.Join(allViews(t, m), "\n"), want) {
			t.Errorf("no pane shows %q whole", want)
		}
	}
}

// allViews is every pane's view at the model's size.
func allViews(t *testing.T, m *Model) []string {
	t.Helper()
	var out []string
	for p := range paneCount {
		m.goPane(p)
		out = append(out, goldenView(m))
	}
	return out
}

// cutInsideWord is the word a line's cut mark "~" ends inside ("" when the
// line has no cut or the cut follows a space): what a reader cannot read.
func cutInsideWord(line string) string {
	if !strings.HasSuffix(line, "~") {
		return ""
	}
	body := strings.TrimSuffix(line, "~")
	if body == "" || strings.HasSuffix(body, " ") {
		return ""
	}
	fields := strings.Fields(body)
	return fmt.Sprint(fields[len(fields)-1])
}
