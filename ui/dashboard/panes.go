package dashboard

import (
	"cmp"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"

	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/x/ansi"

	"kvdock/core/engine"
	"kvdock/core/layout"
	"kvdock/core/workers"
	"kvdock/settings"
)

// stateStyle tones a state label; the label itself carries the meaning.
func (m *Model) stateStyle(s engine.State) lipgloss.Style {
	switch s {
	case engine.Serving:
		return m.st.OK
	case engine.Starting, engine.Restarting:
		return m.st.Warn
	case engine.Failed:
		return m.st.Bad
	}
	return m.st.Faint
}

func (m *Model) renderHeader(w int) string {
	s := m.snap
	version := s.Version
	if version == "" {
		version = m.opts.Version
	}
	endpoint := s.Endpoint
	if endpoint == "" {
		endpoint = "(not bound)"
	}
	proto := s.Protocol
	if proto == "" {
		proto = m.running.Server.Protocol
	}
	state := m.stateStyle(s.State).Render(strings.ToUpper(s.State.String()))
	// The state comes right after the title: it is what a narrow screen
	// must still show.
	line1 := m.st.Title.Render("kvdock "+version) + "  state: " + state + "  " + endpoint + "  " + proto + "  up " + durationText(s.Uptime)
	// Under --protocol auto, the tables the peers were settled on, when
	// the line has room for them.
	if d := detectionsText(s); d != "" && lipgloss.Width(line1)+2+lipgloss.Width(d) <= w {
		line1 += "  " + d
	}
	if s.Error != "" {
		line1 += "  " + m.st.Bad.Render("error: "+s.Error)
	}

	var line2 string
	switch {
	case m.applying:
		line2 = m.st.Warn.Render("APPLYING") + " " + m.status
	case m.status != "":
		st := m.st.Faint
		switch m.statusLevel {
		case levelOK:
			st = m.st.OK
		case levelWarn:
			st = m.st.Warn
		case levelBad:
			st = m.st.Bad
		}
		// A long result (a rollback and its cause) wraps onto a second line
		// rather than losing the why.
		lines := strings.Split(ansi.Wrap(m.status, w, " "), "\n")
		if len(lines) > 2 {
			lines = lines[:2]
		}
		for i := range lines {
			lines[i] = fit(st.Render(lines[i]), w)
		}
		return fit(line1, w) + "\n" + strings.Join(lines, "\n") + "\n" + fit(m.ratesLine(w), w)
	default:
		line2 = m.summary()
	}
	return fit(line1, w) + "\n" + fit(line2, w) + "\n" + fit(m.ratesLine(w), w)
}

// detectionsText is the peers --protocol auto settled on each table
// ("peers nongpu-v1 2 · rpc-messages 1"), "" under a fixed profile or
// before any peer settled.
func detectionsText(s engine.Snapshot) string {
	if s.Protocol != settings.ProtocolAuto {
		return ""
	}
	var parts []string
	for _, p := range slices.Sorted(maps.Keys(s.Requests.Detections)) {
		if n := s.Requests.Detections[p]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", p, n))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	out := "peers " + strings.Join(parts, " · ")
	if n := s.Requests.AmbiguousDetections; n > 0 {
		out += fmt.Sprintf(" (%d guessed)", n)
	}
	return out
}

// summary is the one-line overview under the title when nothing else is
// to be said.
func (m *Model) summary() string {
	s := m.snap
	shm := "SHM " + s.Shm.ShmName
	if !s.Shm.Shared() {
		shm = "PICKLE (SHM off)"
	}
	pct := percent(float64(s.Pool.UsedBytes), float64(s.Pool.Size))
	workers := fmt.Sprintf("%d worker context(s)", registeredContexts(s.Contexts))
	gpu := "GPU n/a"
	if s.GPU.Available {
		gpu = fmt.Sprintf("%d GPU(s)", len(s.GPU.Devices))
	}
	return fmt.Sprintf("pool %s %.0f%% used · %s · %s", shm, pct, workers, gpu)
}

// ctxColumn is one column of the contexts table. Columns with a lower
// priority number survive narrower screens.
type ctxColumn struct {
	title    string
	width    int
	prio     int
	right    bool
	value    func(m *Model, c workers.ContextInfo) string
	less     func(a, b workers.ContextInfo) int
	sortName string
	key      rune // shift+letter that sorts by this column
	// grow is how much wider the column gets from spare width (before
	// LAYOUT and MODEL); chart, when set, renders the cell at its width.
	grow  int
	chart func(m *Model, c workers.ContextInfo, width int) string
	// lessBy, when set, orders by figures outside ContextInfo.
	lessBy func(m *Model, a, b workers.ContextInfo) int
}

var ctxColumns = []ctxColumn{
	{title: "ID", width: 9, key: 'I', prio: 0, sortName: "id",
		value: func(_ *Model, c workers.ContextInfo) string { return strconv.FormatInt(c.InstanceID, 10) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.InstanceID, b.InstanceID) }},
	{title: "MODEL", width: 12, key: 'N', prio: 2, sortName: "model",
		value: func(_ *Model, c workers.ContextInfo) string { return c.Model },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.Model, b.Model) }},
	{title: "WS", width: 3, key: 'W', prio: 7, right: true, sortName: "world size",
		value: func(_ *Model, c workers.ContextInfo) string { return strconv.Itoa(c.WorldSize) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.WorldSize, b.WorldSize) }},
	{title: "LAYOUT", width: 16, key: 'L', prio: 10, sortName: "layout",
		value: func(_ *Model, c workers.ContextInfo) string { return layoutText(c) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(layoutText(a), layoutText(b)) }},
	{title: "STATE", width: 8, key: 'E', prio: 1, sortName: "state",
		value: func(m *Model, c workers.ContextInfo) string { return stateText(m, c) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(stateRank(a.State), stateRank(b.State)) }},
	{title: "MODE", width: 6, key: 'M', prio: 1, sortName: "mode",
		value: func(_ *Model, c workers.ContextInfo) string { return string(c.Mode) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.Mode, b.Mode) }},
	{title: "STORES", width: 7, key: 'S', prio: 3, right: true, sortName: "stores",
		value: func(_ *Model, c workers.ContextInfo) string { return strconv.FormatInt(c.Stores, 10) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.Stores, b.Stores) }},
	{title: "RETR", width: 7, key: 'R', prio: 4, right: true, sortName: "retrieves",
		value: func(_ *Model, c workers.ContextInfo) string { return strconv.FormatInt(c.Retrieves, 10) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.Retrieves, b.Retrieves) }},
	{title: "HITS", width: 7, key: 'H', prio: 5, right: true, sortName: "hit chunks",
		value: func(_ *Model, c workers.ContextInfo) string { return strconv.FormatInt(c.HitChunks, 10) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.HitChunks, b.HitChunks) }},
	hitColumn,
	{title: "IN", width: 9, key: 'B', prio: 8, right: true, sortName: "bytes in",
		value: func(_ *Model, c workers.ContextInfo) string { return bytesText(c.BytesIn) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.BytesIn, b.BytesIn) }},
	{title: "OUT", width: 9, key: 'O', prio: 9, right: true, sortName: "bytes out",
		value: func(_ *Model, c workers.ContextInfo) string { return bytesText(c.BytesOut) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.BytesOut, b.BytesOut) }},
	{title: "SEEN", width: 7, key: 'T', prio: 6, right: true, sortName: "last seen",
		value: func(m *Model, c workers.ContextInfo) string {
			if c.LastRequest.IsZero() {
				return "-"
			}
			return durationText(m.opts.Now().Sub(c.LastRequest))
		},
		// Most recent first when ascending: "last request" reads as recency.
		less: func(a, b workers.ContextInfo) int { return b.LastRequest.Compare(a.LastRequest) }},
}

// stateText is the STATE column: active, "idle 5m" (silent that long),
// reaped or removed. Words, never colour alone.
func stateText(m *Model, c workers.ContextInfo) string {
	if c.State == workers.StateIdle && !c.LastRequest.IsZero() {
		return "idle " + durationText(m.opts.Now().Sub(c.LastRequest))
	}
	if c.State == "" {
		return string(workers.StateActive)
	}
	return string(c.State)
}

// stateRank orders states from live to gone.
func stateRank(s workers.State) int {
	if i := slices.Index(workers.States(), s); i >= 0 {
		return i
	}
	return 0
}

// gone reports a context that is no longer registered (reaped or removed;
// remembered for the operator).
func gone(c workers.ContextInfo) bool {
	return c.State == workers.StateReaped || c.State == workers.StateRemoved
}

// registeredContexts counts the contexts still registered.
func registeredContexts(cs []workers.ContextInfo) int {
	n := 0
	for _, c := range cs {
		if !gone(c) {
			n++
		}
	}
	return n
}

// layoutText is the context's chunk layout (group 0's for a hybrid model,
// with the count of its other groups).
func layoutText(c workers.ContextInfo) string {
	s := shapeText(c.Layout)
	if n := len(c.Groups); n > 1 {
		s += fmt.Sprintf(" +%dg", n-1) // "+1g": one more KV group (details list them)
	}
	return s
}

func shapeText(l layout.Layout) string {
	dims := make([]string, len(l.Shape))
	for i, d := range l.Shape {
		dims[i] = strconv.Itoa(d)
	}
	s := strings.Join(dims, "x")
	if s == "" {
		s = "?"
	}
	return s + " " + l.Dtype
}

// filterColumn is the column a filter names ("model:llama" names MODEL by
// its title or sort name, or a prefix of one), -1 for plain text (which
// matches ID and MODEL), -2 for a name no column has.
func filterColumn(f string) (col int, value string) {
	name, value, ok := strings.Cut(f, ":")
	name = strings.ToLower(strings.TrimSpace(name))
	switch {
	case !ok:
		return -1, f
	case name == "":
		return -1, value
	}
	for _, exact := range []bool{true, false} {
		for i, c := range ctxColumns {
			t, sn := strings.ToLower(c.title), c.sortName
			if exact && (name == t || name == sn) || !exact && name != "" && (strings.HasPrefix(t, name) || strings.HasPrefix(sn, name)) {
				return i, value
			}
		}
	}
	return -2, value
}

// visibleContexts is the contexts after the filter, in the chosen order.
// The filter matches the chosen column (col:value), else the ID and MODEL
// columns: "4" must not match every row through its layout's dimensions.
func (m *Model) visibleContexts() []workers.ContextInfo {
	fcol, f := filterColumn(m.filterStr)
	f = strings.ToLower(f)
	var out []workers.ContextInfo
	for _, c := range m.snap.Contexts {
		if f != "" || fcol == -2 {
			var hay string
			switch fcol {
			case -2:
				continue
			case -1:
				hay = strconv.FormatInt(c.InstanceID, 10) + "\x00" + c.Model
			default:
				hay = ctxColumns[fcol].value(m, c)
			}
			if !strings.Contains(strings.ToLower(hay), f) {
				continue
			}
		}
		out = append(out, c)
	}
	col := ctxColumns[m.sortCol]
	less := col.less
	if col.lessBy != nil {
		less = func(a, b workers.ContextInfo) int { return col.lessBy(m, a, b) }
	}
	slices.SortStableFunc(out, func(a, b workers.ContextInfo) int {
		r := less(a, b)
		if r == 0 {
			r = cmp.Compare(a.InstanceID, b.InstanceID)
		}
		if m.sortDesc {
			r = -r
		}
		return r
	})
	return out
}

// maxModelWidth caps the MODEL column: a long name is cut in its middle
// rather than given a hundred columns.
const maxModelWidth = 40

// tableColumns picks the columns that fit w, the sort column always (its
// arrow says what orders the table), and spreads the spare width over the
// flexible ones.
func tableColumns(w, sortCol int) []ctxColumn {
	byPrio := slices.Clone(ctxColumns)
	slices.SortStableFunc(byPrio, func(a, b ctxColumn) int { return cmp.Compare(a.prio, b.prio) })
	if sortCol >= 0 && sortCol < len(ctxColumns) {
		// First in line: the others fit around it.
		sc := ctxColumns[sortCol]
		byPrio = slices.DeleteFunc(byPrio, func(c ctxColumn) bool { return c.title == sc.title })
		byPrio = append([]ctxColumn{sc}, byPrio...)
	}
	keep := map[string]bool{}
	used := 2 // selection marker
	for _, c := range byPrio {
		if used+c.width+1 > w && len(keep) > 0 {
			continue
		}
		keep[c.title] = true
		used += c.width + 1
	}
	var cols []ctxColumn
	for _, c := range ctxColumns {
		if keep[c.title] {
			cols = append(cols, c)
		}
	}
	// Charts grow first, LAYOUT to what a layout needs; MODEL takes the rest.
	spare := w - used
	for i := range cols {
		if add := min(spare, cols[i].grow); add > 0 {
			cols[i].width += add
			spare -= add
		}
	}
	for _, title := range []string{"LAYOUT", "MODEL"} {
		for i := range cols {
			if cols[i].title != title || spare <= 0 {
				continue
			}
			add := spare
			if title == "LAYOUT" {
				add = min(add, 28-cols[i].width)
			} else {
				add = min(add, maxModelWidth-cols[i].width)
			}
			cols[i].width += add
			spare -= add
		}
	}
	return cols
}

func cell(c ctxColumn, s string) string {
	if c.title == "MODEL" {
		return fit(midTrunc(s, c.width), c.width)
	}
	if c.right {
		if lipgloss.Width(s) > c.width {
			return fit(s, c.width)
		}
		return strings.Repeat(" ", c.width-lipgloss.Width(s)) + s
	}
	return fit(s, c.width)
}

func (m *Model) renderContexts(w, h int) string {
	var b strings.Builder
	rows := m.visibleContexts()
	col := ctxColumns[m.sortCol]
	order := "ascending"
	if m.sortDesc {
		order = "descending"
	}
	info := fmt.Sprintf("%d of %d context(s) · sort: %s (%s) · %s", len(rows), len(m.snap.Contexts), col.sortName, order, reaperText(m.snap.Liveness))
	if c, _ := filterColumn(m.filterStr); c == -2 {
		info += " · no such column (" + strings.SplitN(m.filterStr, ":", 2)[0] + ")"
	}
	if m.mode == modeFilter {
		info += " · " + m.filter.View()
	} else if m.filterStr != "" {
		info += " · filter: " + strconv.Quote(m.filterStr)
	}
	b.WriteString(info + "\n")

	cols := tableColumns(w, m.sortCol)
	var head []string
	for _, c := range cols {
		t := c.title
		if c.title == col.title {
			t += map[bool]string{false: "^", true: "v"}[m.sortDesc]
		}
		if c.right {
			head = append(head, cell(c, t))
		} else {
			head = append(head, fit(t, c.width))
		}
	}
	b.WriteString(m.st.Header.Render(fit("  "+strings.Join(head, " "), w)) + "\n")

	if len(rows) == 0 {
		switch rb := m.snap.Rebuilt; {
		case len(m.snap.Contexts) == 0 && rb.DroppedContexts > 0:
			text := fmt.Sprintf("a pool rebuild %s dropped %d worker context(s); workers must re-register (restart them, or let them reconnect)",
				ageText(m.opts.Now(), rb.At), rb.DroppedContexts)
			for _, l := range strings.Split(wrapWords(text, w-2), "\n") {
				b.WriteString("  " + m.st.Warn.Render(l) + "\n")
			}
		case len(m.snap.Contexts) == 0:
			b.WriteString(m.st.Faint.Render("  no worker has registered yet") + "\n")
		default:
			b.WriteString(m.st.Faint.Render("  no context matches the filter") + "\n")
		}
		return b.String()
	}

	details := m.mode == modeDetails
	listH := h - 2
	if details {
		listH = max(1, min(len(rows), listH-10))
	}
	if len(rows) > listH {
		listH = max(1, listH-1) // room for "n more below"
	}
	start := 0
	if m.ctxSel >= listH {
		start = m.ctxSel - listH + 1
	}
	for i := start; i < len(rows) && i < start+listH; i++ {
		var cells []string
		for _, c := range cols {
			raw := c.value(m, rows[i])
			if c.chart != nil {
				raw = c.chart(m, rows[i], c.width)
			}
			v := cell(c, raw)
			if c.title == "MODE" && rows[i].Mode == workers.ModePickle {
				v = m.st.Warn.Render(v)
			}
			cells = append(cells, v)
		}
		line := strings.Join(cells, " ")
		if i == m.ctxSel {
			b.WriteString(m.st.Selected.Render(fit("> "+line, w)) + "\n")
		} else {
			b.WriteString("  " + line + "\n")
		}
	}
	if n := len(rows) - start - listH; n > 0 {
		b.WriteString(m.st.Faint.Render(fmt.Sprintf("  … %d more below", n)) + "\n")
	}
	if details {
		b.WriteString(m.renderDetails(rows[min(m.ctxSel, len(rows)-1)], w, h-2-min(len(rows)-start, listH)))
	}
	return b.String()
}

func (m *Model) renderDetails(c workers.ContextInfo, w, h int) string {
	loc := m.opts.Location
	reg := "-"
	if !c.Registered.IsZero() {
		reg = c.Registered.In(loc).Format("2006-01-02 15:04:05") + " (" + ageText(m.opts.Now(), c.Registered) + ")"
	}
	mla := ""
	if c.MLA {
		mla = " (MLA)"
	}
	lines := []string{
		m.st.Title.Render(fmt.Sprintf("Instance %d", c.InstanceID)) + "  " + c.Model + fmt.Sprintf("  world size %d", c.WorldSize),
		"  mode       " + string(c.Mode) + ": " + c.Reason,
		fmt.Sprintf("  layout     %s%s, %s per chunk", shapeText(c.Layout), mla, bytesText(c.Layout.Bytes)),
	}
	// A hybrid model: one line per KV group (group 0 is the layout above).
	for g := 1; g < len(c.Groups); g++ {
		lines = append(lines, fmt.Sprintf("  group %-4d %s, %s per chunk", g, shapeText(c.Groups[g]), bytesText(c.Groups[g].Bytes)))
	}
	lines = append(lines,
		fmt.Sprintf("  geometry   block %d, %d layers, hidden %d", c.BlockSize, c.NumLayers, c.HiddenDimSize),
		fmt.Sprintf("  stores     %d (%d failed)   retrieves %d   hit chunks %d", c.Stores, c.StoreFailures, c.Retrieves, c.HitChunks),
		m.contextMissLine(c.Model, c.WorldSize, m.width),
		fmt.Sprintf("  bytes      in %s   out %s", bytesText(c.BytesIn), bytesText(c.BytesOut)),
		"  registered "+reg+" · last seen "+ageText(m.opts.Now(), c.LastRequest),
	)
	live := fmt.Sprintf("  liveness   %s; %d in flight; peer %s", stateText(m, c), c.InFlight, orDash(c.Peer))
	if !gone(c) {
		live += " · " + m.st.Key.Render("x") + " removes it"
	}
	lines = append(lines, live)
	lines = append(lines, m.contextCharts(c, w, h-1-len(lines))...)
	return "\n" + strings.Join(lines, "\n") + "\n"
}

func (m *Model) renderPool(w, h int) string {
	s := m.snap
	d := s.Pool.Decision
	var lines []string
	if d.Shared && d.Segment != "" {
		lines = append(lines, m.st.Bold.Render("Segment   ")+d.Segment+"  (SHM: workers attach it)")
	} else {
		reason := d.Reason
		if reason == "" {
			reason = s.Shm.Reason
		}
		lines = append(lines, m.st.Bold.Render("Segment   ")+m.st.Warn.Render("anonymous")+" (SHM off: "+reason+")")
	}
	if d.Shared && d.Reason != "" {
		lines = append(lines, "          "+d.Reason)
	}
	adv := "shm_name \"\" pool_size 0 (pickle fallback)"
	if s.Shm.Shared() {
		adv = fmt.Sprintf("shm_name %q pool_size %d", s.Shm.ShmName, s.Shm.PoolSize)
	}
	lines = append(lines, m.st.Bold.Render("Register  ")+"replies "+adv)

	pct := percent(float64(s.Pool.UsedBytes), float64(s.Pool.Size))
	nums := fmt.Sprintf(" %s / %s (%.1f%%)", bytesText(s.Pool.UsedBytes), bytesText(s.Pool.Size), pct)
	barW := max(10, min(50, w-10-lipgloss.Width(nums)))
	lines = append(lines,
		"",
		m.st.Bold.Render("Usage     ")+bar(m.st, barW, pct)+nums,
		fmt.Sprintf("%s%d   %s%d   %s%d",
			m.st.Bold.Render("Objects   "), s.Pool.Objects,
			m.st.Bold.Render("Evictions "), s.Pool.Evictions,
			m.st.Bold.Render("Alloc failures "), s.Pool.AllocFailures),
		fmt.Sprintf("%s%d write, %d read   reads %d hit / %d miss",
			m.st.Bold.Render("Locked    "), s.Pool.WriteLocked, s.Pool.ReadLocked, s.Pool.ReadHits, s.Pool.ReadMisses),
		m.missLine(w),
		m.hostLine(),
		m.hostRAMLine(),
		m.prefaultLine(w),
		"",
		fmt.Sprintf("%s%s, watermark %.2f, ratio %.2f   TTL write %s, read %s",
			m.st.Bold.Render("Eviction  "), s.Pool.Policy, s.Pool.Watermark, s.Pool.Ratio,
			durationText(s.Pool.WriteTTL), durationText(s.Pool.ReadTTL)),
		fmt.Sprintf("%s%d pending writes, %d pending reads, %d no-space, %d rejected, %d fallbacks",
			m.st.Bold.Render("Transfer  "), s.Transfer.PendingWrites, s.Transfer.PendingReads,
			s.Transfer.NoSpace, s.Transfer.Rejected, s.Transfer.Fallbacks),
		"",
	)
	// The what-if headline outranks the history's caption on a short screen.
	hist := m.poolHistory(w)
	if len(hist) == 3 && h-len(lines)-len(hist) < 2 {
		hist = hist[:2]
	}
	lines = append(lines, hist...)
	lines = append(lines, m.whatIfLines(w, h-len(lines))...)
	return strings.Join(lines, "\n")
}

// hostLine is the memory the pool draws on: /dev/shm for a shared
// segment, the host's available memory for a private (SHM off) pool.
func (m *Model) hostLine() string {
	s := m.snap
	if s.Pool.Decision.Shared {
		return m.st.Bold.Render("/dev/shm  ") + bytesText(s.Pool.ShmFree) + " free"
	}
	return m.st.Bold.Render("Host mem  ") + bytesText(s.Pool.HostAvailable) + " available (MemAvailable; SHM off: the pool is private memory)"
}

// prefaultLine shows the background prefault's progress.
func (m *Model) prefaultLine(w int) string {
	p := m.snap.Pool
	label := m.st.Bold.Render("Prefault  ")
	switch {
	case !m.snap.Config.L1.Prefault:
		return label + "off (pages are faulted in by the first writes)"
	case p.Size <= 0:
		return label + "- (no pool)"
	case p.Size > 0 && p.Prefaulted >= p.Size:
		return label + "done, " + bytesText(p.Size) + " resident"
	}
	pct := percent(float64(p.Prefaulted), float64(p.Size))
	nums := fmt.Sprintf(" %s / %s (%.1f%%) in progress", bytesText(p.Prefaulted), bytesText(p.Size), pct)
	barW := max(10, min(50, w-10-lipgloss.Width(nums)))
	return label + bar(m.st, barW, pct) + nums
}

func (m *Model) renderGPU(w, h int) string {
	g := m.snap.GPU
	if !g.Available {
		reason := g.Reason
		if reason == "" {
			reason = "no reading yet"
		}
		// The source's reason already says "NVML unavailable: …" when NVML
		// is the cause; other reasons get the label here.
		reason, _ = strings.CutPrefix(reason, "NVML unavailable: ")
		return m.st.Warn.Render("NVML unavailable") + ": " + reason + "\n\n" + m.hostRAMLine()
	}
	workers := map[int64]bool{}
	for _, c := range m.snap.Contexts {
		workers[c.InstanceID] = true
	}
	var lines []string
	head := "Driver " + g.Driver
	if g.Err != "" {
		head += "  " + m.st.Bad.Render("error: "+g.Err)
	}
	lines = append(lines, head, m.hostRAMLine())
	for _, d := range g.Devices {
		pct := percent(float64(d.MemUsed), float64(d.MemTotal))
		nums := fmt.Sprintf(" %s / %s (%.1f%%)", bytesText(int64(d.MemUsed)), bytesText(int64(d.MemTotal)), pct)
		util := "util n/a"
		if d.Util >= 0 {
			util = fmt.Sprintf("util %d%%", d.Util)
		}
		title := fmt.Sprintf("GPU %d %s", d.Index, d.Name)
		barW := max(10, min(40, w-lipgloss.Width(title)-lipgloss.Width(nums)-len(util)-4))
		lines = append(lines, "", m.st.Bold.Render(title)+" "+bar(m.st, barW, pct)+nums+"  "+util)
		if len(d.Processes) == 0 {
			lines = append(lines, m.st.Faint.Render("  no processes"))
			continue
		}
		lines = append(lines, m.st.Header.Render(fmt.Sprintf("  %-9s %10s  %-4s %s", "PID", "MEMORY", "KIND", "KVDOCK")))
		for _, p := range d.Processes {
			mem := "n/a"
			if p.MemKnown {
				mem = bytesText(int64(p.MemUsed))
			}
			mark := ""
			if workers[int64(p.PID)] {
				mark = m.st.OK.Render("worker") + " (registered instance)"
			}
			lines = append(lines, fmt.Sprintf("  %-9d %10s  %-4s %s", p.PID, mem, p.Kind, mark))
		}
	}
	if len(lines) > h {
		lines = append(lines[:h-1], m.st.Faint.Render(fmt.Sprintf("  … %d more lines (enlarge the terminal)", len(lines)-h+1)))
	}
	return strings.Join(lines, "\n")
}

func (m *Model) renderEvents(w, h int) string {
	// Request latency heads the pane: what the workers feel, above what
	// the server did.
	head := m.latencyBlock(w, h)
	h = max(1, h-len(head))
	if len(m.events) == 0 {
		return strings.Join(append(head, m.st.Faint.Render("no events yet")), "\n")
	}
	evs := m.visibleEvents()
	if m.mode == modeEvFilter || m.evFilterStr != "" || m.evLevel > slog.LevelDebug {
		info := fmt.Sprintf("%d of %d event(s) · level: %s", len(evs), len(m.events), levelText(m.evLevel))
		if m.mode == modeEvFilter {
			info += " · " + m.evFilter.View()
		} else if m.evFilterStr != "" {
			info += " · filter: " + strconv.Quote(m.evFilterStr)
		}
		head = append(head, fit(info, w))
		h = max(1, h-1)
	}
	if len(evs) == 0 {
		return strings.Join(append(head, m.st.Faint.Render("no event matches the filter")), "\n")
	}
	scroll := min(m.evScroll, len(evs)-1)
	end := len(evs) - scroll
	if scroll > 0 {
		h = max(1, h-1) // room for "n more below"
	}
	start := max(0, end-h)
	var lines []string
	for _, ev := range evs[start:end] {
		lv := strings.ToUpper(ev.Level.String())
		st := lipgloss.NewStyle()
		switch {
		case ev.Level >= 8: // slog.LevelError
			st = m.st.Bad
		case ev.Level >= 4: // slog.LevelWarn
			st = m.st.Warn
		}
		prefix := fmt.Sprintf("%s %s %-10s ", ev.Time.In(m.opts.Location).Format("15:04:05"), st.Render(fmt.Sprintf("%-5s", lv)), ev.Kind)
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
	if len(lines) > h {
		lines = lines[len(lines)-h:]
	}
	if scroll > 0 {
		lines = append(lines, m.st.Faint.Render(fmt.Sprintf("  … %d newer event(s) below", scroll)))
	}
	return strings.Join(append(head, lines...), "\n")
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

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// reaperText says whether silent workers are reaped, and after how long.
func reaperText(l workers.Liveness) string {
	if !l.Reaping {
		return "no reaper"
	}
	return "reap after " + durationText(l.Timeout)
}
