package dashboard

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"charm.land/lipgloss/v2"

	"kvdock/core/layout"
	"kvdock/core/workers"
	"kvdock/settings"
)

// ctxColumn is one column of the contexts table. Columns with a lower
// priority number survive narrower screens.
type ctxColumn struct {
	title    string
	width    int
	prio     int
	right    bool
	value    func(pc *programContext, c workers.ContextInfo) string
	less     func(a, b workers.ContextInfo) int
	sortName string
	key      rune // shift+letter that sorts by this column
	// grow is how much wider the column gets from spare width (before
	// LAYOUT and MODEL); chart, when set, renders the cell at its width.
	grow  int
	chart func(pc *programContext, c workers.ContextInfo, width int) string
	// lessBy, when set, orders by figures outside ContextInfo.
	lessBy func(pc *programContext, a, b workers.ContextInfo) int
}

var ctxColumns = []ctxColumn{
	{title: "ID", width: 9, key: 'I', prio: 0, sortName: "id",
		value: func(_ *programContext, c workers.ContextInfo) string { return strconv.FormatInt(c.InstanceID, 10) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.InstanceID, b.InstanceID) }},
	{title: "MODEL", width: 12, key: 'N', prio: 2, sortName: "model",
		value: func(_ *programContext, c workers.ContextInfo) string { return c.Model },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.Model, b.Model) }},
	{title: "WS", width: 3, key: 'W', prio: 7, right: true, sortName: "world size",
		value: func(_ *programContext, c workers.ContextInfo) string { return strconv.Itoa(c.WorldSize) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.WorldSize, b.WorldSize) }},
	{title: "LAYOUT", width: 16, key: 'L', prio: 10, sortName: "layout",
		value: func(_ *programContext, c workers.ContextInfo) string { return layoutText(c) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(layoutText(a), layoutText(b)) }},
	{title: "STATE", width: 8, key: 'E', prio: 1, sortName: "state",
		value: func(pc *programContext, c workers.ContextInfo) string { return stateText(pc, c) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(stateRank(a.State), stateRank(b.State)) }},
	{title: "MODE", width: 6, key: 'M', prio: 1, sortName: "mode",
		value: func(_ *programContext, c workers.ContextInfo) string { return string(c.Mode) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.Mode, b.Mode) }},
	{title: "STORES", width: 7, key: 'S', prio: 3, right: true, sortName: "stores",
		value: func(_ *programContext, c workers.ContextInfo) string { return strconv.FormatInt(c.Stores, 10) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.Stores, b.Stores) }},
	{title: "RETR", width: 7, key: 'R', prio: 4, right: true, sortName: "retrieves",
		value: func(_ *programContext, c workers.ContextInfo) string { return strconv.FormatInt(c.Retrieves, 10) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.Retrieves, b.Retrieves) }},
	{title: "HITS", width: 7, key: 'H', prio: 5, right: true, sortName: "hit chunks",
		value: func(_ *programContext, c workers.ContextInfo) string { return strconv.FormatInt(c.HitChunks, 10) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.HitChunks, b.HitChunks) }},
	hitColumn,
	{title: "IN", width: 9, key: 'B', prio: 8, right: true, sortName: "bytes in",
		value: func(_ *programContext, c workers.ContextInfo) string { return settings.BytesText(c.BytesIn) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.BytesIn, b.BytesIn) }},
	{title: "OUT", width: 9, key: 'O', prio: 9, right: true, sortName: "bytes out",
		value: func(_ *programContext, c workers.ContextInfo) string { return settings.BytesText(c.BytesOut) },
		less:  func(a, b workers.ContextInfo) int { return cmp.Compare(a.BytesOut, b.BytesOut) }},
	{title: "SEEN", width: 7, key: 'T', prio: 6, right: true, sortName: "last seen",
		value: func(pc *programContext, c workers.ContextInfo) string {
			if c.LastRequest.IsZero() {
				return "-"
			}
			return durationText(pc.opts.Now().Sub(c.LastRequest))
		},
		// Most recent first when ascending: "last request" reads as recency.
		less: func(a, b workers.ContextInfo) int { return b.LastRequest.Compare(a.LastRequest) }},
}

// stateText is the STATE column: active, "idle 5m" (silent that long),
// reaped or removed. Words, never colour alone.
func stateText(pc *programContext, c workers.ContextInfo) string {
	if c.State == workers.StateIdle && !c.LastRequest.IsZero() {
		// Whole units only: the column is 8 wide and "idle 5m03s" is not.
		return "idle " + coarseDuration(pc.opts.Now().Sub(c.LastRequest))
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
