package dashboard

import (
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"

	"kvdock/core/engine"
)

// eventsPane is request latency over the last minute, then the event log,
// newest at the bottom, filtered by level and text.
type eventsPane struct {
	sized
	pc     *programContext
	keys   eventKeys
	typing bool // the filter prompt has the keyboard
	// scroll is the event lines' window under the latency head; while
	// follow holds it stays at the newest, which new events then push up.
	scroll    scroller
	follow    bool
	rows      int        // the lines the last view had for events
	overflow  bool       // the events did not fit: the help bar offers the keys
	level     slog.Level // events below it are hidden
	filter    textPrompt
	filterStr string
}

func newEventsPane(pc *programContext) *eventsPane {
	return &eventsPane{
		pc: pc, keys: newEventKeys(), level: slog.LevelDebug, follow: true,
		filter: newTextPrompt(pc.st, "filter: ", newPromptKeys("keep filter", "clear filter")),
	}
}

func (p *eventsPane) Typing() bool { return p.typing }
func (p *eventsPane) Leave()       { p.typing = false }

func (p *eventsPane) ShortKeys() []key.Binding {
	if p.typing {
		return p.filter.keys.list()
	}
	if p.overflow {
		k := p.keys.listKeys
		return append([]key.Binding{k.PageUp, k.PageDown, k.Top, k.Bottom}, p.keys.list()...)
	}
	return p.keys.list()
}

func (p *eventsPane) HelpKeys() [][]key.Binding {
	return [][]key.Binding{p.keys.list(), p.filter.keys.list()}
}

func (p *eventsPane) Update(msg tea.Msg) tea.Cmd {
	if p.typing {
		p.onFilter(msg)
		return nil
	}
	kp, ok := msg.(tea.KeyPressMsg)
	if !ok {
		return nil
	}
	// The view decides whether this left it at the newest.
	if p.scroll.move(p.keys.listKeys, kp, p.rows) {
		p.follow = false
		return nil
	}
	k := p.keys
	switch {
	case key.Matches(kp, k.Filter):
		p.typing = true
		p.filter.Open(p.filterStr)
	case key.Matches(kp, k.Level):
		// all -> INFO and up -> WARN and up -> ERROR only -> all
		switch {
		case p.level < slog.LevelInfo:
			p.level = slog.LevelInfo
		case p.level < slog.LevelWarn:
			p.level = slog.LevelWarn
		case p.level < slog.LevelError:
			p.level = slog.LevelError
		default:
			p.level = slog.LevelDebug
		}
		p.follow = true
	case key.Matches(kp, k.Clear):
		p.level, p.filterStr, p.follow = slog.LevelDebug, "", true
	}
	return nil
}

// onFilter takes a key or a paste while the filter is typed.
func (p *eventsPane) onFilter(msg tea.Msg) {
	switch p.filter.Update(msg) {
	case promptChanged:
		p.filterStr = p.filter.Value()
		p.follow = true
	case promptAccepted:
		p.typing = false
	case promptCancelled:
		p.typing = false
		p.filterStr = ""
		p.follow = true
	}
}

// visible is the events that pass the level and text filters.
func (p *eventsPane) visible() []engine.Event {
	all := p.pc.events.list
	f := strings.ToLower(p.filterStr)
	if f == "" && p.level <= slog.LevelDebug {
		return all
	}
	var out []engine.Event
	for _, ev := range all {
		if ev.Level < p.level {
			continue
		}
		if f != "" && !strings.Contains(strings.ToLower(string(ev.Kind)+" "+ev.Message), f) {
			continue
		}
		out = append(out, ev)
	}
	return out
}

func (p *eventsPane) View() string {
	pc, st, w, h := p.pc, p.pc.st, p.w, p.h
	// Request latency heads the pane: what the workers feel, above what
	// the server did.
	head := pc.latencyBlock(w, h)
	h = max(1, h-len(head))
	all := pc.events.list
	if len(all) == 0 {
		return strings.Join(append(head, st.Faint.Render("no events yet")), "\n")
	}
	evs := p.visible()
	if p.typing || p.filterStr != "" || p.level > slog.LevelDebug {
		info := fmt.Sprintf("%d of %d event(s) · level: %s", len(evs), len(all), levelText(p.level))
		if p.typing {
			info += " · " + p.filter.View()
		} else if p.filterStr != "" {
			info += " · filter: " + strconv.Quote(p.filterStr)
		}
		head = append(head, fit(info, w))
		h = max(1, h-1)
	}
	if len(evs) == 0 {
		return strings.Join(append(head, st.Faint.Render("no event matches the filter")), "\n")
	}
	var lines []string
	for _, ev := range evs {
		lv := strings.ToUpper(ev.Level.String())
		tone := lipgloss.NewStyle()
		switch {
		case ev.Level >= slog.LevelError:
			tone = st.Bad
		case ev.Level >= slog.LevelWarn:
			tone = st.Warn
		}
		prefix := fmt.Sprintf("%s %s %-10s ", ev.Time.In(pc.opts.Location).Format("15:04:05"), tone.Render(fmt.Sprintf("%-5s", lv)), ev.Kind)
		// Messages wrap under their own column so reasons stay whole.
		indent := strings.Repeat(" ", lipgloss.Width(prefix))
		msgW := max(10, w-len(indent))
		for i, part := range strings.Split(wrapWords(ev.Message, msgW), "\n") {
			if i == 0 {
				lines = append(lines, fit(prefix+part, w))
			} else {
				lines = append(lines, fit(indent+part, w))
			}
		}
	}
	p.rows, p.overflow = h, len(lines) > h
	if p.follow {
		p.scroll.top = math.MaxInt32
	}
	shown := p.scroll.window(st, lines, h)
	if h < 3 {
		shown = lines[max(0, len(lines)-h):] // no room to say more: the newest
	}
	// Back at the newest (G, or scrolled down to it): follow again.
	p.follow = !p.overflow || p.scroll.top >= len(lines)-(h-1)
	return strings.Join(append(head, shown...), "\n")
}

// levelText names the events level filter.
func levelText(lv slog.Level) string {
	if lv <= slog.LevelDebug {
		return "all"
	}
	if lv >= slog.LevelError {
		return "ERROR only"
	}
	return lv.String() + " and up"
}
