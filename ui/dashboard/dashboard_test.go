package dashboard

import (
	"context"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"

	"kvdock/core/engine"
	"kvdock/core/workers"
	"kvdock/settings"
)

func mustContain(t *testing.T, s string, subs ...string) {
	t.Helper()
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			t.Fatalf("screen lacks %q:\n%s", sub, s)
		}
	}
}

func mustNotContain(t *testing.T, s string, subs ...string) {
	t.Helper()
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			t.Fatalf("screen should not show %q:\n%s", sub, s)
		}
	}
}

// rowOrder returns the instance ids of the contexts table, top to bottom.
func rowOrder(s string) []string {
	var ids []string
	re := regexp.MustCompile(`^[> ] +(\d{3,})\s`)
	for _, l := range strings.Split(s, "\n") {
		if mm := re.FindStringSubmatch(l); mm != nil {
			ids = append(ids, mm[1])
		}
	}
	return ids
}

func TestNavigation(t *testing.T) {
	m := newTestModel(t, newFakeEngine(t), 80, 24)
	s := screen(m)
	mustContain(t, s, "[1 Contexts]", "4242", "SHM", "PICKLE", "state: SERVING", "tcp://localhost:5555", "nongpu-v1", "up 2h03m")

	press(t, m, "tab")
	mustContain(t, screen(m), "[2 Pool]", "lmcache_l1_pool_demo", "512 MiB / 1.0 GiB (50.0%)", "Objects   321", "Evictions 17", "Alloc failures 2", "30.0 GiB free")
	press(t, m, "tab")
	s = screen(m)
	mustContain(t, s, "[3 GPU]", "GPU 0 NVIDIA H200", "40.0 GiB / 141 GiB", "util 35%", "util n/a", "worker (registered instance)")
	// pid 777 is not a worker: its line has no mark.
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, " 777 ") && strings.Contains(l, "worker") {
			t.Fatalf("pid 777 marked as a worker: %q", l)
		}
	}
	press(t, m, "tab")
	mustContain(t, screen(m), "[4 Events]", "instance 9001 uses PICKLE", "WARN")
	press(t, m, "tab")
	mustContain(t, screen(m), "[5 Settings]", "server.shm_name", "demo", "flag", "rebuild")
	press(t, m, "tab")
	mustContain(t, screen(m), "[6 Tiers]", "no L2 tier configured", "--l2-adapter")
	press(t, m, "tab")
	mustContain(t, screen(m), "[1 Contexts]")
	press(t, m, "shift+tab")
	mustContain(t, screen(m), "[6 Tiers]")
	press(t, m, "3")
	mustContain(t, screen(m), "[3 GPU]")
	press(t, m, "?")
	mustContain(t, screen(m), "Keys — GPU", "next pane", "quit")
	press(t, m, "x")
	mustContain(t, screen(m), "[3 GPU]", "GPU 0")
}

func TestGPUUnavailable(t *testing.T) {
	f := newFakeEngine(t)
	f.snap.GPU.Available = false
	f.snap.GPU.Reason = "libnvidia-ml.so.1 not found"
	m := newTestModel(t, f, 80, 24)
	press(t, m, "3")
	mustContain(t, screen(m), "NVML unavailable: libnvidia-ml.so.1 not found")
}

func TestPoolAnonymous(t *testing.T) {
	f := newFakeEngine(t)
	f.snap.Pool.Decision.Segment = ""
	f.snap.Pool.Decision.Shared = false
	f.snap.Pool.Decision.Reason = `--shm-name "" given on the command line`
	f.snap.Shm.ShmName, f.snap.Shm.PoolSize = "", 0
	m := newTestModel(t, f, 80, 24)
	press(t, m, "2")
	mustContain(t, screen(m), `anonymous (SHM off: --shm-name "" given on the command line)`, `replies shm_name "" pool_size 0`)
}

// A pickle-mode pool in its private segment: the pane names the segment
// as private and says why, and REGISTER advertises nothing.
func TestPoolPrivateSegment(t *testing.T) {
	f := newFakeEngine(t)
	f.snap.Pool.Decision.Segment = ""
	f.snap.Pool.Decision.Shared = false
	f.snap.Pool.Decision.Private = "kvdock_private_pool_0_5555_0a1b2c3d"
	f.snap.Pool.Decision.Reason = `--shm-name "" given on the command line; the pool is the private segment`
	f.snap.Shm.ShmName, f.snap.Shm.PoolSize = "", 0
	m := newTestModel(t, f, 80, 24)
	press(t, m, "2")
	mustContain(t, screen(m), "kvdock_private_pool_0_5555_0a1b2c3d  (private, not advertised)", `--shm-name "" given on the command line`,
		`replies shm_name "" pool_size 0`)
}

func TestSortAndDetails(t *testing.T) {
	m := newTestModel(t, newFakeEngine(t), 80, 24)
	if got := rowOrder(screen(m)); strings.Join(got, ",") != "4242,4243,9001" {
		t.Fatalf("default order by id: %v", got)
	}
	// shift+I is the sort column's own letter: it reverses.
	press(t, m, "I")
	if got := rowOrder(screen(m)); strings.Join(got, ",") != "9001,4243,4242" {
		t.Fatalf("reversed id order: %v", got)
	}
	press(t, m, "I")
	// shift+S picks "stores" directly, largest first (a figure).
	press(t, m, "S")
	s := screen(m)
	mustContain(t, s, "sort: stores (descending)")
	if got := rowOrder(s); strings.Join(got, ",") != "4242,4243,9001" {
		t.Fatalf("order by stores: %v", got)
	}
	press(t, m, "down", "enter")
	s = screen(m)
	mustContain(t, s, "Instance 4243", "registered 2026-11-30 10:30:00 (1h30m ago)", "last seen 45s ago", "world size 2")
	press(t, m, "esc")
	mustNotContain(t, screen(m), "Instance 4243")
}

func TestFilter(t *testing.T) {
	m := newTestModel(t, newFakeEngine(t), 80, 24)
	press(t, m, "/")
	typeText(t, m, "qwen")
	s := screen(m)
	mustContain(t, s, "1 of 3 context(s)", "filter: qwen")
	if got := rowOrder(s); strings.Join(got, ",") != "9001" {
		t.Fatalf("filtered rows: %v", got)
	}
	// q typed while filtering is text, not quit.
	press(t, m, "enter")
	mustContain(t, screen(m), `filter: "qwen"`)
	press(t, m, "/", "backspace", "backspace", "backspace", "backspace")
	typeText(t, m, "mode:pickle")
	if got := rowOrder(screen(m)); strings.Join(got, ",") != "9001" {
		t.Fatalf("mode filter rows: %v", got)
	}
	press(t, m, "esc")
	s = screen(m)
	mustContain(t, s, "3 of 3 context(s)")
	mustNotContain(t, s, "filter:")
	press(t, m, "/")
	typeText(t, m, "nothing-matches")
	mustContain(t, screen(m), "no context matches the filter")
}

// selectKey moves the settings selection to key.
func selectKey(t *testing.T, m *Model, key string) {
	t.Helper()
	for i, k := range m.settings.keyInfos {
		if k.Key == key {
			press(t, m, "g")
			for range i {
				press(t, m, "down")
			}
			return
		}
	}
	t.Fatalf("no setting %s", key)
}

// retype selects the setting key, opens its editor, empties the field and
// types text (not yet confirmed).
func retype(t *testing.T, m *Model, key, text string) {
	t.Helper()
	selectKey(t, m, key)
	press(t, m, "enter", "ctrl+u")
	typeText(t, m, text)
}

func TestSettingsEditValidation(t *testing.T) {
	f := newFakeEngine(t)
	m := newTestModel(t, f, 80, 24)
	press(t, m, "5")
	retype(t, m, "server.port", "70000")
	s := screen(m)
	mustContain(t, s, "INVALID: server.port = 70000: must be in 1..65535")
	press(t, m, "enter") // refused while invalid
	mustContain(t, screen(m), "new value: 70000")
	press(t, m, "backspace", "backspace")
	typeText(t, m, "x")
	mustContain(t, screen(m), `INVALID: server.port = "700x": must be an integer`)
	press(t, m, "backspace", "backspace")
	typeText(t, m, "01")
	mustContain(t, screen(m), "ok · ")
	press(t, m, "enter")
	s = screen(m)
	mustContain(t, s, "1 pending edit(s)", "server.port")
	if m.settings.pending.Server.Port != 7001 {
		t.Fatalf("pending port = %d", m.settings.pending.Server.Port)
	}
	if len(f.applyCalls()) != 0 {
		t.Fatal("editing must not apply")
	}
	// esc leaves a second edit without changing anything.
	press(t, m, "enter", "ctrl+u")
	typeText(t, m, "9")
	press(t, m, "esc")
	if m.settings.pending.Server.Port != 7001 {
		t.Fatalf("esc changed the value: %d", m.settings.pending.Server.Port)
	}
	press(t, m, "u")
	if m.settings.pending.Server.Port != 5555 {
		t.Fatal("u did not discard")
	}
}

func TestShmNameEmptyVersusAuto(t *testing.T) {
	f := newFakeEngine(t)
	m := newTestModel(t, f, 80, 24)
	press(t, m, "5")
	selectKey(t, m, "server.shm_name")
	// ctrl+u empties the field: the empty string, SHM off.
	press(t, m, "enter", "ctrl+u", "enter")
	if p := m.settings.pending.Server.ShmName; p == nil || *p != "" {
		t.Fatalf("want empty shm_name, got %v", p)
	}
	mustContain(t, screen(m), `* server.shm_name`, `""`)
	// ctrl+r puts the default back: auto (absent).
	press(t, m, "enter", "ctrl+r")
	mustContain(t, screen(m), "new value: (auto)")
	press(t, m, "enter")
	if m.settings.pending.Server.ShmName != nil {
		t.Fatalf("want auto, got %q", *m.settings.pending.Server.ShmName)
	}
	// Typing "" also means empty.
	press(t, m, "enter", "ctrl+u")
	typeText(t, m, `""`)
	press(t, m, "enter")
	if p := m.settings.pending.Server.ShmName; p == nil || *p != "" {
		t.Fatalf(`"" typed: want empty shm_name, got %v`, p)
	}
	// A bad name is refused inline.
	press(t, m, "enter", "ctrl+u")
	typeText(t, m, "bad name")
	mustContain(t, screen(m), "INVALID: server.shm_name")
}

func TestApplyConfirmShowsClasses(t *testing.T) {
	f := newFakeEngine(t)
	m := newTestModel(t, f, 100, 30)
	press(t, m, "5")
	selectKey(t, m, "server.shm_name")
	press(t, m, "enter", "ctrl+u", "enter")
	retype(t, m, "eviction.ratio", "0.3")
	press(t, m, "enter")
	retype(t, m, "server.port", "6000")
	press(t, m, "enter", "a")
	s := screen(m)
	mustContain(t, s, "Apply 3 change(s)?",
		`[REBUILD] server.shm_name: "demo" -> "" (cache will be cleared)`,
		"[RESTART] server.port: 5555 -> 6000 (server restarts)",
		"[LIVE] eviction.ratio: 0.2 -> 0.3 (in place)",
		"REBUILD: the cache will be cleared: 321 objects, 512 MiB dropped.", "3 registered worker(s) must re-register.")
	press(t, m, "n")
	if len(f.applyCalls()) != 0 {
		t.Fatal("n must not apply")
	}
	mustContain(t, screen(m), "apply cancelled")

	press(t, m, "a", "y")
	calls := f.applyCalls()
	if len(calls) != 1 {
		t.Fatalf("Apply calls = %d", len(calls))
	}
	if p := calls[0].Server.ShmName; p == nil || *p != "" || calls[0].Server.Port != 6000 || calls[0].Eviction.Ratio != 0.3 {
		t.Fatalf("applied config wrong: %+v", calls[0].Server)
	}
	src := f.appSrc[0]
	if src["server.shm_name"].Kind != settings.SourceDashboard || src["l1.size_gb"].Kind != settings.SourceFile {
		t.Fatalf("sources: %v", src)
	}
	s = screen(m)
	mustContain(t, s, "OK applied (rebuild): server.port, server.shm_name, eviction.ratio - pool rebuilt, cache cleared")
	// One Events line for the apply: the engine's, naming the keys and
	// the class; the dashboard adds none of its own.
	press(t, m, "4")
	applyLines(t, m, 1)
	mustContain(t, screen(m), "applied (rebuild): server.port, server.shm_name, eviction.ratio")
	press(t, m, "5")
	mustContain(t, screen(m), "0 pending edit(s)")
}

// applyLines checks that the Events pane on screen has want events about
// an apply (the header's status line aside).
func applyLines(t *testing.T, m *Model, want int) {
	t.Helper()
	s := screen(m)
	_, body, _ := strings.Cut(s, "[4 Events]")
	n := 0
	for _, l := range strings.Split(body, "\n") {
		if strings.Contains(l, " appl") && strings.Contains(l, ":") && len(l) > 9 && l[2] == ':' {
			n++
		}
	}
	if n != want {
		t.Fatalf("%d Events lines about the apply, want %d:\n%s", n, want, s)
	}
}

func TestApplyRollback(t *testing.T) {
	f := newFakeEngine(t)
	f.applyErr = errPortTaken
	f.rollback = true
	m := newTestModel(t, f, 120, 30)
	press(t, m, "5")
	retype(t, m, "server.port", "6000")
	press(t, m, "enter", "a")
	mustContain(t, screen(m), "[RESTART]", "RESTART: the wire server restarts")
	press(t, m, "y")
	s := screen(m)
	mustContain(t, s, "APPLY FAILED, ROLLED BACK to the running config: bind tcp://localhost:6000: address already in use")
	// The edit stays pending so the operator can fix it.
	mustContain(t, s, "1 pending edit(s)")
	// At 80 columns the reason wraps onto a second header line, whole.
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	lines := strings.Split(screen(m), "\n")
	// Under the pool and rates lines, which stay.
	mustContain(t, lines[1], "pool SHM lmcache_l1_pool_demo 50% used")
	head := strings.Join([]string{strings.TrimSpace(lines[3]), strings.TrimSpace(lines[4])}, " ")
	mustContain(t, head, "APPLY FAILED, ROLLED BACK", "address already in use")
	press(t, m, "4")
	mustContain(t, screen(m), "apply (restart): server.port failed, rolled back to")
	applyLines(t, m, 1)
}

func TestApplyNothingAndInvalid(t *testing.T) {
	f := newFakeEngine(t)
	m := newTestModel(t, f, 80, 24)
	press(t, m, "5", "a")
	mustContain(t, screen(m), "nothing to apply")
	// An invalid pending config (made through the API, not the editor) is refused.
	m.settings.pending.Server.Port = 0
	press(t, m, "a")
	mustContain(t, screen(m), "INVALID: 1 problem(s)", "server.port = 0 (from dashboard): must be in 1..65535")
	if len(f.applyCalls()) != 0 {
		t.Fatal("invalid config applied")
	}
}

func TestQuit(t *testing.T) {
	f := newFakeEngine(t)
	m := newTestModel(t, f, 80, 24)
	if cmd := press(t, m, "q"); cmd != nil {
		t.Fatal("q with workers registered must ask first")
	}
	mustContain(t, screen(m), "QUIT?", "3 worker context(s) are registered")
	press(t, m, "n")
	mustNotContain(t, screen(m), "QUIT?")
	press(t, m, "q")
	if cmd := press(t, m, "y"); !isQuit(cmd) {
		t.Fatal("y must quit")
	}
	if cmd := press(t, m, "ctrl+c"); !isQuit(cmd) {
		t.Fatal("ctrl+c must quit")
	}
	f.snap.Contexts = nil
	m2 := newTestModel(t, f, 80, 24)
	if cmd := press(t, m2, "q"); !isQuit(cmd) {
		t.Fatal("q without workers quits at once")
	}
}

func TestEventsMergeAndRefresh(t *testing.T) {
	f := newFakeEngine(t)
	m := newTestModel(t, f, 80, 24)
	// The same event from the subscription and a later snapshot shows once.
	ev := engine.Event{Seq: 4, Time: t0, Kind: "register", Message: "instance 5555 registered: SHM"}
	m.Update(eventMsg(ev))
	f.mu.Lock()
	f.snap.Events = append(f.snap.Events, ev)
	f.snap.State = engine.Restarting
	f.mu.Unlock()
	_, cmd := m.Update(tickMsg(t0))
	if cmd == nil {
		t.Fatal("tick must ask for a snapshot")
	}
	_, next := m.Update(cmd())
	if next == nil {
		t.Fatal("a snapshot must schedule the next tick")
	}
	press(t, m, "4")
	s := screen(m)
	if strings.Count(s, "instance 5555 registered") != 1 {
		t.Fatalf("event shown %d times:\n%s", strings.Count(s, "instance 5555 registered"), s)
	}
	mustContain(t, s, "state: RESTARTING")
}

// TestViewCachedWhenIdle: the frame is drawn again only after a message
// changed something. The clock moves on between frames, so a frame drawn
// again shows the contexts' idle times moved on too: a tick alone keeps the
// frame, the snapshot it asks for and a resize draw a new one.
func TestViewCachedWhenIdle(t *testing.T) {
	m, now := clockModel(t, newFakeEngine(t), 80, 24)
	first := screen(m)
	*now = now.Add(90 * time.Second)
	_, cmd := m.Update(tickMsg(*now))
	if got := screen(m); got != first {
		t.Fatalf("a tick alone drew a new frame:\n%s\nwas:\n%s", got, first)
	}
	if cmd == nil {
		t.Fatal("a tick must ask for a snapshot")
	}
	m.Update(cmd())
	moved := screen(m)
	if moved == first {
		t.Fatalf("the snapshot after 90 s kept the old frame:\n%s", moved)
	}
	if got := screen(m); got != moved {
		t.Fatalf("an idle View drew another frame:\n%s\nwas:\n%s", got, moved)
	}
	m.Update(tea.WindowSizeMsg{Width: 100, Height: 30})
	if lines := strings.Split(screen(m), "\n"); len(lines) != 30 {
		t.Fatalf("after a resize to 100x30 the frame has %d lines", len(lines))
	}
}

func TestResizeAndSmall(t *testing.T) {
	m := newTestModel(t, newFakeEngine(t), 80, 24)
	for _, sz := range [][2]int{{80, 24}, {120, 40}, {60, 15}, {200, 60}} {
		m.Update(tea.WindowSizeMsg{Width: sz[0], Height: sz[1]})
		for p := range paneCount {
			m.goPane(p)
			lines := strings.Split(screen(m), "\n")
			if len(lines) != sz[1] {
				t.Fatalf("%dx%d pane %d: %d lines", sz[0], sz[1], p, len(lines))
			}
			for _, l := range lines {
				if w := len([]rune(l)); w > sz[0] {
					t.Fatalf("%dx%d pane %d: line wider than the screen (%d): %q", sz[0], sz[1], p, w, l)
				}
			}
		}
	}
	m.Update(tea.WindowSizeMsg{Width: 30, Height: 8})
	mustContain(t, screen(m), "terminal too small")
}

func TestNoColor(t *testing.T) {
	o := testOptions()
	o.Profile = colorprofile.Unknown
	o.Environ = []string{"NO_COLOR=yes", "TERM=xterm-256color"}
	if p := profileFor(o); p != colorprofile.ASCII {
		t.Fatalf("NO_COLOR=yes: profile %v", p)
	}
	o.Environ = []string{"NO_COLOR=", "TERM=xterm-256color", "COLORTERM=truecolor"}
	o.Output = os.Stdout
	if p := profileFor(o); p == colorprofile.ASCII {
		// Empty NO_COLOR must not disable colour; stdout under go test may
		// not be a terminal, so only ASCII from NO_COLOR is an error here.
		if _, set := os.LookupEnv("NO_COLOR"); !set {
			t.Logf("profile %v (stdout is not a terminal)", p)
		}
	}
	// With the ASCII profile the view carries no colour codes at all.
	m := newTestModel(t, newFakeEngine(t), 80, 24)
	for p := range paneCount {
		m.goPane(p)
		if c := m.View().Content; regexp.MustCompile(`\x1b\[[0-9;]*(3[0-9]|4[0-9]|9[0-7])[;m]`).MatchString(c) {
			t.Fatalf("pane %d has colour codes: %q", p, c)
		}
	}
	// With colours on, PICKLE keeps its text label next to the colour.
	f := newFakeEngine(t)
	opts := testOptions().withDefaults(f)
	mc := newModel(context.Background(), f, opts, colorprofile.ANSI)
	mc.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	c := mc.View().Content
	if !strings.Contains(c, "\x1b[") || !strings.Contains(screen(mc), "PICKLE") {
		t.Fatal("colour profile: expected styled output with labels")
	}
}

func TestRunQuitsOnContext(t *testing.T) {
	f := newFakeEngine(t)
	ctx, cancel := context.WithCancel(context.Background())
	opts := testOptions()
	pr, pw := ioPipe()
	defer pw.Close()
	// A plain reader, not an *os.File: bubbletea then skips its epoll
	// reader, whose Close races with its own read loop under -race.
	opts.Input = struct{ io.Reader }{pr}
	opts.Output = discard{}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, f, opts) }()
	f.events <- engine.Event{Seq: 9, Time: t0, Kind: "register", Message: "late"}
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop when ctx ended")
	}
}

// TestShmOffKeySequence is the sequence the end-to-end test types in tmux:
// 5  /  shm_name  enter  enter  ctrl+u  enter  a  y.
func TestShmOffKeySequence(t *testing.T) {
	f := newFakeEngine(t)
	m := newTestModel(t, f, 80, 24)
	press(t, m, "1", "down") // start anywhere
	press(t, m, "5", "/")
	typeText(t, m, "shm_name")
	mustContain(t, screen(m), "find: shm_name", ">   server.shm_name")
	press(t, m, "enter", "enter", "ctrl+u", "enter", "a")
	mustContain(t, screen(m), `[REBUILD] server.shm_name: "demo" -> "" (cache will be cleared)`)
	press(t, m, "y")
	calls := f.applyCalls()
	if len(calls) != 1 {
		t.Fatalf("Apply calls = %d", len(calls))
	}
	if p := calls[0].Server.ShmName; p == nil || *p != "" {
		t.Fatalf("applied shm_name = %v, want empty (SHM off)", p)
	}
	if d := settings.Diff(f.snap.Config, calls[0]); len(d) != 1 || d[0].Key != "server.shm_name" {
		t.Fatalf("applied changes = %v, want only server.shm_name", d)
	}
}

func TestSettingsFind(t *testing.T) {
	m := newTestModel(t, newFakeEngine(t), 80, 24)
	press(t, m, "5", "/")
	typeText(t, m, "ratio")
	if k := m.settings.keyInfos[m.settings.cur.sel].Key; k != "eviction.ratio" {
		t.Fatalf("find ratio selected %s", k)
	}
	// "port" is exactly server.port's leaf, before http.port.
	press(t, m, "ctrl+u")
	typeText(t, m, "port")
	if k := m.settings.keyInfos[m.settings.cur.sel].Key; k != "server.port" {
		t.Fatalf("find port selected %s", k)
	}
	press(t, m, "esc")
	if m.settings.cur.sel != 0 {
		t.Fatal("esc must restore the selection")
	}
}

// TestApplyNextStart: log.format is read once at start; the confirmation
// says so instead of announcing a restart, and so does the result.
func TestApplyNextStart(t *testing.T) {
	f := newFakeEngine(t)
	m := newTestModel(t, f, 120, 30)
	press(t, m, "5")
	retype(t, m, "log.format", "json")
	press(t, m, "enter", "a")
	s := screen(m)
	mustContain(t, s, "[NEXT-START] log.format: ", "(takes effect at the next start)",
		"NEXT START: nothing restarts now")
	mustNotContain(t, s, "[RESTART]", "the wire server restarts")
	press(t, m, "y")
	if calls := f.applyCalls(); len(calls) != 1 || calls[0].Log.Format != "json" {
		t.Fatalf("Apply calls = %+v", calls)
	}
	mustContain(t, screen(m), "OK applied (next-start): log.format - log.format at the next start")
}

func TestStateColumnAndRemoveWithConfirmation(t *testing.T) {
	eng := newFakeEngine(t)
	m := newTestModel(t, eng, 80, 24)
	s := screen(m)
	mustContain(t, s, "STATE", "SEEN", "active", "idle", "no reaper")
	// x asks; n cancels and removes nothing.
	press(t, m, "x")
	mustContain(t, screen(m), "REMOVE?", "worker instance 4242", "pending stores are aborted")
	press(t, m, "n")
	mustContain(t, screen(m), "remove cancelled")
	if len(eng.removed) != 0 {
		t.Fatalf("cancelled remove removed %v", eng.removed)
	}
	// x then y removes the selected one, through the engine.
	press(t, m, "down", "x", "y")
	if len(eng.removed) != 1 || eng.removed[0] != 4243 {
		t.Fatalf("removed %v, want [4243]", eng.removed)
	}
	s = screen(m)
	mustContain(t, s, "instance 4243 removed", "removed")
	// A removed context cannot be removed again: no question is asked.
	press(t, m, "x")
	s = screen(m)
	mustNotContain(t, s, "REMOVE?")
	mustContain(t, s, "already removed")
}

func TestReaperShownWhenOn(t *testing.T) {
	eng := newFakeEngine(t)
	eng.snap.Liveness = workers.Liveness{Reaping: true, Timeout: 2 * time.Minute}
	m := newTestModel(t, eng, 80, 24)
	mustContain(t, screen(m), "reap after 2m")
}
