package dashboard

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"kvdock/core/engine"
	"kvdock/core/workers"
	"kvdock/settings"
)

// contextsMode is what the contexts pane shows besides its table.
type contextsMode int

const (
	ctxTable   contextsMode = iota
	ctxFilter               // the filter prompt has the keyboard
	ctxDetails              // the selected context's details under the table
)

// remover is what the contexts pane needs from the engine.
type remover interface {
	RemoveInstance(id int64, by engine.ClearOrigin) error
}

// contextsPane is the table of worker contexts: sorted by any column,
// filtered, with the details of the selected one.
type contextsPane struct {
	sized
	pc   *programContext
	eng  remover
	keys contextKeys
	mode contextsMode
	cur  listCursor

	sortCol   int
	sortDesc  bool
	filter    textPrompt
	filterStr string
	// detail scrolls the details when they do not fit under the table;
	// detailOverflow says the last view did not fit, detailOf whose they
	// were (another context's start at the top).
	detail         scroller
	detailOverflow bool
	detailRows     int // the rows the details had in the last view
	detailOf       int64
	// hadWorkers: a worker was registered since the dashboard started, so
	// an empty table means they left, not that none came yet.
	hadWorkers bool
}

// removeMsg is the engine's answer to a remove.
type removeMsg struct {
	id  int64
	err error
}

func newContextsPane(pc *programContext, eng remover) *contextsPane {
	return &contextsPane{
		pc: pc, eng: eng, keys: newContextKeys(),
		filter: newTextPrompt(pc.st, "filter: ", newPromptKeys("keep filter", "clear filter")),
	}
}

func (p *contextsPane) Typing() bool { return p.mode == ctxFilter }
func (p *contextsPane) Leave()       { p.mode = ctxTable }

func (p *contextsPane) ShortKeys() []key.Binding {
	if p.mode == ctxFilter {
		return p.filter.keys.list()
	}
	if p.scrollsDetails() {
		k := p.keys.listKeys
		return append([]key.Binding{k.PageDown, k.PageUp, k.Top, k.Bottom}, p.keys.list()...)
	}
	return p.keys.list()
}

// scrollsDetails reports that pgup/pgdn and g/G scroll the details (they
// are open and did not fit) rather than page the table; ↑↓ still move the
// selection.
func (p *contextsPane) scrollsDetails() bool {
	return p.mode == ctxDetails && p.detailOverflow
}

func (p *contextsPane) HelpKeys() [][]key.Binding {
	return [][]key.Binding{p.keys.list(), p.filter.keys.list()}
}

func (p *contextsPane) HelpNotes(w int) string {
	var cols []string
	for _, c := range ctxColumns {
		cols = append(cols, string(c.key)+" "+c.sortName)
	}
	return wrapWords("sort: shift+letter picks a column, again reverses it: "+strings.Join(cols, " · "), w) +
		"\n" + wrapWords("filter: "+filterSyntax, w)
}

// snapshotChanged keeps the selection on a row that still exists.
func (p *contextsPane) snapshotChanged() {
	p.hadWorkers = p.hadWorkers || len(p.pc.snap.Contexts) > 0
	if n := len(p.visible()); p.cur.sel >= n {
		p.cur.sel = max(0, n-1)
	}
}

func (p *contextsPane) Update(msg tea.Msg) tea.Cmd {
	if p.mode == ctxFilter {
		p.onFilter(msg)
		return nil
	}
	kp, ok := msg.(tea.KeyPressMsg)
	if !ok {
		return nil
	}
	k := p.keys
	rows := p.visible()
	if p.scrollsDetails() && key.Matches(kp, k.PageUp, k.PageDown, k.Top, k.Bottom) {
		p.detail.move(k.listKeys, kp, p.detailRows)
		return nil
	}
	if p.cur.move(k.listKeys, kp, len(rows), p.pc.pageSize()) {
		return nil
	}
	switch {
	case key.Matches(kp, k.SortBy):
		for i, c := range ctxColumns {
			if kp.String() != string(c.key) {
				continue
			}
			if i == p.sortCol {
				p.sortDesc = !p.sortDesc
			} else {
				// Figures start with the largest, as htop and k9s do.
				p.sortCol, p.sortDesc = i, c.right
			}
		}
	case key.Matches(kp, k.Sort):
		p.nextSort()
	case key.Matches(kp, k.Filter):
		p.mode = ctxFilter
		p.filter.Open(p.filterStr)
	case key.Matches(kp, k.Details):
		if len(rows) > 0 {
			if p.mode == ctxDetails {
				p.mode = ctxTable
			} else {
				p.mode = ctxDetails
			}
		}
	case key.Matches(kp, k.Clear):
		if p.mode == ctxDetails {
			p.mode = ctxTable
		} else {
			p.filterStr = ""
		}
	case key.Matches(kp, k.Remove):
		p.askRemove(rows)
	}
	return nil
}

// nextSort sorts by the next column on screen: sorting by a hidden one
// would order the table by something nobody can see.
func (p *contextsPane) nextSort() {
	shown := tableColumns(p.w, p.sortCol)
	next := shown[0].title
	for i, c := range shown {
		if c.title == ctxColumns[p.sortCol].title {
			next = shown[(i+1)%len(shown)].title
		}
	}
	for i, c := range ctxColumns {
		if c.title == next {
			p.sortCol, p.sortDesc = i, c.right
		}
	}
}

// onFilter takes a key or a paste while the filter is typed: the table
// follows the text; esc clears it.
func (p *contextsPane) onFilter(msg tea.Msg) {
	switch p.filter.Update(msg) {
	case promptChanged:
		p.filterStr = p.filter.Value()
		p.cur.sel = 0
	case promptAccepted:
		p.mode = ctxTable
	case promptCancelled:
		p.mode = ctxTable
		p.filterStr = ""
		p.cur.sel = 0
	}
}

// filterSyntax is what the contexts filter accepts.
const filterSyntax = "text matches every column (digits: the id), col:value one column (mode:pickle, model:llama, layout:bf16)"

// textColumns is what a plain filter f searches in c: the id and every
// column shown as text, or the id alone when f is digits.
func (p *contextsPane) textColumns(c workers.ContextInfo, f string) string {
	id := strconv.FormatInt(c.InstanceID, 10)
	if strings.Trim(f, "0123456789") == "" {
		return id
	}
	parts := []string{id}
	for _, col := range ctxColumns {
		if !col.right {
			parts = append(parts, col.value(p.pc, c))
		}
	}
	return strings.Join(parts, "\x00")
}

// visible is the contexts after the filter, in the chosen order. The
// filter matches the chosen column (col:value), else every column shown as
// text (id, model, state, mode, layout); digits alone match the id only:
// "4" must not match every row through its layout's dimensions.
func (p *contextsPane) visible() []workers.ContextInfo {
	fcol, f := filterColumn(p.filterStr)
	f = strings.ToLower(f)
	var out []workers.ContextInfo
	for _, c := range p.pc.snap.Contexts {
		if f != "" || fcol == -2 {
			var hay string
			switch fcol {
			case -2:
				continue
			case -1:
				hay = p.textColumns(c, f)
			default:
				hay = ctxColumns[fcol].value(p.pc, c)
			}
			if !strings.Contains(strings.ToLower(hay), f) {
				continue
			}
		}
		out = append(out, c)
	}
	col := ctxColumns[p.sortCol]
	less := col.less
	if col.lessBy != nil {
		less = func(a, b workers.ContextInfo) int { return col.lessBy(p.pc, a, b) }
	}
	slices.SortStableFunc(out, func(a, b workers.ContextInfo) int {
		r := less(a, b)
		if r == 0 {
			r = cmp.Compare(a.InstanceID, b.InstanceID)
		}
		if p.sortDesc {
			r = -r
		}
		return r
	})
	return out
}

func (p *contextsPane) View() string {
	pc, st, w, h := p.pc, p.pc.st, p.w, p.h
	var b strings.Builder
	rows := p.visible()
	col := ctxColumns[p.sortCol]
	order := "ascending"
	if p.sortDesc {
		order = "descending"
	}
	info := fmt.Sprintf("%d of %d context(s) · sort: %s (%s) · %s", len(rows), len(pc.snap.Contexts), col.sortName, order, reaperText(pc.snap.Liveness))
	if c, _ := filterColumn(p.filterStr); c == -2 {
		info += " · no such column (" + strings.SplitN(p.filterStr, ":", 2)[0] + ")"
	}
	if p.mode == ctxFilter {
		info += " · " + p.filter.View()
	} else if p.filterStr != "" {
		info += " · filter: " + strconv.Quote(p.filterStr)
	}
	b.WriteString(info + "\n")
	if p.mode == ctxFilter {
		// The syntax while it is typed, not only behind ?.
		for _, l := range strings.Split(wrapWords(filterSyntax, w-2), "\n") {
			b.WriteString(st.Faint.Render("  "+l) + "\n")
			h--
		}
	}

	cols := tableColumns(w, p.sortCol)
	var head []string
	for _, c := range cols {
		t := c.title
		if c.title == col.title {
			t += map[bool]string{false: "^", true: "v"}[p.sortDesc]
		}
		if c.right {
			head = append(head, cell(c, t))
		} else {
			head = append(head, fit(t, c.width))
		}
	}
	b.WriteString(st.Header.Render(fit("  "+strings.Join(head, " "), w)) + "\n")

	if len(rows) == 0 {
		switch rb := pc.snap.Rebuilt; {
		case len(pc.snap.Contexts) == 0 && rb.DroppedContexts > 0:
			text := fmt.Sprintf("a pool rebuild %s dropped %d worker context(s); workers must re-register (restart them, or let them reconnect)",
				ageText(pc.opts.Now(), rb.At), rb.DroppedContexts)
			for _, l := range strings.Split(wrapWords(text, w-2), "\n") {
				b.WriteString("  " + st.Warn.Render(l) + "\n")
			}
		case len(pc.snap.Contexts) == 0 && p.hadWorkers:
			b.WriteString(st.Faint.Render("  no worker is registered now: the workers left (4 Events says when)") + "\n")
		case len(pc.snap.Contexts) == 0:
			b.WriteString(st.Faint.Render("  no worker has registered yet") + "\n")
		default:
			b.WriteString(st.Faint.Render("  no context matches the filter") + "\n")
		}
		return b.String()
	}

	details := p.mode == ctxDetails
	var detail []string
	listH := h - 2
	if details {
		// The details' text first (a blank line, then its lines); the
		// table keeps one row at least, charts take what is left.
		detail = p.details(rows[min(p.cur.sel, len(rows)-1)], w)
		listH = max(1, min(len(rows), listH-1-len(detail)))
	}
	if len(rows) > listH {
		listH = max(1, listH-1) // room for "n more below"
	}
	start := p.cur.start(listH)
	for i := start; i < len(rows) && i < start+listH; i++ {
		var cells []string
		for _, c := range cols {
			raw := c.value(pc, rows[i])
			if c.chart != nil {
				raw = c.chart(pc, rows[i], c.width)
			}
			v := cell(c, raw)
			if c.title == "MODE" && rows[i].Mode == workers.ModePickle {
				v = st.Warn.Render(v)
			}
			cells = append(cells, v)
		}
		line := strings.Join(cells, " ")
		if i == p.cur.sel {
			b.WriteString(st.Selected.Render(fit("> "+line, w)) + "\n")
		} else {
			b.WriteString("  " + line + "\n")
		}
	}
	shown := min(len(rows)-start, listH)
	if n := len(rows) - start - listH; n > 0 {
		b.WriteString(st.Faint.Render(fmt.Sprintf("  … %d more below", n)) + "\n")
		shown++
	}
	if details {
		c := rows[min(p.cur.sel, len(rows)-1)]
		if c.InstanceID != p.detailOf {
			p.detail.top, p.detailOf = 0, c.InstanceID
		}
		room := h - 2 - shown - 1 // under the blank line
		detail = append(detail, pc.contextCharts(c, w, room-len(detail))...)
		p.detailOverflow, p.detailRows = len(detail) > room, room
		b.WriteString("\n" + strings.Join(p.detail.window(st, detail, room), "\n") + "\n")
	}
	return b.String()
}

// details are the text lines of c's details: what it is, its figures and
// its headline numbers; the charts come after them where there is room.
func (p *contextsPane) details(c workers.ContextInfo, w int) []string {
	pc, st := p.pc, p.pc.st
	reg := "-"
	if !c.Registered.IsZero() {
		reg = c.Registered.In(pc.opts.Location).Format("2006-01-02 15:04:05") + " (" + ageText(pc.opts.Now(), c.Registered) + ")"
	}
	mla := ""
	if c.MLA {
		mla = " (MLA)"
	}
	lines := []string{
		st.Title.Render(fmt.Sprintf("Instance %d", c.InstanceID)) + "  " + c.Model + fmt.Sprintf("  world size %d", c.WorldSize),
		"  mode       " + string(c.Mode) + ": " + c.Reason,
		fmt.Sprintf("  layout     %s%s, %s per chunk", shapeText(c.Layout), mla, settings.BytesText(c.Layout.Bytes)),
	}
	// A hybrid model: one line per KV group (group 0 is the layout above).
	for g := 1; g < len(c.Groups); g++ {
		lines = append(lines, fmt.Sprintf("  group %-4d %s, %s per chunk", g, shapeText(c.Groups[g]), settings.BytesText(c.Groups[g].Bytes)))
	}
	lines = append(lines,
		fmt.Sprintf("  geometry   block %d, %d layers, hidden %d", c.BlockSize, c.NumLayers, c.HiddenDimSize),
		fmt.Sprintf("  stores     %d (%d failed)   retrieves %d   hit chunks %d", c.Stores, c.StoreFailures, c.Retrieves, c.HitChunks),
		pc.contextMissLine(c.Model, c.WorldSize, pc.width),
		fmt.Sprintf("  bytes      in %s   out %s", settings.BytesText(c.BytesIn), settings.BytesText(c.BytesOut)),
		"  registered "+reg+" · last seen "+ageText(pc.opts.Now(), c.LastRequest),
	)
	live := fmt.Sprintf("  liveness   %s; %d in flight; peer %s", stateText(pc, c), c.InFlight, orDash(c.Peer))
	if !gone(c) {
		live += " · " + st.Key.Render("x") + " removes it"
	}
	lines = append(lines, live)
	return append(lines, pc.contextFigures(c, w)...)
}

// askRemove asks to remove the selected worker context (x): seed-era
// workers are never reaped, so a dead one stays until the operator
// removes it.
func (p *contextsPane) askRemove(rows []workers.ContextInfo) {
	pc := p.pc
	if len(rows) == 0 || p.cur.sel < 0 || p.cur.sel >= len(rows) {
		pc.setStatus(levelInfo, "no worker selected")
		return
	}
	c := rows[p.cur.sel]
	if gone(c) {
		pc.setStatus(levelInfo, fmt.Sprintf("instance %d is already %s", c.InstanceID, c.State))
		return
	}
	pc.ask(question{
		view: func(int) string { return p.confirmRemoveView(c) },
		yes:  func() tea.Cmd { return p.remove(c.InstanceID) },
		no:   "remove cancelled",
	})
}

func (p *contextsPane) confirmRemoveView(c workers.ContextInfo) string {
	st := p.pc.st
	var b strings.Builder
	b.WriteString(st.Warn.Render("REMOVE?") + fmt.Sprintf(" worker instance %d (%s, %s, last seen %s)\n\n",
		c.InstanceID, c.Model, stateText(p.pc, c), ageText(p.pc.opts.Now(), c.LastRequest)))
	b.WriteString("Its context goes and its pending stores are aborted (never published).\n")
	b.WriteString("A live worker gets no answers until it registers again.\n\n")
	b.WriteString("Remove it? " + st.Key.Render("y") + " remove  " + st.Key.Render("n") + " cancel")
	return b.String()
}

// remove asks the engine off the UI goroutine.
func (p *contextsPane) remove(id int64) tea.Cmd {
	eng := p.eng
	return func() tea.Msg {
		return removeMsg{id: id, err: eng.RemoveInstance(id, engine.ClearByDashboard)}
	}
}

// removed says in the header what the engine answered.
func (p *contextsPane) removed(msg removeMsg) {
	if msg.err != nil {
		p.pc.setStatus(levelBad, fmt.Sprintf("REMOVE FAILED: %v", msg.err))
		return
	}
	p.pc.setStatus(levelOK, fmt.Sprintf("instance %d removed", msg.id))
}

// reaperText says whether silent workers are reaped, and after how long.
func reaperText(l workers.Liveness) string {
	if !l.Reaping {
		return "no reaper"
	}
	return "reap after " + durationText(l.Timeout)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
