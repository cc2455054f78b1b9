package dashboard

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"

	"kvdock/core/engine"
)

// TestPeerStringsCannotEscape: a worker whose model name carries SGR codes
// and a BEL (and reasons and events carrying other sequences) leaves no
// ESC or BEL in any pane. With the NoTTY profile the dashboard itself
// writes no escapes, so any found would be the peer's.
func TestPeerStringsCannotEscape(t *testing.T) {
	evil := "\x1b[31mEVIL\x1b[0m\x07"
	f := newFakeEngine(t)
	f.snap.Contexts[0].Model = evil
	f.snap.Contexts[0].Reason = "attached\x1b]0;owned title\x07"
	f.snap.Error = "boom\x1b[2J"
	f.snap.Shm.Reason = "why\u009b31m"
	f.snap.GPU.Devices[0].Name = "H200\x1b[41m"
	f.snap.Events = append(f.snap.Events, engine.Event{Seq: 9, Time: t0, Kind: "register\x1b[5m", Level: slog.LevelWarn, Message: "instance 4242 registered: model " + evil})
	opts := testOptions()
	opts.Profile = colorprofile.NoTTY
	opts = opts.withDefaults(f)
	m := newModel(context.Background(), f, opts, opts.Profile)
	m.Update(tea.WindowSizeMsg{Width: 160, Height: 40})
	f.events <- engine.Event{Seq: 10, Time: t0, Kind: "error", Level: slog.LevelError, Message: "bad model " + evil}
	m.Update(eventMsg(<-f.events))

	check := func(pane string) {
		t.Helper()
		raw := m.View().Content
		if strings.ContainsAny(raw, "\x1b\x07\u009b") {
			t.Fatalf("%s: control characters reached the screen: %q", pane, raw)
		}
	}
	check("contexts")
	if !strings.Contains(screen(m), "EVIL") {
		t.Fatalf("the model name is gone instead of cleaned:\n%s", screen(m))
	}
	press(t, m, "enter")
	check("context details")
	press(t, m, "esc", "2")
	check("pool")
	press(t, m, "3")
	check("gpu")
	press(t, m, "4")
	check("events")
	mustContain(t, screen(m), "registered: model EVIL", "bad model EVIL")
	press(t, m, "1", "/")
	typeText(t, m, "EVIL")
	check("filter")
}
