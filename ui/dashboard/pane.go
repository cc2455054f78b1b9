package dashboard

import (
	"fmt"
	"math"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
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

// component is a pane as the model sees it: it owns its state and its
// keys, draws itself at the size it was given, and says which keys the
// help bar and the help screen show while it has the keyboard. Everything
// panes share (snapshot, styles, status line, events, questions) is in the
// programContext each holds.
type component interface {
	// SetSize is the room the pane draws in (the screen less header, tabs
	// and help bar).
	SetSize(w, h int)
	// Update takes a key press, or a paste while Typing.
	Update(msg tea.Msg) tea.Cmd
	View() string
	// Typing reports that a text field of the pane has the keyboard: every
	// key but ctrl+c goes to it.
	Typing() bool
	// ShortKeys are the help bar's keys for what has the keyboard in the
	// pane; HelpKeys and HelpNotes are the help screen's groups and words.
	ShortKeys() []key.Binding
	HelpKeys() [][]key.Binding
	HelpNotes(w int) string
	// Leave closes what the pane had open (a prompt, the details, the
	// editor) when another view takes the screen.
	Leave()
}

// sized is the size part of a component and its defaults for a pane with
// no keys of its own.
type sized struct{ w, h int }

func (s *sized) SetSize(w, h int)        { s.w, s.h = w, h }
func (*sized) Update(tea.Msg) tea.Cmd    { return nil }
func (*sized) Typing() bool              { return false }
func (*sized) ShortKeys() []key.Binding  { return nil }
func (*sized) HelpKeys() [][]key.Binding { return nil }
func (*sized) HelpNotes(int) string      { return "" }
func (*sized) Leave()                    {}

// question is a yes/no overlay (apply, remove, quit): it takes the
// keyboard until y or n.
type question struct {
	view func(w int) string
	yes  func() tea.Cmd
	// no is the status line after n ("" leaves the header alone).
	no string
}

// listCursor is a selection in a list that the list keys move, and the
// first row of the window that keeps it in view.
type listCursor struct{ sel int }

// move applies the list keys to a list of n rows, PgUp/PgDn going page
// rows; it reports whether msg was one of them.
func (c *listCursor) move(k listKeys, msg tea.KeyPressMsg, n, page int) bool {
	if !stepKeys(k, msg, &c.sel, page, n-1) {
		return false
	}
	c.clamp(n)
	return true
}

// stepKeys moves pos by the list keys: a row for ↑↓, page rows for
// PgUp/PgDn, to 0 or last for Top and Bottom; the caller clamps. It
// reports whether msg was one of them.
func stepKeys(k listKeys, msg tea.KeyPressMsg, pos *int, page, last int) bool {
	switch {
	case key.Matches(msg, k.Up):
		*pos--
	case key.Matches(msg, k.Down):
		*pos++
	case key.Matches(msg, k.PageUp):
		*pos -= page
	case key.Matches(msg, k.PageDown):
		*pos += page
	case key.Matches(msg, k.Top):
		*pos = 0
	case key.Matches(msg, k.Bottom):
		*pos = last
	default:
		return false
	}
	return true
}

// clamp keeps the selection inside a list of n rows.
func (c *listCursor) clamp(n int) { c.sel = max(0, min(c.sel, n-1)) }

// start is the first row shown when rows rows fit: the selection is the
// last row on screen once it is past the first screen.
func (c listCursor) start(rows int) int {
	if c.sel >= rows {
		return c.sel - rows + 1
	}
	return 0
}

// window is the rows of a list of n that h rows show around the
// selection, from start to end: the caller writes "… k more above" first
// when start > 0 and "… k more below" last when end < n, each taking a
// row of the h.
func (c listCursor) window(n, h int) (start, end int) {
	h = max(h, 3)
	switch {
	case n <= h:
		return 0, n
	case c.sel < h-1:
		return 0, h - 1
	}
	start = c.sel - (h - 2) + 1
	if start+h-1 >= n {
		return n - (h - 1), n
	}
	return start, start + h - 2
}

// listRows is how many rows window's list takes with its "more" rows.
func listRows(start, end, n int) int {
	rows := end - start
	if start > 0 {
		rows++
	}
	if end < n {
		rows++
	}
	return rows
}

// scroller pages a pane whose lines outrun its room: the list keys move
// the first line shown, and the window says what is above and below.
type scroller struct{ top int }

// move applies the list keys to a view h rows high; the window clamps the
// result to the lines there are. It reports whether msg was one of them.
func (s *scroller) move(k listKeys, msg tea.KeyPressMsg, h int) bool {
	if !stepKeys(k, msg, &s.top, max(1, h-2), math.MaxInt32) {
		return false
	}
	s.top = max(0, s.top)
	return true
}

// window is what h rows show of lines from the first line shown: all of
// them when they fit, else a row "… n more above" first when scrolled and
// "… n more below" last when more follow.
func (s *scroller) window(st Styles, lines []string, h int) []string {
	if len(lines) <= h || h < 3 {
		s.top = 0
		return lines[:min(len(lines), max(h, 0))]
	}
	// Scrolled to the end, only the "above" row is taken.
	s.top = min(s.top, len(lines)-(h-1))
	rows := h
	var out []string
	if s.top > 0 {
		out = append(out, st.Faint.Render(fmt.Sprintf("  … %d more above (pgup, g top)", s.top)))
		rows--
	}
	end := s.top + rows
	if end < len(lines) {
		end--
	}
	out = append(out, lines[s.top:end]...)
	if end < len(lines) {
		out = append(out, st.Faint.Render(fmt.Sprintf("  … %d more below (pgdn, G bottom)", len(lines)-end)))
	}
	return out
}

// scrollPane is a pane of text lines that scrolls when they do not fit.
type scrollPane struct {
	sized
	pc       *programContext
	scroll   scroller
	overflow bool // the last view did not fit: the help bar offers the keys
}

func (p *scrollPane) Update(msg tea.Msg) tea.Cmd {
	if kp, ok := msg.(tea.KeyPressMsg); ok {
		p.scroll.move(p.pc.keys.List, kp, p.h)
	}
	return nil
}

func (p *scrollPane) ShortKeys() []key.Binding {
	if !p.overflow {
		return nil
	}
	k := p.pc.keys.List
	return []key.Binding{k.PageDown, k.PageUp, k.Top, k.Bottom}
}

func (p *scrollPane) HelpKeys() [][]key.Binding { return [][]key.Binding{p.pc.keys.List.list()} }

// show is lines as the pane's h rows show them.
func (p *scrollPane) show(lines []string, h int) string {
	// A line wider than the pane goes on under its label rather than
	// losing its last figures to the cut.
	wrapped := make([]string, 0, len(lines))
	for _, l := range lines {
		wrapped = append(wrapped, wrapHanging(l, p.w)...)
	}
	lines = wrapped
	p.overflow = len(lines) > h
	return strings.Join(p.scroll.window(p.pc.st, lines, h), "\n")
}
