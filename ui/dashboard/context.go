package dashboard

import (
	"fmt"
	"log/slog"
	"time"

	"kvdock/core/engine"
	"kvdock/settings"
	"kvdock/ui/termtext"
)

// maxEvents bounds the events the dashboard keeps.
const maxEvents = 200

// A header message gives way to the live line after statusTTL (badTTL for
// failures: they are also in the Events pane, but deserve a longer look).
const (
	statusTTL = 5 * time.Second
	badTTL    = 15 * time.Second
)

// level is the tone of a status line; it is always also said in words.
type level int

const (
	levelInfo level = iota
	levelOK
	levelWarn
	levelBad
)

// programContext is what the model shares with every pane: the options,
// the styles and the keys all views use, the latest snapshot and running
// config, the screen size, and the three things any pane may change: the
// header's status line, the event log and the question on screen.
type programContext struct {
	opts Options
	st   Styles
	keys keyMap

	snap    engine.Snapshot
	running settings.Config
	runSrc  map[string]settings.Source

	// width and height are the terminal's; a pane's own size comes with
	// SetSize.
	width, height int

	status statusLine
	events eventLog
	// asking is the yes/no question that has the keyboard, nil when none.
	asking *question
}

// statusLine is the header's message: apply progress and the results of
// apply, save and remove. It expires (expire) so the live line comes back.
type statusLine struct {
	text     string
	level    level
	at       time.Time // when it was set (opts.Now)
	applying bool      // an apply is running: the message stays
}

// setStatus puts msg in the header.
func (c *programContext) setStatus(lv level, msg string) {
	c.status.text, c.status.level, c.status.at = termtext.Clean(msg), lv, c.opts.Now()
}

// expireStatus drops a header message that has been shown long enough, so
// the live line (mode, % used, workers) comes back. It reports whether the
// header changed.
func (c *programContext) expireStatus() bool {
	s := &c.status
	if s.text == "" || s.applying {
		return false
	}
	ttl := statusTTL
	if s.level >= levelWarn {
		ttl = badTTL
	}
	if c.opts.Now().Sub(s.at) < ttl {
		return false
	}
	s.text = ""
	return true
}

// eventLog is the last maxEvents events: the engine's, each once, and the
// dashboard's own notes.
type eventLog struct {
	list    []engine.Event
	lastSeq uint64
}

// add keeps engine events once each (snapshot and subscription both
// deliver them) and dashboard events (Seq 0) always.
func (l *eventLog) add(ev engine.Event) {
	ev.Message, ev.Kind = termtext.Clean(ev.Message), engine.EventKind(termtext.Clean(string(ev.Kind)))
	if ev.Seq != 0 {
		if ev.Seq <= l.lastSeq {
			return
		}
		l.lastSeq = ev.Seq
	}
	l.list = append(l.list, ev)
	if len(l.list) > maxEvents {
		l.list = append(l.list[:0], l.list[len(l.list)-maxEvents:]...)
	}
}

// note records a dashboard action in the events pane.
func (c *programContext) note(lv slog.Level, msg string) {
	c.events.add(engine.Event{Time: c.opts.Now(), Kind: "dashboard", Level: lv, Message: msg})
}

// ask puts a yes/no question on screen; it has the keyboard until answered.
func (c *programContext) ask(q question) { c.asking = &q }

// pageSize is how far PgUp/PgDn move: about one screen of list rows.
func (c *programContext) pageSize() int { return max(1, c.height-8) }

// logLine says where the logs go.
func (c *programContext) logLine() string {
	if c.opts.LogFile == "" {
		return c.st.Bold.Render("Log file  ") + "none (logs go to stderr)"
	}
	return c.st.Bold.Render("Log file  ") + c.opts.LogFile
}

// hostRAMLine is the host's RAM and where the pool's pages live, for the
// Pool and GPU panes.
func (c *programContext) hostRAMLine() string {
	h := c.snap.Host
	ram := "n/a"
	if h.Total > 0 {
		ram = fmt.Sprintf("%s available / %s", settings.BytesText(h.Available), settings.BytesText(h.Total))
	}
	return c.st.Bold.Render("Host RAM  ") + ram + " · NUMA " + h.Where()
}
