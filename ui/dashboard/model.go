package dashboard

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/colorprofile"

	"kvdock/core/engine"
	"kvdock/core/tierstate"
	"kvdock/core/workers"
	"kvdock/settings"
	"kvdock/ui/termtext"
)

// pane is one screen of the dashboard, chosen with tab or its number.
type pane int

const (
	paneContexts pane = iota
	panePool
	paneGPU
	paneEvents
	paneSettings
	paneTiers
	paneCount
)

var paneNames = [paneCount]string{"Contexts", "Pool", "GPU", "Events", "Settings", "Tiers"}

// mode is what has the keyboard.
type mode int

const (
	modeNormal mode = iota
	modeFilter
	modeEvFilter
	modeFind
	modeDetails
	modeEdit
	modeConfirmApply
	modeConfirmQuit
	modeConfirmRemove
	modeHelp
)

// maxEvents bounds the events the dashboard keeps.
const maxEvents = 200

// A header message gives way to the live line after statusTTL (badTTL for
// failures: they are also in the Events pane, but deserve a longer look).
const (
	statusTTL = 5 * time.Second
	badTTL    = 15 * time.Second
)

// Messages.
type (
	tickMsg  time.Time
	snapMsg  engine.Snapshot
	eventMsg engine.Event
	applyMsg struct {
		res engine.ApplyResult
		err error
	}
	removeMsg struct {
		id  int64
		err error
	}
)

// level is the tone of a status line; it is always also said in words.
type level int

const (
	levelInfo level = iota
	levelOK
	levelWarn
	levelBad
)

// Model is the dashboard's Bubble Tea model.
type Model struct {
	ctx     context.Context
	eng     Engine
	opts    Options
	st      Styles
	keys    keyMap
	help    help.Model
	profile colorprofile.Profile

	width, height int
	// removing is the context a remove confirmation is about.
	removing workers.ContextInfo
	snap     engine.Snapshot
	events   []engine.Event
	lastSeq  uint64

	pane pane
	mode mode

	// contexts pane
	ctxSel    int
	sortCol   int
	sortDesc  bool
	filter    textPrompt
	filterStr string

	// events pane: events scrolled up from the newest, and its filters
	evScroll    int
	evLevel     slog.Level // events below it are hidden
	evFilter    textPrompt
	evFilterStr string

	// tiers pane: the first tier shown, and the totals of the previous
	// snapshot the read/write rates are derived from
	tierSel    int
	tierPrev   []tierstate.Tier
	tierPrevAt time.Time
	tierRates  map[int]tierRate

	// settings pane
	running  settings.Config
	runSrc   map[string]settings.Source
	pending  settings.Config
	keyInfos []settings.KeyInfo
	setSel   int
	edit     lineEdit
	find     textPrompt
	findFrom int // selection before a find, restored by esc
	editErr  string
	problems []string // validation problems shown after a refused apply
	changes  []settings.Change

	// header status: apply progress and results, save results
	applying    bool
	status      string
	statusLevel level
	statusAt    time.Time // when status was set (opts.Now); it expires

	// followRefresh makes the tick follow the running ui.refresh.
	followRefresh bool

	// View cache: rebuilt only after a message changed something.
	dirty  bool
	cached string
}

func newModel(ctx context.Context, eng Engine, opts Options, profile colorprofile.Profile) *Model {
	st := NewStyles(profile)
	m := &Model{
		ctx:      ctx,
		eng:      eng,
		opts:     opts,
		st:       st,
		keys:     newKeyMap(),
		help:     help.New(),
		profile:  profile,
		width:    80,
		height:   24,
		keyInfos: settings.Keys(),
		dirty:    true,
	}
	m.help.Styles = help.Styles{
		ShortKey: st.Key, ShortDesc: lipgloss.NewStyle(), ShortSeparator: st.Faint,
		FullKey: st.Key, FullDesc: lipgloss.NewStyle(), FullSeparator: st.Faint, Ellipsis: st.Faint,
	}
	m.filter = newTextPrompt(st, "filter: ", m.keys.Filter)
	m.evFilter = newTextPrompt(st, "filter: ", m.keys.EvFilter)
	m.evLevel = slog.LevelDebug
	m.edit = newLineEdit(st, "new value: ")
	m.find = newTextPrompt(st, "find: ", m.keys.Find)
	m.running, m.runSrc = eng.Config()
	m.pending = m.running
	m.setSnapshot(eng.Snapshot())
	return m
}

// Init starts the refresh tick.
func (m *Model) Init() tea.Cmd { return m.tick() }

func (m *Model) tick() tea.Cmd {
	every := m.opts.Refresh
	if r := m.running.UI.Refresh; m.followRefresh && r >= 100*time.Millisecond {
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
	m.snap = s
	at := s.Taken
	if at.IsZero() {
		at = m.opts.Now()
	}
	m.addTierRates(s.Tiers, at)
	for _, ev := range s.Events {
		m.addEvent(ev)
	}
	if n := len(m.visibleContexts()); m.ctxSel >= n {
		m.ctxSel = max(0, n-1)
	}
}

// addEvent keeps engine events once each (snapshot and subscription both
// deliver them) and dashboard events (Seq 0) always.
func (m *Model) addEvent(ev engine.Event) {
	ev.Message, ev.Kind = termtext.Clean(ev.Message), engine.EventKind(termtext.Clean(string(ev.Kind)))
	if ev.Seq != 0 {
		if ev.Seq <= m.lastSeq {
			return
		}
		m.lastSeq = ev.Seq
	}
	m.events = append(m.events, ev)
	if len(m.events) > maxEvents {
		m.events = append(m.events[:0], m.events[len(m.events)-maxEvents:]...)
	}
}

// note records a dashboard action in the events pane.
func (m *Model) note(lv slog.Level, msg string) {
	m.addEvent(engine.Event{Time: m.opts.Now(), Kind: "dashboard", Level: lv, Message: msg})
}

func (m *Model) setStatus(lv level, msg string) {
	m.status, m.statusLevel, m.statusAt = termtext.Clean(msg), lv, m.opts.Now()
}

// expireStatus drops a header message that has been shown long enough, so
// the live line (mode, % used, workers) comes back. It reports whether the
// header changed.
func (m *Model) expireStatus() bool {
	if m.status == "" || m.applying {
		return false
	}
	ttl := statusTTL
	if m.statusLevel >= levelWarn {
		ttl = badTTL
	}
	if m.opts.Now().Sub(m.statusAt) < ttl {
		return false
	}
	m.status = ""
	return true
}

// Update handles one message.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	m.dirty = true
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
		return m, nil
	case tickMsg:
		m.dirty = m.expireStatus()
		return m, m.snapshotCmd()
	case snapMsg:
		m.setSnapshot(engine.Snapshot(msg))
		return m, m.tick()
	case eventMsg:
		m.addEvent(engine.Event(msg))
		return m, nil
	case applyMsg:
		m.applyDone(msg)
		return m, m.snapshotCmd()
	case removeMsg:
		m.removeDone(msg)
		return m, m.snapshotCmd()
	case tea.KeyPressMsg:
		return m, m.onKey(msg)
	case tea.PasteMsg:
		return m, m.onText(msg)
	}
	m.dirty = false
	return m, nil
}

func (m *Model) onText(msg tea.Msg) tea.Cmd {
	switch m.mode {
	case modeFilter:
		m.onFilter(msg)
	case modeEdit:
		if m.edit.Update(msg) {
			m.checkEdit()
		}
	case modeEvFilter:
		m.onEvFilter(msg)
	case modeFind:
		m.onFind(msg)
	}
	return nil
}

func (m *Model) onKey(msg tea.KeyPressMsg) tea.Cmd {
	g := m.keys.Global
	if key.Matches(msg, g.ForceQuit) {
		return tea.Quit
	}
	switch m.mode {
	case modeFilter, modeEvFilter, modeFind:
		return m.onText(msg)
	case modeEdit:
		return m.onEditKey(msg)
	case modeConfirmApply:
		switch {
		case key.Matches(msg, m.keys.Confirm.Yes):
			return m.startApply()
		case key.Matches(msg, m.keys.Confirm.No):
			m.mode = modeNormal
			m.setStatus(levelInfo, "apply cancelled")
		}
		return nil
	case modeConfirmQuit:
		switch {
		case key.Matches(msg, m.keys.Confirm.Yes):
			return tea.Quit
		case key.Matches(msg, m.keys.Confirm.No):
			m.mode = modeNormal
		}
		return nil
	case modeConfirmRemove:
		switch {
		case key.Matches(msg, m.keys.Confirm.Yes):
			return m.startRemove()
		case key.Matches(msg, m.keys.Confirm.No):
			m.mode = modeNormal
			m.setStatus(levelInfo, "remove cancelled")
		}
		return nil
	case modeHelp:
		m.mode = modeNormal
		return nil
	}

	switch {
	case key.Matches(msg, g.Quit):
		if registeredContexts(m.snap.Contexts) > 0 || m.pendingEdits() > 0 {
			m.mode = modeConfirmQuit
			return nil
		}
		return tea.Quit
	case key.Matches(msg, g.Help):
		m.mode = modeHelp
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

	switch m.pane {
	case paneContexts:
		return m.onContextsKey(msg)
	case paneEvents:
		return m.onEventsKey(msg)
	case paneSettings:
		return m.onSettingsKey(msg)
	case paneTiers:
		m.onTiersKey(msg)
	}
	return nil
}

func (m *Model) goPane(p pane) {
	if p < 0 || p >= paneCount {
		return
	}
	m.pane = p
	m.mode = modeNormal
	m.dirty = true
}

// pendingEdits counts the settings edited but not applied.
func (m *Model) pendingEdits() int { return len(settings.Diff(m.running, m.pending)) }

// pageSize is how far PgUp/PgDn move: about one screen of list rows.
func (m *Model) pageSize() int { return max(1, m.height-8) }

// moveSel applies the list keys to a selection of n items.
func (m *Model) moveSel(msg tea.KeyPressMsg, sel *int, n int) bool {
	l := m.keys.List
	switch {
	case key.Matches(msg, l.Up):
		*sel--
	case key.Matches(msg, l.Down):
		*sel++
	case key.Matches(msg, l.PageUp):
		*sel -= m.pageSize()
	case key.Matches(msg, l.PageDown):
		*sel += m.pageSize()
	case key.Matches(msg, l.Top):
		*sel = 0
	case key.Matches(msg, l.Bottom):
		*sel = n - 1
	default:
		return false
	}
	*sel = max(0, min(*sel, n-1))
	return true
}

func (m *Model) onContextsKey(msg tea.KeyPressMsg) tea.Cmd {
	k := m.keys.Contexts
	rows := m.visibleContexts()
	if m.moveSel(msg, &m.ctxSel, len(rows)) {
		return nil
	}
	switch {
	case key.Matches(msg, k.SortBy):
		for i, c := range ctxColumns {
			if msg.String() != string(c.key) {
				continue
			}
			if i == m.sortCol {
				m.sortDesc = !m.sortDesc
			} else {
				m.sortCol, m.sortDesc = i, false
			}
		}
	case key.Matches(msg, k.Sort):
		// The next column on screen: sorting by a hidden one would order
		// the table by something nobody can see.
		shown := tableColumns(m.width, m.sortCol)
		next := shown[0].title
		for i, c := range shown {
			if c.title == ctxColumns[m.sortCol].title {
				next = shown[(i+1)%len(shown)].title
			}
		}
		for i, c := range ctxColumns {
			if c.title == next {
				m.sortCol, m.sortDesc = i, false
			}
		}
	case key.Matches(msg, k.Filter):
		m.mode = modeFilter
		m.filter.Open(m.filterStr)
		return nil
	case key.Matches(msg, k.Details):
		if len(rows) > 0 {
			if m.mode == modeDetails {
				m.mode = modeNormal
			} else {
				m.mode = modeDetails
			}
		}
	case key.Matches(msg, k.Clear):
		if m.mode == modeDetails {
			m.mode = modeNormal
		} else {
			m.filterStr = ""
		}
	case key.Matches(msg, k.Remove):
		m.askRemove(rows)
	}
	return nil
}

// onFilter takes a key or a paste while the contexts filter is typed: the
// table follows the text; esc clears it.
func (m *Model) onFilter(msg tea.Msg) {
	switch m.filter.Update(msg) {
	case promptChanged:
		m.filterStr = m.filter.Value()
		m.ctxSel = 0
	case promptAccepted:
		m.mode = modeNormal
	case promptCancelled:
		m.mode = modeNormal
		m.filterStr = ""
		m.ctxSel = 0
	}
}

func (m *Model) onEventsKey(msg tea.KeyPressMsg) tea.Cmd {
	// The selection here is the scroll offset, counted from the newest event.
	n := len(m.visibleEvents())
	sel := n - 1 - m.evScroll
	if m.moveSel(msg, &sel, n) {
		m.evScroll = max(0, n-1-sel)
		return nil
	}
	k := m.keys.Events
	switch {
	case key.Matches(msg, k.Filter):
		m.mode = modeEvFilter
		m.evFilter.Open(m.evFilterStr)
	case key.Matches(msg, k.Level):
		// all -> INFO and up -> WARN and up -> ERROR only -> all
		switch {
		case m.evLevel < slog.LevelInfo:
			m.evLevel = slog.LevelInfo
		case m.evLevel < slog.LevelWarn:
			m.evLevel = slog.LevelWarn
		case m.evLevel < slog.LevelError:
			m.evLevel = slog.LevelError
		default:
			m.evLevel = slog.LevelDebug
		}
		m.evScroll = 0
	case key.Matches(msg, k.Clear):
		m.evLevel, m.evFilterStr, m.evScroll = slog.LevelDebug, "", 0
	}
	return nil
}

// onEvFilter takes a key or a paste while the events filter is typed.
func (m *Model) onEvFilter(msg tea.Msg) {
	switch m.evFilter.Update(msg) {
	case promptChanged:
		m.evFilterStr = m.evFilter.Value()
		m.evScroll = 0
	case promptAccepted:
		m.mode = modeNormal
	case promptCancelled:
		m.mode = modeNormal
		m.evFilterStr = ""
		m.evScroll = 0
	}
}

// visibleEvents is the events that pass the level and text filters.
func (m *Model) visibleEvents() []engine.Event {
	f := strings.ToLower(m.evFilterStr)
	if f == "" && m.evLevel <= slog.LevelDebug {
		return m.events
	}
	var out []engine.Event
	for _, ev := range m.events {
		if ev.Level < m.evLevel {
			continue
		}
		if f != "" && !strings.Contains(strings.ToLower(string(ev.Kind)+" "+ev.Message), f) {
			continue
		}
		out = append(out, ev)
	}
	return out
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
	w, h := m.width, m.height
	if w < minWidth || h < minHeight {
		return fitLines(fmt.Sprintf("kvdock: terminal too small (%dx%d)\nneeds at least %dx%d", w, h, minWidth, minHeight), w, h)
	}
	header := m.renderHeader(w)
	tabs := m.renderTabs(w)
	footer := m.renderHelpBar(w)
	bodyH := h - lipgloss.Height(header) - 2
	body := fitLines(m.renderBody(w, bodyH), w, bodyH)
	return strings.Join([]string{header, tabs, body, footer}, "\n")
}

func (m *Model) renderBody(w, h int) string {
	switch m.mode {
	case modeHelp:
		return m.renderHelp(w)
	case modeConfirmQuit:
		var why []string
		if n := registeredContexts(m.snap.Contexts); n > 0 {
			why = append(why, fmt.Sprintf("%d worker context(s) are registered; they lose their cache server.", n))
		}
		if n := m.pendingEdits(); n > 0 {
			why = append(why, fmt.Sprintf("%d setting edit(s) are not applied; quitting drops them (5 Settings, a to apply).", n))
		}
		return m.st.Warn.Render("QUIT?") + " " + strings.Join(why, "\n       ") + "\n\n" +
			"Quit kvdock? " + m.st.Key.Render("y") + " quit  " + m.st.Key.Render("n") + " stay"
	case modeConfirmApply:
		return m.renderConfirmApply(w)
	case modeConfirmRemove:
		return m.renderConfirmRemove()
	}
	switch m.pane {
	case paneContexts:
		return m.renderContexts(w, h)
	case panePool:
		return m.renderPool(w, h)
	case paneGPU:
		return m.renderGPU(w, h)
	case paneEvents:
		return m.renderEvents(w, h)
	case paneSettings:
		return m.renderSettings(w, h)
	case paneTiers:
		return m.renderTiers(w, h)
	}
	return ""
}

func (m *Model) renderTabs(w int) string {
	var parts []string
	for i, name := range paneNames {
		label := fmt.Sprintf(" %d %s ", i+1, name)
		if pane(i) == m.pane {
			parts = append(parts, m.st.TabOn.Render("["+strings.TrimSpace(label)+"]"))
		} else {
			parts = append(parts, m.st.Tab.Render(label))
		}
	}
	return fit(strings.Join(parts, " "), w)
}

// currentKeys is the key map of what has the keyboard now.
func (m *Model) currentKeys() []key.Binding {
	switch m.mode {
	case modeFilter:
		return m.keys.Filter.list()
	case modeEvFilter:
		return m.keys.EvFilter.list()
	case modeFind:
		return m.keys.Find.list()
	case modeEdit:
		return m.keys.Edit.list()
	case modeConfirmApply, modeConfirmQuit, modeConfirmRemove:
		return m.keys.Confirm.list()
	case modeHelp:
		return []key.Binding{key.NewBinding(key.WithKeys("esc"), key.WithHelp("any key", "close help"))}
	}
	var own []key.Binding
	switch m.pane {
	case paneContexts:
		own = m.keys.Contexts.list()
	case paneEvents:
		own = m.keys.Events.list()
	case paneSettings:
		own = m.keys.Settings.list()
	case paneTiers:
		if len(m.snap.Tiers) > 1 {
			own = m.keys.List.list()
		}
	}
	g := m.keys.Global
	// The bar keeps the pane's own keys and the way to the rest.
	return append([]key.Binding{g.Help, g.Quit, g.Next}, own...)
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
	var groups [][]key.Binding
	if m.pane == paneContexts {
		groups = append(groups, m.keys.Contexts.list(), m.keys.Filter.list())
	}
	if m.pane == paneEvents {
		groups = append(groups, m.keys.Events.list(), m.keys.EvFilter.list())
	}
	if m.pane == paneSettings {
		groups = append(groups, m.keys.Settings.list(), m.keys.Edit.list())
	}
	if m.pane == paneTiers {
		groups = append(groups, m.keys.List.list())
	}
	groups = append(groups, m.keys.Global.list())
	title := m.st.Title.Render("Keys — " + paneNames[m.pane])
	// The log file comes first: a short screen cuts the bottom.
	out := title + "\n" + m.logLine() + "\n\n" + m.help.FullHelpView(groups)
	if m.pane == paneContexts {
		var cols []string
		for _, c := range ctxColumns {
			cols = append(cols, string(c.key)+" "+c.sortName)
		}
		out += "\n\n" + wrapWords("sort: shift+letter picks a column, again reverses it: "+strings.Join(cols, " · "), w) +
			"\n" + wrapWords("filter: text matches id or model; col:value matches one column (model:llama, mode:pickle, layout:bfloat16)", w)
	}
	return out
}

// logLine says where the logs go.
func (m *Model) logLine() string {
	if m.opts.LogFile == "" {
		return m.st.Bold.Render("Log file  ") + "none (logs go to stderr)"
	}
	return m.st.Bold.Render("Log file  ") + m.opts.LogFile
}

// applyDone takes Apply's answer: the header and the events pane say what
// happened, a rollback included.
func (m *Model) applyDone(msg applyMsg) {
	m.applying = false
	m.running, m.runSrc = m.eng.Config()
	what := changeKeys(msg.res.Changes)
	switch {
	case msg.err != nil && msg.res.RolledBack:
		m.setStatus(levelBad, fmt.Sprintf("APPLY FAILED, ROLLED BACK to the running config: %v", strings.TrimSuffix(msg.err.Error(), " (rolled back to the running config)")))
		m.note(slog.LevelError, fmt.Sprintf("apply %s failed and was rolled back: %v", what, msg.err))
	case msg.err != nil:
		m.setStatus(levelBad, fmt.Sprintf("APPLY FAILED: %v", msg.err))
		m.note(slog.LevelError, fmt.Sprintf("apply %s failed: %v", what, msg.err))
	default:
		text := fmt.Sprintf("applied (%s): %s", msg.res.Class, what)
		if msg.res.Class == settings.Rebuild {
			text += " - pool rebuilt, cache cleared"
		}
		var later []settings.Change
		for _, c := range msg.res.Changes {
			if c.Class == settings.NextStart {
				later = append(later, c)
			}
		}
		if len(later) > 0 {
			text += " - " + changeKeys(later) + " at the next start"
		}
		m.setStatus(levelOK, "OK "+text)
		m.note(slog.LevelInfo, text)
		m.pending = m.running
	}
}

func changeKeys(cs []settings.Change) string {
	if len(cs) == 0 {
		return "no changes"
	}
	keys := make([]string, len(cs))
	for i, c := range cs {
		keys[i] = c.Key
	}
	return strings.Join(keys, ", ")
}

// memoryCheck is settings.CheckMemory for an edited config: a new pool
// size must fit the host's available memory plus what the running pool
// gives back (a rebuild closes it before the new one is made). An
// unchanged size, or no probe, checks nothing.
func (m *Model) memoryCheck(c settings.Config) error {
	if m.opts.Memory == nil || c.L1.SizeBytes() == m.running.L1.SizeBytes() {
		return nil
	}
	avail, err := m.opts.Memory.MemAvailable()
	if err != nil {
		return nil
	}
	p := m.snap.Pool
	avail += min(p.Size, max(p.Prefaulted, p.UsedBytes))
	return settings.CheckMemory(c, m.pendingSources(), avail)
}
