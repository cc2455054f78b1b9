package dashboard

import (
	"math"
	"strings"
)

// The charts are drawn here, not with a charting library: the maintained
// candidate, NimbleMarkets/ntcharts (v0.4.0, the newest the module proxy
// serves), is built on Bubble Tea v1 and Lip Gloss v1
// (github.com/charmbracelet/...), not on the charm.land v2 modules this
// dashboard uses, and would pull a second TUI stack in. A sparkline and a
// block chart are a few lines of block glyphs.

// sparkLevels are the eight heights of a one-row chart cell.
var sparkLevels = [...]rune{'▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'}

// scaleTop is the value a chart's full height stands for: top when
// positive, else the largest finite value shown (0 when there is none).
func scaleTop(vals []float64, top float64) float64 {
	if top > 0 {
		return top
	}
	for _, v := range vals {
		if !math.IsNaN(v) && !math.IsInf(v, 0) && v > top {
			top = v
		}
	}
	return top
}

// sparkline draws the newest w values of vals, one cell each, oldest on
// the left, scaled to top (see scaleTop). Zero is the lowest bar, any
// positive value at least the second; NaN (no data that second) is a
// blank, and so is the time before the first value.
func sparkline(vals []float64, w int, top float64) string {
	if w <= 0 {
		return ""
	}
	if len(vals) > w {
		vals = vals[len(vals)-w:]
	}
	top = scaleTop(vals, top)
	var b strings.Builder
	b.Grow(3 * w)
	b.WriteString(strings.Repeat(" ", w-len(vals)))
	for _, v := range vals {
		switch {
		case math.IsNaN(v):
			b.WriteByte(' ')
		case v <= 0 || top <= 0:
			b.WriteRune(sparkLevels[0])
		default:
			i := int(math.Ceil(min(v/top, 1) * float64(len(sparkLevels)-1)))
			b.WriteRune(sparkLevels[i])
		}
	}
	return b.String()
}

// blockChart draws the newest w values of vals as columns h rows high with
// an eighth of a row's resolution, oldest on the left, scaled to top (see
// scaleTop). It returns h lines of exactly w cells; NaN and the time before
// the first value are empty columns.
func blockChart(vals []float64, w, h int, top float64) []string {
	if w <= 0 || h <= 0 {
		return nil
	}
	if len(vals) > w {
		vals = vals[len(vals)-w:]
	}
	top = scaleTop(vals, top)
	pad := w - len(vals)
	eighths := make([]int, len(vals))
	for i, v := range vals {
		if math.IsNaN(v) || v <= 0 || top <= 0 {
			continue
		}
		eighths[i] = max(1, int(math.Round(min(v/top, 1)*float64(h*8))))
	}
	lines := make([]string, h)
	for r := range h {
		floor := (h - 1 - r) * 8 // eighths below this row
		var b strings.Builder
		b.WriteString(strings.Repeat(" ", pad))
		for _, e := range eighths {
			switch n := e - floor; {
			case n <= 0:
				b.WriteByte(' ')
			case n >= 8:
				b.WriteRune('█')
			default:
				b.WriteRune(sparkLevels[n-1])
			}
		}
		lines[r] = b.String()
	}
	return lines
}
