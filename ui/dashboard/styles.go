package dashboard

import (
	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/colorprofile"
)

// Styles is every style the dashboard uses, defined in one place. Colours
// are ANSI palette entries so the terminal's theme applies; every state
// also has a text label, so nothing is told by colour alone.
type Styles struct {
	Title    lipgloss.Style
	Faint    lipgloss.Style
	Bold     lipgloss.Style
	Tab      lipgloss.Style
	TabOn    lipgloss.Style
	Selected lipgloss.Style
	Header   lipgloss.Style // table column headings
	OK       lipgloss.Style
	Warn     lipgloss.Style
	Bad      lipgloss.Style
	Key      lipgloss.Style // a key in the help bar
	BarOK    lipgloss.Style
	BarWarn  lipgloss.Style
	BarBad   lipgloss.Style
	Changed  lipgloss.Style // a pending (unapplied) setting
}

// NewStyles builds the styles for a colour profile: no colours at ASCII and
// below, no attributes at all for NoTTY.
func NewStyles(p colorprofile.Profile) Styles {
	plain := lipgloss.NewStyle()
	if p == colorprofile.NoTTY {
		return Styles{
			Title: plain, Faint: plain, Bold: plain, Tab: plain, TabOn: plain, Selected: plain,
			Header: plain, OK: plain, Warn: plain, Bad: plain, Key: plain,
			BarOK: plain, BarWarn: plain, BarBad: plain, Changed: plain,
		}
	}
	s := Styles{
		Title:    plain.Bold(true),
		Faint:    plain.Faint(true),
		Bold:     plain.Bold(true),
		Tab:      plain,
		TabOn:    plain.Bold(true).Reverse(true),
		Selected: plain.Reverse(true),
		Header:   plain.Bold(true).Underline(true),
		OK:       plain.Bold(true),
		Warn:     plain.Bold(true),
		Bad:      plain.Bold(true),
		Key:      plain.Bold(true),
		BarOK:    plain,
		BarWarn:  plain,
		BarBad:   plain.Bold(true),
		Changed:  plain.Bold(true),
	}
	if p <= colorprofile.ASCII {
		return s
	}
	green, yellow, red, cyan, grey := lipgloss.ANSIColor(2), lipgloss.ANSIColor(3), lipgloss.ANSIColor(1), lipgloss.ANSIColor(6), lipgloss.ANSIColor(8)
	s.Title = s.Title.Foreground(cyan)
	s.Faint = s.Faint.Foreground(grey)
	s.OK = s.OK.Foreground(green)
	s.Warn = s.Warn.Foreground(yellow)
	s.Bad = s.Bad.Foreground(red)
	s.Key = s.Key.Foreground(cyan)
	s.BarOK = s.BarOK.Foreground(green)
	s.BarWarn = s.BarWarn.Foreground(yellow)
	s.BarBad = s.BarBad.Foreground(red)
	s.Changed = s.Changed.Foreground(yellow)
	return s
}
