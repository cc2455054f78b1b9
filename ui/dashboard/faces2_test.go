package dashboard

import (
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"kvdock/core/engine"
)

// tableRow is a row of the settings table: selection, edit mark, key.
var tableRow = regexp.MustCompile(`^[> ] [ *] \S`)

// TestStatusHasItsOwnLine: an apply's result shows under the rates line;
// the pool line and the rates stay, at both sizes.
func TestStatusHasItsOwnLine(t *testing.T) {
	for _, size := range [][2]int{{80, 24}, {160, 48}} {
		w, h := size[0], size[1]
		m := newTestModel(t, newFakeEngine(t), w, h)
		press(t, m, "5")
		retype(t, m, "eviction.ratio", "0.3")
		press(t, m, "enter", "a", "y")
		lines := strings.Split(screen(m), "\n")
		mustContain(t, lines[1], "pool SHM lmcache_l1_pool_demo 50% used")
		mustContain(t, lines[2], "hit 62%")
		mustContain(t, lines[3], "OK applied (live): eviction.ratio")
		if len(lines) != h {
			t.Fatalf("%d lines on a screen %d high", len(lines), h)
		}
		golden(t, fmt.Sprintf("status_%dx%d", w, h), goldenView(m))
	}
}

// TestSettingsTableColumns: long keys lose their middle inside KEY (the
// footer and the editor show them whole), every row keeps its columns,
// CLASS shows "next-start" whole, byte values read in binary units while
// the editor takes the number of bytes; at 80 and 160 columns.
func TestSettingsTableColumns(t *testing.T) {
	for _, size := range [][2]int{{80, 24}, {160, 48}} {
		w, h := size[0], size[1]
		m := newTestModel(t, newFakeEngine(t), w, h)
		press(t, m, "5")
		selectKey(t, m, "server.go_memory_limit_mb")
		s := screen(m)
		golden(t, fmt.Sprintf("settings_long_keys_%dx%d", w, h), goldenView(m))
		mustContain(t, s, "256 MiB", "128 MiB", "1.0 GiB", "next-start", "server.go_memory_limit_mb: ")
		mustNotContain(t, s, "268435456", "next-~", "resta~")
		if w == 80 {
			mustContain(t, s, "more above", "server.worker_…grace_seconds")
		} else {
			mustContain(t, s, "server.worker_registration_grace_seconds 3600")
		}
		// Every row's columns line up with the header's.
		lines := strings.Split(s, "\n")
		var head string
		for _, l := range lines {
			if strings.HasPrefix(l, "    KEY ") {
				head = l
			}
		}
		col := func(l, title string) int { return strings.Index(l, title) }
		for _, l := range lines {
			if !tableRow.MatchString(l) {
				continue
			}
			for _, title := range []string{"SOURCE", "CLASS"} {
				at := col(head, title)
				if got := []rune(l); len(got) <= at || got[at-1] != ' ' || got[at] == ' ' {
					t.Errorf("%d cols: %s column out of line in %q", w, title, l)
				}
			}
		}
		selectKey(t, m, "server.queued_request_bytes")
		press(t, m, "enter")
		s = screen(m)
		mustContain(t, s, "server.queued_request_bytes: ", "default 256 MiB", "new value: 268435456", "a whole number of bytes · 268435456 = 256 MiB")
		golden(t, fmt.Sprintf("edit_bytes_%dx%d", w, h), goldenView(m))
		press(t, m, "esc")

		// An enumerated key's editor lists its choices, not the empty string.
		selectKey(t, m, "eviction.policy")
		press(t, m, "enter")
		s = screen(m)
		mustContain(t, s, "one of LRU, prefix, noop (any case)")
		mustNotContain(t, s, `"" = empty string`, "clear (empty)")
		golden(t, fmt.Sprintf("edit_enum_%dx%d", w, h), goldenView(m))
	}
}

// TestDetailsHeadlineNumbersFirst: the details always show the last
// minute's figures and the tokens saved; the charts take the room left,
// one row each on a short screen (titles only, the figures are above),
// none when even that does not fit; nothing is cut.
func TestDetailsHeadlineNumbersFirst(t *testing.T) {
	one := func() *fakeEngine {
		f := newFakeEngine(t)
		f.snap.Contexts = f.snap.Contexts[1:2] // 4243: no extra KV group
		return f
	}
	figures := "this instance: store 191 MiB/s · retrieve 143 MiB/s"
	for _, size := range [][2]int{{80, 24}, {160, 48}} {
		w, h := size[0], size[1]
		m := newTestModel(t, one(), w, h)
		press(t, m, "enter")
		golden(t, fmt.Sprintf("details_one_%dx%d", w, h), goldenView(m))
		s := screen(m)
		mustContain(t, s, "last minute, model: hit 59% · lookups 1.9/s", figures, "tokens saved 4.9 M")
		mustNotContain(t, s, "~", "more below")
		if w == 80 {
			mustNotContain(t, s, "one column a second")
		} else {
			mustContain(t, s, "one column a second", "top 100%")
		}
	}
	// A few rows more: one row a chart, titled, under the figures.
	m := newTestModel(t, one(), 80, 30)
	press(t, m, "enter")
	s := screen(m)
	mustContain(t, s, figures, "one column a second")
	mustNotContain(t, s, "~")
	if strings.Index(s, figures) > strings.Index(s, "one column a second") {
		t.Fatalf("the charts come before the figures:\n%s", s)
	}
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "  hit ratio (model)") && strings.Contains(l, "%") {
			t.Fatalf("a one-row chart repeats its figure: %q", l)
		}
	}
}

// TestDetailsScroll: details longer than their room scroll with pgdn/pgup
// and G/g, saying what is above and below, while ↑↓ still move the
// selection (whose details start at the top).
func TestDetailsScroll(t *testing.T) {
	f := newFakeEngine(t)
	c := &f.snap.Contexts[0]
	for range 4 {
		c.Groups = append(c.Groups, mustLayout(t, 8, 256, 256, "float32"))
	}
	m := newTestModel(t, f, 80, 24)
	press(t, m, "enter")
	top := screen(m)
	mustContain(t, top, "Instance 4242", "more below (pgdn, G bottom)", "pgdn/ctrl+d page down")
	press(t, m, "pgdown")
	golden(t, "details_scrolled_80x24", goldenView(m))
	mustContain(t, screen(m), "more above (pgup, g top)")
	press(t, m, "G")
	end := screen(m)
	mustContain(t, end, "tokens saved 9.9 M", "last minute, model: hit 56%")
	mustNotContain(t, end, "more below (pgdn")
	press(t, m, "g")
	if screen(m) != top {
		t.Fatalf("g did not go back to the top:\n%s", screen(m))
	}
	// ↓ moves the selection; the next context's details start at the top.
	press(t, m, "pgdown", "down")
	if id := selectedID(t, m); id != "4243" {
		t.Fatalf("selected %s after ↓", id)
	}
	mustContain(t, screen(m), "Instance 4243")
	mustNotContain(t, screen(m), "more above (pgup")
}

// manyEvents is the fixture with n more register events, a minute apart.
func manyEvents(t *testing.T, n int) *fakeEngine {
	f := newFakeEngine(t)
	for i := range n {
		f.snap.Events = append(f.snap.Events, engine.Event{Seq: uint64(10 + i), Time: t0.Add(time.Duration(i-n) * time.Minute),
			Kind: "register", Level: slog.LevelInfo, Message: fmt.Sprintf("instance %d registered: SHM", 5000+i)})
	}
	return f
}

// TestEventsScroll: the Events pane opens on the newest events, says how
// many lines are above, and pages back with pgup, g and G the way the
// other panes do; scrolled back, a new event does not move the view, and
// at the newest again new events come into view.
func TestEventsScroll(t *testing.T) {
	for _, size := range [][2]int{{80, 24}, {160, 48}} {
		w, h := size[0], size[1]
		f := manyEvents(t, 100)
		m := newTestModel(t, f, w, h)
		press(t, m, "4")
		newest := screen(m)
		mustContain(t, newest, "instance 5099 registered", "more above (pgup, g top)", "pgup/ctrl+u page up")
		mustNotContain(t, newest, "more below")
		press(t, m, "pgup")
		golden(t, fmt.Sprintf("events_scrolled_%dx%d", w, h), goldenView(m))
		scrolled := screen(m)
		mustContain(t, scrolled, "more above (pgup, g top)", "more below (pgdn, G bottom)")
		mustNotContain(t, scrolled, "instance 5099 registered")

		// A new event while scrolled back: the view stays.
		f.snap.Events = append(f.snap.Events, engine.Event{Seq: 500, Time: t0, Kind: "register", Level: slog.LevelInfo, Message: "instance 7777 registered: SHM"})
		m.Update(snapMsg(f.Snapshot()))
		if got := screen(m); strings.Split(got, "[4 Events]")[1] != strings.Split(scrolled, "[4 Events]")[1] {
			// Only the "more below" count may change.
			mustContain(t, got, "more below")
		}
		mustNotContain(t, screen(m), "instance 7777")

		press(t, m, "g")
		mustContain(t, screen(m), "serving on tcp://localhost:5555", "more below")
		mustNotContain(t, screen(m), "more above")
		press(t, m, "G")
		mustContain(t, screen(m), "instance 7777 registered")
		// Following the newest again.
		f.snap.Events = append(f.snap.Events, engine.Event{Seq: 501, Time: t0, Kind: "register", Level: slog.LevelInfo, Message: "instance 8888 registered: SHM"})
		m.Update(snapMsg(f.Snapshot()))
		mustContain(t, screen(m), "instance 8888 registered")
	}
}

// TestTiersScrolledGolden: the Tiers pane pages like the Pool pane.
func TestTiersScrolledGolden(t *testing.T) {
	f := newFakeEngine(t)
	withTiers(t, f, fakeTiers())
	m := newTestModel(t, f, 80, 24)
	press(t, m, "6", "pgdown")
	golden(t, "tiers_scrolled_80x24", goldenView(m))
	mustContain(t, screen(m), "more above (pgup, g top)")
}
