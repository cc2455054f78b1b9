package dashboard

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"

	"kvdock/core/engine"
	"kvdock/core/tierstate"
	"kvdock/settings"
)

// fakeTiers are an fs tier that is up and busy, a resp tier that is down
// and a degraded cluster tier.
func fakeTiers() []tierstate.Tier {
	return []tierstate.Tier{
		{Index: 0, Type: "fs", Target: "/data/l2", State: tierstate.Up, Since: t0.Add(-time.Hour),
			UsedBytes: 3 << 30, CapacityBytes: 10 << 30, Objects: 1234, Hits: 900, Misses: 100, Corrupt: 2,
			QueueDepth: 5, QueueBytes: 5 << 20, DroppedWrites: 7, ReadBytes: 40e9, WriteBytes: 10e9, Loads: 880, LoadTimeouts: 3},
		{Index: 1, Type: "resp", Target: "redis://redis:6379", State: tierstate.Down, Since: t0.Add(-30 * time.Second),
			Reason: "dial tcp 10.0.0.5:6379: connect: connection refused; retrying in 4s", Misses: 50},
		{Index: 2, Type: "resp", Target: "cluster 10.0.0.1:7000,10.0.0.2:7000", State: tierstate.Degraded, Since: t0.Add(-5 * time.Minute),
			Reason: "1 of 3 nodes unreachable", UsedBytes: 1 << 30},
	}
}

// withTiers gives the fixture tiers and advances the fake engine's clock by
// a second between snapshots, so rates can be derived.
func withTiers(t *testing.T, f *fakeEngine, tiers []tierstate.Tier) {
	t.Helper()
	f.mu.Lock()
	f.snap.Tiers = tiers
	f.cfg.L2.Adapters = []settings.Adapter{
		{Type: "fs", FS: settings.FSAdapter{BasePath: "/data/l2"}},
		{Type: "resp", RESP: settings.RESPAdapter{Host: "redis", Port: 6379, Password: "sekrit-pw"}},
		{Type: "resp", RESP: settings.RESPAdapter{Cluster: true, StartupNodes: []string{"10.0.0.1:7000", "10.0.0.2:7000"}}},
	}
	f.mu.Unlock()
}

func TestTiersGoldens(t *testing.T) {
	for _, size := range [][2]int{{80, 24}, {160, 48}} {
		w, h := size[0], size[1]
		f := newFakeEngine(t)
		withTiers(t, f, fakeTiers())
		m := newTestModel(t, f, w, h)
		// A second snapshot, a second later, with 2 GB read and 0.5 GB
		// written in between.
		next := f.Snapshot()
		next.Taken = next.Taken.Add(time.Second)
		next.Tiers = fakeTiers()
		next.Tiers[0].ReadBytes += 2e9
		next.Tiers[0].WriteBytes += 5e8
		m.Update(snapMsg(next))
		m.goPane(paneTiers)
		golden(t, fmt.Sprintf("tiers_up_down_%dx%d", w, h), goldenView(m))
	}
}

func TestTiersPane(t *testing.T) {
	f := newFakeEngine(t)
	withTiers(t, f, fakeTiers())
	m := newTestModel(t, f, 160, 48)
	press(t, m, "6")
	s := screen(m)
	mustContain(t, s, "[6 Tiers]", "3 tier(s) in lookup order", "store write-behind", "8 loads in flight",
		"Tier 0  fs  UP for 1h00m  /data/l2", "3.0 GiB / 10.0 GiB (30.0%) · 1234 object(s)",
		"900 hits · 100 misses · 2 corrupt rejected · 880 loaded (3 timed out)", "queue 5 (5.0 MiB) · 7 dropped",
		"Tier 1  resp  DOWN for 30s  redis://redis:6379", "why: dial tcp 10.0.0.5:6379: connect: connection refused",
		"Tier 2  resp  DEGRADED", "1 of 3 nodes unreachable", "no capacity bound",
		"read - · write - (needs two refreshes)")
	mustNotContain(t, s, "sekrit-pw")

	// Rates come from the byte deltas between two snapshots.
	next := f.Snapshot()
	next.Taken = next.Taken.Add(2 * time.Second)
	next.Tiers = fakeTiers()
	next.Tiers[0].ReadBytes += 4e9
	next.Tiers[0].WriteBytes += 1e9
	m.Update(snapMsg(next))
	mustContain(t, screen(m), "read 1.9 GiB/s · write 477 MiB/s", "read 0 B/s · write 0 B/s")

	// A tier whose totals went back (its process restarted) shows no rate
	// rather than a huge or negative one.
	again := next
	again.Taken = again.Taken.Add(time.Second)
	again.Tiers = fakeTiers()
	m.Update(snapMsg(again))
	s = screen(m)
	if strings.Count(s, "needs two refreshes") != 1 || !strings.Contains(s, "read 0 B/s") {
		t.Fatalf("after a reset:\n%s", s)
	}

	// Peers choose reasons: no escape sequence reaches the terminal.
	evil := fakeTiers()
	evil[1].Reason = "refused \x1b[2J\x1b]0;pwned\x07 now"
	m.Update(snapMsg(engine.Snapshot{Taken: t0.Add(time.Hour), Tiers: evil}))
	if c := m.View().Content; strings.Contains(c, "\x1b[2J") || strings.Contains(c, "\x1b]0;") {
		t.Fatalf("escape sequence passed: %q", c)
	}
}

func TestTiersPaneScrollsAndFitsSmallScreens(t *testing.T) {
	f := newFakeEngine(t)
	var many []tierstate.Tier
	for i := range 8 {
		many = append(many, tierstate.Tier{Index: i, Type: "fs", Target: fmt.Sprintf("/data/l2-%d", i), State: tierstate.Up})
	}
	withTiers(t, f, many)
	m := newTestModel(t, f, 80, 24)
	press(t, m, "6")
	s := screen(m)
	mustContain(t, s, "Tier 0", "more below (pgdn, G bottom)", "pgdn/ctrl+d page down")
	mustNotContain(t, s, "Tier 7")
	if n := len(strings.Split(m.View().Content, "\n")); n != 24 {
		t.Fatalf("%d lines at 80x24", n)
	}
	press(t, m, "G")
	s = screen(m)
	mustContain(t, s, "Tier 7", "more above (pgup, g top)")
	mustNotContain(t, s, "Tier 0 ", "more below")
	press(t, m, "pgup")
	mustContain(t, screen(m), "more above", "more below")
	press(t, m, "g")
	mustContain(t, screen(m), "Tier 0")
	mustNotContain(t, screen(m), "more above")
	for _, size := range [][2]int{{40, 10}, {60, 15}} {
		m.Update(tea.WindowSizeMsg{Width: size[0], Height: size[1]})
		for _, l := range strings.Split(screen(m), "\n") {
			if w := len([]rune(l)); w > size[0] {
				t.Fatalf("line wider than %d: %q", size[0], l)
			}
		}
	}
}

func TestTiersConfiguredButNotOpen(t *testing.T) {
	f := newFakeEngine(t)
	withTiers(t, f, nil)
	m := newTestModel(t, f, 160, 48)
	press(t, m, "6")
	s := screen(m)
	mustContain(t, s, "no tier is open", "3 adapter(s) configured",
		`0  {"type": "fs", "base_path": "/data/l2"}`, `"password": "`+settings.Redacted+`"`)
	mustNotContain(t, s, "sekrit-pw", "no L2 tier configured")
}

func TestAdaptersReadOnlyInSettings(t *testing.T) {
	f := newFakeEngine(t)
	withTiers(t, f, fakeTiers())
	m := newTestModel(t, f, 160, 48)
	press(t, m, "5")
	selectKey(t, m, settings.KeyAdapters)
	s := screen(m)
	mustContain(t, s, "l2.adapters", "read-only here", "--l2-adapter", "KVDOCK_L2_ADAPTERS", "running 1:", settings.Redacted)
	mustNotContain(t, s, "sekrit-pw")
	for _, k := range []string{"enter", "e", "r"} {
		press(t, m, k)
		if m.settings.mode == setEdit {
			t.Fatalf("%s opened the editor on l2.adapters", k)
		}
		mustContain(t, screen(m), "read-only here")
		mustNotContain(t, screen(m), "sekrit-pw")
	}
	if m.settings.pendingEdits() != 0 {
		t.Fatalf("pending edits: %d", m.settings.pendingEdits())
	}
}

func TestTierEventsRender(t *testing.T) {
	f := newFakeEngine(t)
	m := newTestModel(t, f, 120, 30)
	m.Update(eventMsg(engine.Event{Seq: 50, Time: t0, Kind: "tier", Level: slog.LevelWarn,
		Message: "tier 1 resp redis://redis:6379 down: connection refused"}))
	press(t, m, "4")
	mustContain(t, screen(m), "WARN  tier", "tier 1 resp redis://redis:6379 down: connection refused")
}

// kvEventsOn is a KV event stream that published and dropped some.
func kvEventsOn(f *fakeEngine) {
	f.mu.Lock()
	f.snap.KVEvents = engine.KVEventsStatus{Enabled: true, Endpoint: "tcp://0.0.0.0:5557", Sent: 1234,
		StoredEvents: 56789, RemovedEvents: 4321, Dropped: 7, SendErrors: 1, ReplayRequests: 3}
	f.mu.Unlock()
}

// TestTiersPaneKVEventsLines: with the stream on, the Tiers pane says where
// it publishes, the replays asked, the batches and blocks published and
// what it dropped (queue drops and send errors), whole at 80 columns, with
// tiers and without; with the stream off it says nothing of it.
func TestTiersPaneKVEventsLines(t *testing.T) {
	f := newFakeEngine(t)
	withTiers(t, f, fakeTiers())
	m := newTestModel(t, f, 160, 48)
	press(t, m, "6")
	mustNotContain(t, screen(m), "KV events")

	kvEventsOn(f)
	m = newTestModel(t, f, 80, 24)
	m.goPane(paneTiers)
	golden(t, "tiers_kv_events_80x24", goldenView(m))
	s := screen(m)
	mustContain(t, s, "KV events PUB on tcp://0.0.0.0:5557 · 3 replay request(s)",
		"1234 batches published · 56789 blocks stored, 4321 removed · 8 dropped")

	f.mu.Lock()
	f.snap.Tiers = nil
	f.cfg.L2.Adapters = nil
	f.snap.KVEvents.Connect = true
	f.mu.Unlock()
	m = newTestModel(t, f, 80, 24)
	m.goPane(paneTiers)
	mustContain(t, screen(m), "no L2 tier configured", "KV events PUB to tcp://0.0.0.0:5557", "1234 batches published")
}
