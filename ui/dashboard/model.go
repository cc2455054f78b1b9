package dashboard

import (
	"context"
	"fmt"
	"strings"
	"time"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/colorprofile"

	"kvdock/core/engine"
	"kvdock/ui/termtext"
)

// Messages the model handles itself; the panes' (applyMsg, removeMsg) are
// beside them.
type (
	tickMsg  time.Time
	snapMsg  engine.Snapshot
	eventMsg engine.Event
)

// Model is the dashboard's Bubble Tea model. It owns the header, the tabs,
// the help bar, the help screen and the yes/no questions, and routes keys
// and the screen to the pane on show; each pane keeps its own state.
type Model struct {
	eng  Engine
	pc   *programContext
	help help.Model

	pane     pane
	helpOpen bool // the help screen has the keyboard

	contexts *contextsPane
	pool     *poolPane
	gpu      *gpuPane
	events   *eventsPane
	settings *settingsPane
	tiers    *tiersPane
	panes    [paneCount]component

	// followRefresh makes the tick follow the running ui.refresh.
	followRefresh bool

	// View cache: rebuilt only after a message changed something.
	dirty  bool
	cached string
}

func newModel(ctx context.Context, eng Engine, opts Options, profile colorprofile.Profile) *Model {
	st := NewStyles(profile)
	pc := &programContext{opts: opts, st: st, keys: newKeyMap(), width: 80, height: 24}
	pc.running, pc.runSrc = eng.Config()
	m := &Model{
		eng:      eng,
		pc:       pc,
		help:     help.New(),
		contexts: newContextsPane(pc, eng),
		pool:     &poolPane{scrollPane{pc: pc}},
		gpu:      &gpuPane{scrollPane{pc: pc}},
		events:   newEventsPane(pc),
		settings: newSettingsPane(ctx, pc, eng),
		tiers:    &tiersPane{scrollPane: scrollPane{pc: pc}},
		dirty:    true,
	}
	m.panes = [paneCount]component{m.contexts, m.pool, m.gpu, m.events, m.settings, m.tiers}
	m.help.Styles = help.Styles{
		ShortKey: st.Key, ShortDesc: lipgloss.NewStyle(), ShortSeparator: st.Faint,
		FullKey: st.Key, FullDesc: lipgloss.NewStyle(), FullSeparator: st.Faint, Ellipsis: st.Faint,
	}
	m.resize()
	m.setSnapshot(eng.Snapshot())
	return m
}

// Init starts the refresh tick.
func (m *Model) Init() tea.Cmd { return m.tick() }

func (m *Model) tick() tea.Cmd {
	every := m.pc.opts.Refresh
	if r := m.pc.running.UI.Refresh; m.followRefresh && r >= 100*time.Millisecond {
		every = r
	}
	return tea.Tick(every, func(t time.Time) tea.Msg { return tickMsg(t) })
}

// snapshotCmd reads the engine off the UI goroutine. Snapshot never waits
// for an Apply (it reads the state the engine published), but it takes the
// pool's and the transfer module's locks and calls statfs, which a busy
// server can make slow; keys must not wait for that.
func (m *Model) snapshotCmd() tea.Cmd {
	eng := m.eng
	return func() tea.Msg { return snapMsg(eng.Snapshot()) }
}

func (m *Model) setSnapshot(s engine.Snapshot) {
	// Peers choose model names and the texts of reasons and errors: no
	// escape sequence of theirs reaches the terminal.
	termtext.CleanAll(&s)
	m.pc.snap = s
	at := s.Taken
	if at.IsZero() {
		at = m.pc.opts.Now()
	}
	m.tiers.addRates(s.Tiers, at)
	for _, ev := range s.Events {
		m.pc.events.add(ev)
	}
	m.contexts.snapshotChanged()
}

// resize gives every pane the screen's width and the height left under a
// three-line header; render corrects the height of the pane on show while
// a status message takes a line or two more.
func (m *Model) resize() {
	for _, p := range m.panes {
		p.SetSize(m.pc.width, m.pc.height-5)
	}
}

// Update handles one message.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	m.dirty = true
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.pc.width, m.pc.height = msg.Width, msg.Height
		m.resize()
		return m, nil
	case tickMsg:
		m.dirty = m.pc.expireStatus()
		return m, m.snapshotCmd()
	case snapMsg:
		m.setSnapshot(engine.Snapshot(msg))
		return m, m.tick()
	case eventMsg:
		m.pc.events.add(engine.Event(msg))
		return m, nil
	case applyMsg:
		m.settings.applied(msg)
		return m, m.snapshotCmd()
	case removeMsg:
		m.contexts.removed(msg)
		return m, m.snapshotCmd()
	case resetMsg:
		m.statsReset(msg)
		return m, m.snapshotCmd()
	case tea.KeyPressMsg:
		return m, m.onKey(msg)
	case tea.PasteMsg:
		if p := m.active(); m.typing() {
			return m, p.Update(msg)
		}
		return m, nil
	}
	m.dirty = false
	return m, nil
}

func (m *Model) active() component { return m.panes[m.pane] }

// typing reports that a pane's text field has the keyboard.
func (m *Model) typing() bool {
	return !m.helpOpen && m.pc.asking == nil && m.active().Typing()
}

// onKey routes a key: ctrl+c always quits; a text field takes every other
// key; then a question or the help screen; then the global keys; then the
// pane.
func (m *Model) onKey(msg tea.KeyPressMsg) tea.Cmd {
	g, p := m.pc.keys.Global, m.active()
	if key.Matches(msg, g.ForceQuit) {
		return tea.Quit
	}
	if m.typing() {
		return p.Update(msg)
	}
	if q := m.pc.asking; q != nil {
		switch {
		case key.Matches(msg, m.pc.keys.Confirm.Yes):
			m.pc.asking = nil
			return q.yes()
		case key.Matches(msg, m.pc.keys.Confirm.No):
			m.pc.asking = nil
			if q.no != "" {
				m.pc.setStatus(levelInfo, q.no)
			}
		}
		return nil
	}
	if m.helpOpen {
		m.helpOpen = false
		return nil
	}

	switch {
	case key.Matches(msg, g.Quit):
		if registeredContexts(m.pc.snap.Contexts) > 0 || m.settings.pendingEdits() > 0 {
			m.pc.ask(question{view: m.quitView, yes: func() tea.Cmd { return tea.Quit }})
			p.Leave()
			return nil
		}
		return tea.Quit
	case key.Matches(msg, g.ResetStats):
		m.askResetStats()
		p.Leave()
		return nil
	case key.Matches(msg, g.Help):
		m.helpOpen = true
		p.Leave()
		return nil
	case key.Matches(msg, g.Next):
		m.goPane((m.pane + 1) % paneCount)
		return nil
	case key.Matches(msg, g.Prev):
		m.goPane((m.pane + paneCount - 1) % paneCount)
		return nil
	case key.Matches(msg, g.Jump):
		m.goPane(pane(msg.Code - '1'))
		return nil
	}
	cmd := p.Update(msg)
	if m.pc.asking != nil {
		// A question takes the screen: the pane closes what it had open.
		p.Leave()
	}
	return cmd
}

// goPane shows pane p with nothing open: no question, no help, no prompt.
func (m *Model) goPane(p pane) {
	if p < 0 || p >= paneCount {
		return
	}
	for _, c := range m.panes {
		c.Leave()
	}
	m.pc.asking, m.helpOpen = nil, false
	m.pane = p
	m.dirty = true
}

// View renders the latest state; it is rebuilt only when a message changed
// something, so an idle dashboard costs one snapshot a second.
func (m *Model) View() tea.View {
	if m.dirty || m.cached == "" {
		m.cached = m.render()
		m.dirty = false
	}
	v := tea.NewView(m.cached)
	v.AltScreen = true
	v.WindowTitle = "kvdock"
	return v
}

// minimum usable size; below it the dashboard says so instead of garbling.
const minWidth, minHeight = 40, 10

func (m *Model) render() string {
	w, h := m.pc.width, m.pc.height
	if w < minWidth || h < minHeight {
		return fitLines(fmt.Sprintf("kvdock: terminal too small (%dx%d)\nneeds at least %dx%d", w, h, minWidth, minHeight), w, h)
	}
	header := m.pc.renderHeader(w)
	tabs := m.renderTabs(w)
	bodyH := h - lipgloss.Height(header) - 2
	body := fitLines(m.renderBody(w, bodyH), w, bodyH)
	// After the body: whether a pane offers its scroll keys depends on
	// whether what it drew fit.
	footer := m.renderHelpBar(w)
	return strings.Join([]string{header, tabs, body, footer}, "\n")
}

func (m *Model) renderBody(w, h int) string {
	if m.helpOpen {
		return m.renderHelp(w)
	}
	if q := m.pc.asking; q != nil {
		return q.view(w)
	}
	p := m.active()
	p.SetSize(w, h)
	return p.View()
}

// quitView asks before quitting when quitting costs something.
func (m *Model) quitView(int) string {
	st := m.pc.st
	var why []string
	if n := registeredContexts(m.pc.snap.Contexts); n > 0 {
		why = append(why, fmt.Sprintf("%d worker context(s) are registered; they lose their cache server.", n))
	}
	if n := m.settings.pendingEdits(); n > 0 {
		why = append(why, fmt.Sprintf("%d setting edit(s) are not applied; quitting drops them (5 Settings, a to apply).", n))
	}
	return st.Warn.Render("QUIT?") + " " + strings.Join(why, "\n       ") + "\n\n" +
		"Quit kvdock? " + st.Key.Render("y") + " quit  " + st.Key.Render("n") + " stay"
}

func (m *Model) renderTabs(w int) string {
	var parts []string
	for i, name := range paneNames {
		label := fmt.Sprintf(" %d %s ", i+1, name)
		if pane(i) == m.pane {
			parts = append(parts, m.pc.st.TabOn.Render("["+strings.TrimSpace(label)+"]"))
		} else {
			parts = append(parts, m.pc.st.Tab.Render(label))
		}
	}
	return fit(strings.Join(parts, " "), w)
}

// currentKeys is the key map of what has the keyboard now.
func (m *Model) currentKeys() []key.Binding {
	switch {
	case m.helpOpen:
		return []key.Binding{key.NewBinding(key.WithKeys("esc"), key.WithHelp("any key", "close help"))}
	case m.pc.asking != nil:
		return m.pc.keys.Confirm.list()
	case m.typing():
		return m.active().ShortKeys()
	}
	g := m.pc.keys.Global
	// The bar keeps the pane's own keys and the way to the rest.
	return append([]key.Binding{g.Help, g.Quit, g.Next}, m.active().ShortKeys()...)
}

// renderHelpBar shows the keys that fit whole; the rest are behind ?
// (first in the bar), so the bar never ends in a cut-off entry.
func (m *Model) renderHelpBar(w int) string {
	m.help.SetWidth(w)
	m.help.Ellipsis = ""
	return fit(m.help.ShortHelpView(m.currentKeys()), w)
}

func (m *Model) renderHelp(w int) string {
	m.help.SetWidth(w)
	p := m.active()
	groups := append(p.HelpKeys(), m.pc.keys.Global.list())
	title := m.pc.st.Title.Render("Keys — " + paneNames[m.pane])
	// The log file comes first: a short screen cuts the bottom.
	out := title + "\n" + m.pc.logLine() + "\n\n" + m.help.FullHelpView(groups)
	if notes := p.HelpNotes(w); notes != "" {
		out += "\n\n" + notes
	}
	return out
}
