package dashboard

import (
	"fmt"
	"strings"
	"time"

	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/x/ansi"
)

// durationText prints a duration as "3d04h", "1h02m", "4m05s" or "12s".
func durationText(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	s := int64(d / time.Second)
	days, s := s/86400, s%86400
	h, s := s/3600, s%3600
	m, s := s/60, s%60
	switch {
	case days > 0:
		return fmt.Sprintf("%dd%02dh", days, h)
	case h > 0:
		return fmt.Sprintf("%dh%02dm", h, m)
	case m > 0:
		return fmt.Sprintf("%dm%02ds", m, s)
	}
	return fmt.Sprintf("%ds", s)
}

// coarseDuration is a duration in its largest unit only: "3d", "2h",
// "5m", "12s".
func coarseDuration(d time.Duration) string {
	switch {
	case d >= 24*time.Hour:
		return fmt.Sprintf("%dd", int64(d/(24*time.Hour)))
	case d >= time.Hour:
		return fmt.Sprintf("%dh", int64(d/time.Hour))
	case d >= time.Minute:
		return fmt.Sprintf("%dm", int64(d/time.Minute))
	case d < 0:
		d = 0
	}
	return fmt.Sprintf("%ds", int64(d/time.Second))
}

// ageText is how long ago t was, "-" for the zero time.
func ageText(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return durationText(now.Sub(t)) + " ago"
}

// percent is used/total in percent, 0 when total is not positive.
func percent(used, total float64) float64 {
	if total <= 0 {
		return 0
	}
	p := used / total * 100
	if p < 0 {
		return 0
	}
	return p
}

// bar draws a usage bar of width cells: "[#####.....]". The fill is text,
// so it reads the same without colour.
func bar(s Styles, width int, pct float64) string {
	inner := width - 2
	if inner < 1 {
		return ""
	}
	filled := int(pct / 100 * float64(inner))
	if pct > 0 && filled == 0 {
		filled = 1
	}
	filled = min(filled, inner)
	style := s.BarOK
	switch {
	case pct >= 90:
		style = s.BarBad
	case pct >= 75:
		style = s.BarWarn
	}
	return "[" + style.Render(strings.Repeat("#", filled)) + s.Faint.Render(strings.Repeat(".", inner-filled)) + "]"
}

// fit cuts or pads s to exactly width cells. A cut ends at a space where
// one is in the last third of the line, marked "~": a number or a word is
// dropped whole rather than shown in part ("up 11~" reads as eleven).
func fit(s string, width int) string {
	if width <= 0 {
		return ""
	}
	w := lipgloss.Width(s)
	if w > width {
		if at := lastSpace(ansi.Strip(s), width-2); at >= width*2/3 {
			return ansi.Truncate(s, at+1, "") + "~" + strings.Repeat(" ", width-at-2)
		}
		return ansi.Truncate(s, width, "~")
	}
	return s + strings.Repeat(" ", width-w)
}

// lastSpace is the cell column of the last space of plain at or before
// column limit, -1 when there is none.
func lastSpace(plain string, limit int) int {
	at, col := -1, 0
	for _, r := range plain {
		if col > limit {
			break
		}
		if r == ' ' {
			at = col
		}
		col += ansi.StringWidth(string(r))
	}
	return at
}

// wrapHanging breaks a line wider than width at spaces, the continuation
// lines indented to where the line's text starts after its label (the
// first run of two or more spaces within its first 16 columns: "Transfer  …",
// "  Reads   …"), so a long line of figures reads whole on two lines.
func wrapHanging(s string, width int) []string {
	if width <= 0 || lipgloss.Width(s) <= width {
		return []string{s}
	}
	plain := ansi.Strip(s)
	indent := hangIndent(plain)
	if indent >= width/2 {
		indent = 0
	}
	var out []string
	for lipgloss.Width(s) > width {
		at := lastSpace(ansi.Strip(s), width)
		if at <= indent {
			break // one word wider than the line: fit cuts it
		}
		out = append(out, ansi.Truncate(s, at, ""))
		rest := ansi.TruncateLeft(s, at, "")
		rest = ansi.TruncateLeft(rest, len(ansi.Strip(rest))-len(strings.TrimLeft(ansi.Strip(rest), " ")), "")
		s = strings.Repeat(" ", indent) + rest
	}
	return append(out, s)
}

// hangIndent is the column a line's text starts at after its label (see
// wrapHanging), 0 when it has none.
func hangIndent(plain string) int {
	lead := len(plain) - len(strings.TrimLeft(plain, " "))
	col, spaces := 0, 0
	for _, r := range plain {
		if col >= 16 {
			break
		}
		switch {
		case r == ' ':
			spaces++
		case spaces >= 2 && col-spaces >= lead:
			return col
		default:
			spaces = 0
		}
		col += ansi.StringWidth(string(r))
	}
	return 0
}

// fitLines cuts every line of s to width cells and the block to height
// lines, padding both so panes keep their size.
func fitLines(s string, width, height int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > height {
		lines = lines[:height]
	}
	for len(lines) < height {
		lines = append(lines, "")
	}
	for i, l := range lines {
		lines[i] = fit(l, width)
	}
	return strings.Join(lines, "\n")
}

// trimRight removes trailing spaces of every line (goldens and terminals
// do not care about them; tests compare text).
func trimRight(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	return strings.Join(lines, "\n")
}

// wrapWords wraps s to width cells at spaces only: a word is split only
// when it alone is wider than a line. (ansi.Wrap also breaks after hyphens,
// which cuts model names and flags such as re-register in two.)
func wrapWords(s string, width int) string {
	if width <= 0 {
		return s
	}
	var out []string
	for _, para := range strings.Split(s, "\n") {
		line, lineW := "", 0
		for _, word := range strings.Fields(para) {
			ww := ansi.StringWidth(word)
			for ww > width { // a word longer than a line is cut hard
				if lineW > 0 {
					out = append(out, line)
					line, lineW = "", 0
				}
				out = append(out, ansi.Truncate(word, width, ""))
				word = ansi.TruncateLeft(word, width, "")
				ww = ansi.StringWidth(word)
			}
			switch {
			case ww == 0:
			case lineW == 0:
				line, lineW = word, ww
			case lineW+1+ww <= width:
				line, lineW = line+" "+word, lineW+1+ww
			default:
				out = append(out, line)
				line, lineW = word, ww
			}
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

// midTrunc cuts s to width cells by dropping its middle, so both the
// organisation and the variant of a long model name stay readable
// ("meta-llama/Ll…-70B-Instruct").
func midTrunc(s string, width int) string {
	w := ansi.StringWidth(s)
	if w <= width {
		return s
	}
	if width <= 1 {
		return ansi.Truncate(s, width, "")
	}
	keep := width - 1
	head := (keep + 1) / 2
	return ansi.Truncate(s, head, "") + "…" + ansi.TruncateLeft(s, w-(keep-head), "")
}

// countText prints a count with a decimal suffix ("950", "12.3 k", "4.5 M").
func countText(n float64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1f G", n/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1f M", n/1e6)
	case n >= 1e4:
		return fmt.Sprintf("%.1f k", n/1e3)
	}
	return fmt.Sprintf("%.0f", n)
}
