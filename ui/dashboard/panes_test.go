package dashboard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"kvdock/core/engine"
	"kvdock/core/l1"
	"kvdock/core/series"
	"kvdock/core/workers"
)

// clockModel is a test model whose clock the test moves.
func clockModel(t *testing.T, f *fakeEngine, w, h int) (*Model, *time.Time) {
	t.Helper()
	now := t0
	opts := testOptions()
	opts.Now = func() time.Time { return now }
	opts = opts.withDefaults(f)
	m := newModel(context.Background(), f, opts, opts.Profile)
	m.Update(tea.WindowSizeMsg{Width: w, Height: h})
	return m, &now
}

// tickAfter moves the model's clock d on and delivers the tick.
func tickAfter(m *Model, now *time.Time, d time.Duration) {
	*now = now.Add(d)
	m.Update(tickMsg(*now))
}

// statusGone fails t while the header still shows an apply status.
func statusGone(t *testing.T, m *Model) {
	t.Helper()
	if st := headerStatus(m); st != "" {
		t.Fatalf("status still shown: %q", st)
	}
}

// headerLine2 is the line under the title.
func headerLine2(m *Model) string {
	return strings.Split(screen(m), "\n")[1]
}

// headerStatus is the header's message line, under the rates line: the
// fourth line of the screen ("" when the tabs are there instead).
func headerStatus(m *Model) string {
	l := strings.Split(screen(m), "\n")[3]
	if strings.Contains(l, "1 Contexts") {
		return ""
	}
	return l
}

// The apply result gives way after a while; the pool line stays all along.
func TestStatusExpires(t *testing.T) {
	f := newFakeEngine(t)
	m, now := clockModel(t, f, 80, 24)
	pool := "pool SHM lmcache_l1_pool_demo 50% used"
	press(t, m, "5")
	retype(t, m, "eviction.ratio", "0.3")
	press(t, m, "enter", "a", "y")
	mustContain(t, headerStatus(m), "OK applied (live): eviction.ratio")
	mustContain(t, headerLine2(m), pool)

	tickAfter(m, now, 2*time.Second)
	mustContain(t, headerStatus(m), "OK applied")

	tickAfter(m, now, statusTTL)
	statusGone(t, m)
	mustContain(t, headerLine2(m), pool, "3 worker context(s)")

	// A failure stays longer, then goes too.
	f.applyErr, f.rollback = errPortTaken, true
	press(t, m, "r", "a", "y")
	mustContain(t, headerStatus(m), "APPLY FAILED")
	mustContain(t, headerLine2(m), pool)
	tickAfter(m, now, statusTTL+time.Second)
	mustContain(t, headerStatus(m), "APPLY FAILED")
	tickAfter(m, now, badTTL)
	statusGone(t, m)
}

// An empty table after a rebuild says why.
func TestContextsAfterRebuild(t *testing.T) {
	f := newFakeEngine(t)
	f.snap.Contexts = nil
	f.snap.Rebuilt = engine.Rebuilt{At: t0.Add(-time.Minute), DroppedContexts: 30}
	m := newTestModel(t, f, 80, 24)
	s := screen(m)
	mustContain(t, s, "a pool rebuild 1m00s ago dropped 30 worker context(s); workers must", "re-register")
	mustNotContain(t, s, "no worker has registered yet")

	// Without a rebuild (or one that dropped nothing) it is the first start.
	f.snap.Rebuilt = engine.Rebuilt{At: t0, DroppedContexts: 0}
	m = newTestModel(t, f, 80, 24)
	mustContain(t, screen(m), "no worker has registered yet")
}

// manyContexts is the fixture with n registered contexts.
func manyContexts(t *testing.T, n int) *fakeEngine {
	f := newFakeEngine(t)
	base := f.snap.Contexts[0]
	f.snap.Contexts = nil
	for i := range n {
		c := base
		c.InstanceID = int64(1000 + i)
		c.Stores = int64(n - i)
		f.snap.Contexts = append(f.snap.Contexts, c)
	}
	return f
}

func selectedID(t *testing.T, m *Model) string {
	t.Helper()
	for _, l := range strings.Split(screen(m), "\n") {
		if mm := regexp.MustCompile(`^> +(\d+)\s`).FindStringSubmatch(l); mm != nil {
			return mm[1]
		}
	}
	t.Fatalf("no selected row:\n%s", screen(m))
	return ""
}

// Paging and "n more below".
func TestPagingAndMoreBelow(t *testing.T) {
	m := newTestModel(t, manyContexts(t, 60), 80, 24)
	page := m.pc.pageSize()
	mustContain(t, screen(m), fmt.Sprintf("… %d more below", 60-16))
	press(t, m, "pgdown")
	if got, want := selectedID(t, m), fmt.Sprint(1000+page); got != want {
		t.Fatalf("pgdown selected %s, want %s", got, want)
	}
	press(t, m, "ctrl+d")
	if got, want := selectedID(t, m), fmt.Sprint(1000+2*page); got != want {
		t.Fatalf("ctrl+d selected %s, want %s", got, want)
	}
	press(t, m, "ctrl+u")
	if got, want := selectedID(t, m), fmt.Sprint(1000+page); got != want {
		t.Fatalf("ctrl+u selected %s, want %s", got, want)
	}
	press(t, m, "pgup", "pgup")
	if got := selectedID(t, m); got != "1000" {
		t.Fatalf("pgup past the top selected %s", got)
	}
	press(t, m, "G")
	mustNotContain(t, screen(m), "more below")
	if got := selectedID(t, m); got != "1059" {
		t.Fatalf("G selected %s", got)
	}

	// Settings: more keys than rows, and paging there too.
	press(t, m, "5")
	mustContain(t, screen(m), "more below")
	press(t, m, "pgdown")
	if m.settings.cur.sel != page {
		t.Fatalf("settings pgdown: selection %d, want %d", m.settings.cur.sel, page)
	}
}

// headerRow is the table's column titles.
func headerRow(t *testing.T, m *Model) string {
	t.Helper()
	for _, l := range strings.Split(screen(m), "\n") {
		if strings.HasPrefix(l, "  ID") || strings.Contains(l, " ID") && strings.Contains(l, "MODE") {
			return l
		}
	}
	t.Fatalf("no table header:\n%s", screen(m))
	return ""
}

// Shift+letter sorts by that column; the sort column
// and its arrow are always on screen.
func TestSortPicksColumn(t *testing.T) {
	m := newTestModel(t, newFakeEngine(t), 80, 24)
	mustNotContain(t, headerRow(t, m), "LAYOUT", "OUT") // hidden at 80 columns
	press(t, m, "O")                                    // bytes out, largest first
	mustContain(t, screen(m), "sort: bytes out (descending)")
	mustContain(t, headerRow(t, m), "OUTv")
	if got := rowOrder(screen(m)); strings.Join(got, ",") != "4243,4242,9001" {
		t.Fatalf("order by bytes out: %v", got)
	}
	press(t, m, "O")
	mustContain(t, headerRow(t, m), "OUT^")
	press(t, m, "L")
	mustContain(t, headerRow(t, m), "LAYOUT^")

	// s walks only the columns on screen, and the arrow never leaves it.
	for _, w := range []int{50, 80, 120} {
		m := newTestModel(t, newFakeEngine(t), w, 24)
		shown := len(tableColumns(w, 0))
		for i := range shown + 1 {
			press(t, m, "s")
			if h := headerRow(t, m); !strings.Contains(h, "^") && !strings.Contains(h, "v ") {
				t.Fatalf("%d columns, after %d× s: no sort arrow in %q", w, i+1, h)
			}
		}
		if m.contexts.sortCol != 1 { // back to MODEL after a full round
			t.Fatalf("%d columns: s went through hidden columns (sort column %d)", w, m.contexts.sortCol)
		}
	}
}

// The filter matches id and model, or one named column.
func TestFilterByColumn(t *testing.T) {
	cases := []struct {
		filter, rows, info string
	}{
		{"4", "4242,4243", ""}, // not 9001 through its layout 2x24x…
		{"qwen", "9001", ""},
		{"model:llama", "4242,4243", ""},
		{"MODE:pickle", "9001", ""},
		{"layout:x512", "9001", ""},
		{"ws:2", "4243", ""},
		{"nosuch:x", "", "no such column (nosuch)"},
		{":4", "4242,4243", ""}, // no column named: plain text
		{"id:", "4242,4243,9001", ""},
		{"la:x512", "9001", ""}, // a prefix of LAYOUT and LAST: the first in table order wins

	}
	for _, c := range cases {
		m := newTestModel(t, newFakeEngine(t), 80, 24)
		press(t, m, "/")
		typeText(t, m, c.filter)
		press(t, m, "enter")
		s := screen(m)
		if got := strings.Join(rowOrder(s), ","); got != c.rows {
			t.Fatalf("filter %q: rows %q, want %q\n%s", c.filter, got, c.rows, s)
		}
		mustContain(t, s, c.info)
	}
}

// The Events pane filters by level and text.
func TestEventsFilter(t *testing.T) {
	m := newTestModel(t, newFakeEngine(t), 80, 24)
	press(t, m, "4", "l")
	s := screen(m)
	mustContain(t, s, "level: INFO and up", "serving on", "uses PICKLE")
	press(t, m, "l")
	s = screen(m)
	mustContain(t, s, "1 of 3 event(s) · level: WARN and up", "uses PICKLE")
	mustNotContain(t, s, "serving on", "registered: SHM")
	press(t, m, "l")
	mustContain(t, screen(m), "no event matches the filter")
	press(t, m, "l") // back to all
	press(t, m, "/")
	typeText(t, m, "REGISTER")
	press(t, m, "enter")
	s = screen(m)
	mustContain(t, s, `1 of 3 event(s) · level: all · filter: "REGISTER"`, "instance 4242 registered")
	mustNotContain(t, s, "serving on", "uses PICKLE")
	press(t, m, "esc")
	mustContain(t, screen(m), "serving on", "uses PICKLE")
}

// footer is the screen's last line.
func footer(m *Model) string {
	lines := strings.Split(strings.TrimRight(trimRight(screen(m)), "\n"), "\n")
	return lines[len(lines)-1]
}

// The footer is never cut off.
func TestFooterNotCut(t *testing.T) {
	for _, w := range []int{80, 120} {
		m := newTestModel(t, newFakeEngine(t), w, 24)
		for p := range paneCount {
			m.goPane(p)
			if f := footer(m); strings.HasSuffix(f, "…") || strings.HasSuffix(f, "~") {
				t.Fatalf("%s at %d columns: footer cut: %q", paneNames[p], w, f)
			}
			mustContain(t, footer(m), "? help")
		}
	}
}

// A long model name gets a bounded column, cut in the
// middle; the state word survives 50x12.
func TestLayoutWideAndNarrow(t *testing.T) {
	f := newFakeEngine(t)
	long := "organisation-with-a-long-name/Model-Family-Variant-405B-Instruct-FP8-dynamic-final"
	f.snap.Contexts[0].Model = long
	m := newTestModel(t, f, 200, 30)
	var row string
	for _, l := range strings.Split(screen(m), "\n") {
		if strings.Contains(l, "4242") && strings.Contains(l, "organisation") {
			row = l
		}
	}
	if row == "" {
		t.Fatalf("no row for 4242:\n%s", screen(m))
	}
	if !strings.Contains(row, "organisation-with-a-long-name/…") && !strings.Contains(row, "…") {
		t.Fatalf("long model not cut in the middle: %q", row)
	}
	mustContain(t, row, "final") // the end of the name survives
	mustNotContain(t, row, long)
	for _, c := range tableColumns(200, 0) {
		if c.title == "MODEL" && c.width > maxModelWidth {
			t.Fatalf("MODEL column %d wide", c.width)
		}
	}

	m = newTestModel(t, newFakeEngine(t), 50, 12)
	mustContain(t, strings.Split(screen(m), "\n")[0], "SERVING")
}

// Event text wraps between words, never inside one.
func TestEventsWrapAtWords(t *testing.T) {
	f := newFakeEngine(t)
	msg := "pool rebuilt: cache cleared, 30 worker contexts dropped (workers must re-register) after l1.size_gb changed; meta-llama/Llama-3.1-70B-Instruct and Qwen/Qwen2-0.5B-Instruct lost their segment lmcache_l1_pool_demo-rebuilt"
	f.snap.Events = []engine.Event{{Seq: 1, Time: t0, Kind: engine.EventRestart, Level: slog.LevelWarn, Message: msg}}
	for _, w := range []int{60, 80, 97, 120} {
		m := newTestModel(t, f, w, 30)
		press(t, m, "4")
		var parts []string
		started := false // the latency block comes first
		for _, l := range strings.Split(trimRight(screen(m)), "\n")[4:] {
			if strings.HasPrefix(l, "? help") {
				break
			}
			started = started || strings.Contains(l, "restart")
			if l == "" || !started {
				continue
			}
			l = strings.TrimSpace(l)
			if i := strings.Index(l, "restart"); i >= 0 && len(parts) == 0 {
				l = strings.TrimSpace(l[i+len("restart"):])
			}
			parts = append(parts, l)
		}
		if got := strings.Join(parts, " "); got != msg {
			t.Fatalf("%d columns: wrapped inside a word:\n%s", w, strings.Join(parts, "\n"))
		}
	}
	if got := wrapWords("abcdefghij xy", 4); got != "abcd\nefgh\nij\nxy" {
		t.Fatalf("a word longer than the line: %q", got)
	}
}

// Q with unapplied edits asks, and says so.
func TestQuitMentionsPendingEdits(t *testing.T) {
	f := newFakeEngine(t)
	f.snap.Contexts = nil
	m := newTestModel(t, f, 80, 24)
	press(t, m, "5")
	retype(t, m, "eviction.ratio", "0.3")
	press(t, m, "enter")
	if cmd := press(t, m, "q"); isQuit(cmd) {
		t.Fatal("q quit with an unapplied edit")
	}
	s := screen(m)
	mustContain(t, s, "QUIT?", "1 setting edit(s) are not applied")
	mustNotContain(t, s, "worker context(s) are registered")
	press(t, m, "n", "u")
	if cmd := press(t, m, "q"); !isQuit(cmd) {
		t.Fatal("q without edits or workers did not quit")
	}
}

// The log file is named in the Settings pane and help.
func TestLogFileShown(t *testing.T) {
	m := newTestModel(t, newFakeEngine(t), 80, 24)
	press(t, m, "5")
	mustContain(t, screen(m), "Log file  /var/log/kvdock/kvdock.log")
	press(t, m, "?")
	mustContain(t, screen(m), "Log file  /var/log/kvdock/kvdock.log")
	// Also on the longest help screen at the smallest size.
	m = newTestModel(t, newFakeEngine(t), minWidth+10, minHeight+2)
	press(t, m, "?")
	mustContain(t, screen(m), "Keys — Contexts", "Log file  /var/log/kvdock/kvd")
	m.pc.opts.LogFile = ""
	press(t, m, "x", "?")
	mustContain(t, screen(m), "Log file  none (logs go to stderr)")
}

// fixedMemory is a settings.MemoryProbe with a set answer.
type fixedMemory struct {
	avail int64
	err   error
}

func (f fixedMemory) MemAvailable() (int64, error) { return f.avail, f.err }

// The editor refuses a pool larger than the host.
func TestEditorRefusesPoolLargerThanMemory(t *testing.T) {
	f := newFakeEngine(t)
	opts := testOptions()
	opts.Memory = fixedMemory{avail: 3 << 30}
	opts = opts.withDefaults(f)
	m := newModel(context.Background(), f, opts, opts.Profile)
	m.Update(tea.WindowSizeMsg{Width: 160, Height: 48})
	press(t, m, "5")
	retype(t, m, "l1.size_gb", "40")
	s := screen(m)
	// 3 GiB free plus the running pool's 768 MiB resident.
	mustContain(t, s, "INVALID: l1.size_gb = 40", "the pool needs 40.0 GiB", "3.8 GiB", "--l1-allow-overcommit")
	press(t, m, "enter") // refused
	if m.settings.mode != setEdit {
		t.Fatal("an oversized pool was accepted")
	}
	press(t, m, "ctrl+u")
	typeText(t, m, "3.5")
	press(t, m, "enter")
	if m.settings.mode != setList {
		t.Fatalf("a pool that fits was refused:\n%s", screen(m))
	}

	// With overcommit allowed, 40 GiB passes the editor and the apply.
	retype(t, m, "l1.allow_overcommit", "true")
	press(t, m, "enter")
	retype(t, m, "l1.size_gb", "40")
	press(t, m, "enter")
	if m.settings.mode != setList {
		t.Fatalf("overcommit allowed but refused:\n%s", screen(m))
	}
	// Taking overcommit back makes the apply refuse it.
	selectKey(t, m, "l1.allow_overcommit")
	press(t, m, "r", "a")
	mustContain(t, screen(m), "INVALID: 1 problem(s)")
	if len(f.applyCalls()) != 0 {
		t.Fatal("an oversized pool reached Apply")
	}

	// An unreadable probe checks nothing.
	m.pc.opts.Memory = fixedMemory{err: errors.New("no /proc")}
	press(t, m, "a")
	if m.pc.asking == nil {
		t.Fatalf("an unreadable probe blocked the apply:\n%s", screen(m))
	}
}

// SHM off shows host memory, and prefault progress shows.
func TestPoolPaneHostMemoryAndPrefault(t *testing.T) {
	f := newFakeEngine(t)
	m := newTestModel(t, f, 80, 24)
	press(t, m, "2")
	mustContain(t, screen(m), "/dev/shm  30.0 GiB free", "Prefault  [", "768 MiB / 1.0 GiB (75.0%) in progress")

	f.snap.Pool.Decision = l1.Decision{Size: 1 << 30, Reason: "--shm-name \"\" turns SHM off"}
	f.snap.Shm = workers.Info{Reason: "SHM off"}
	f.snap.Pool.Prefaulted = f.snap.Pool.Size
	m = newTestModel(t, f, 120, 24)
	press(t, m, "2")
	s := screen(m)
	mustContain(t, s, "Host mem  20.0 GiB available", "Prefault  done, 1.0 GiB resident")
	mustNotContain(t, s, "/dev/shm")
}

// Hostile shapes: thousands of contexts with wide and huge names, filters
// made of separators, every size down to the minimum. Nothing panics and
// no line is wider than the screen.
func TestHostileListsStayInBounds(t *testing.T) {
	f := manyContexts(t, 2000)
	for i := range f.snap.Contexts {
		f.snap.Contexts[i].Model = strings.Repeat("模型-", i%300) + "x"
	}
	for i := range 500 {
		f.snap.Events = append(f.snap.Events, engine.Event{Seq: uint64(10 + i), Time: t0, Kind: "register", Level: slog.Level(i%3*4 - 4),
			Message: strings.Repeat("很长的消息 ", i%50) + strings.Repeat("y", i)})
	}
	// Request kinds by the hundred, with wide names and absurd figures.
	f.snap.Rates.Latency = map[string]engine.LatencyRates{}
	for i := range 200 {
		v := float64(i) * 1e6
		f.snap.Rates.Latency[strings.Repeat("請求", i%40)+fmt.Sprint(i)] = engine.LatencyRates{
			Rate: series.Window{Fine: []float64{v, v}}, P50: series.Window{Fine: []float64{v, 1e-9}},
			P99: series.Window{Fine: []float64{math.Inf(1), math.NaN()}}}
	}
	for _, sz := range [][2]int{{minWidth, minHeight}, {50, 12}, {80, 24}, {233, 61}} {
		m := newTestModel(t, f, sz[0], sz[1])
		check := func(what string) {
			t.Helper()
			for _, l := range strings.Split(screen(m), "\n") {
				if w := ansi.StringWidth(l); w > sz[0] {
					t.Fatalf("%dx%d %s: line %d wide: %q", sz[0], sz[1], what, w, l)
				}
			}
		}
		for _, k := range []string{"pgdown", "G", "pgup", "ctrl+d", "T", "T", "N", "L", "s", "s", "s"} {
			press(t, m, k)
			check("contexts " + k)
		}
		for _, filter := range []string{":", "::", "model::", "模型", "id:-1", strings.Repeat(":", 300)} {
			press(t, m, "/")
			typeText(t, m, filter)
			check("filter " + filter)
			press(t, m, "esc")
		}
		press(t, m, "4", "G", "pgup", "l", "ctrl+u", "l", "/")
		typeText(t, m, "y")
		press(t, m, "enter")
		check("events")
		press(t, m, "5", "G", "pgup")
		check("settings")
	}
}
