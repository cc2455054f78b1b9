package dashboard

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/charmbracelet/x/ansi"

	"kvdock/core/engine"
	"kvdock/core/l1"
	"kvdock/core/whatif"
	"kvdock/settings"
)

// whatIfChartRows is the height of the what-if chart: a blank line, the
// headline, the values, the bars, the size labels and the caption.
const (
	whatIfBarRows   = 4
	whatIfChartRows = 1 + 1 + 1 + whatIfBarRows + 1 + 1
	whatIfColW      = 6
)

// whatIfLines is the what-if pool size estimate in at most rows lines of
// width w: a bar chart of hit ratio over pool size, the current size
// marked, when there is room; else the headline alone.
func (pc *programContext) whatIfLines(w, rows int) []string {
	if rows < 1 {
		return nil
	}
	c := pc.snap.WhatIf
	label := pc.st.Bold.Render("What-if   ")
	if len(c.Points) == 0 {
		none := label + "no lookups seen yet: the estimate for other pool sizes starts with traffic"
		if rows < 2 {
			return []string{none}
		}
		return []string{"", none}
	}
	pts := whatIfPoints(c, pc.snap.Pool.Policy)
	text := whatIfHeadline(pts) + whatIfPolicyText(c, pc.snap.Pool.Policy)
	if s := pc.snap; !s.Stats.WhatIfStart(s.Rebuilt.At).IsZero() {
		text += pc.st.Faint.Render("  · last " + engine.WindowLabel(s.Stats.WhatIfStart(s.Rebuilt.At), s.Taken))
	}
	if pc.snap.Pool.Policy == l1.PolicyNoop {
		text += pc.st.Warn.Render("  (sizes modelled with LRU eviction; this pool's policy is noop)")
	}
	// Wrapped between words under its label, never cut inside one.
	head := labelled(label, text, w)
	if rows < 2 {
		return head[:1]
	}
	if rows < whatIfChartRows || w < 12+whatIfColW*len(pts) {
		return append([]string{""}, head...)
	}
	lines := append([]string{""}, head...)
	vals := "       "
	for _, p := range pts {
		vals += fmt.Sprintf("%*s ", whatIfColW-1, fmt.Sprintf("%.0f%%", p.HitRatio*100))
	}
	lines = append(lines, vals)
	for r := whatIfBarRows - 1; r >= 0; r-- {
		axis := "      │"
		switch r {
		case whatIfBarRows - 1:
			axis = " 100% ┤"
		case 0:
			axis = "   0% ┼"
		}
		row := axis
		for _, p := range pts {
			row += " " + strings.Repeat(barGlyph(p.HitRatio*whatIfBarRows-float64(r)), whatIfColW-2) + " "
		}
		lines = append(lines, strings.TrimRight(row, " "))
	}
	sizes := "       "
	for _, p := range pts {
		f := factorText(p.Factor)
		if p.Factor == 1 {
			f = "[1×]"
		}
		sizes += fmt.Sprintf("%*s ", whatIfColW-1, f)
	}
	lines = append(lines, sizes+" × pool ("+settings.BytesText(pc.snap.Pool.Size)+" now)")
	caption := fmt.Sprintf("estimate from %s of keys sampled (SHARDS), %d sampled lookups; measured on those samples over the same window: %s (the header's hit is every lookup's, last minute)",
		sampleRateText(c.SampleRate), c.Sampled, ratioPctText(c.Measured))
	for _, l := range strings.Split(ansi.Wrap(caption, max(20, w-7), " "), "\n") {
		lines = append(lines, pc.st.Faint.Render("       "+strings.TrimLeft(l, " ")))
	}
	return lines
}

// labelled is text after a label of labelW columns, wrapped between words
// to width w with the lines after the first under the text.
func labelled(label, text string, w int) []string {
	const labelW = 10
	body := strings.Split(ansi.Wrap(text, max(20, w-labelW), " "), "\n")
	out := []string{label + body[0]}
	for _, l := range body[1:] {
		out = append(out, strings.Repeat(" ", labelW)+strings.TrimLeft(l, " "))
	}
	return out
}

// whatIfPoints are the estimates for the pool's eviction policy: the
// prefix curve for a prefix pool, the LRU curve for the others (and for a
// prefix pool when the curve has no prefix points).
func whatIfPoints(c whatif.Curve, policy string) []whatif.Point {
	if policy == l1.PolicyPrefix && len(c.Prefix) == len(c.Points) {
		return c.Prefix
	}
	return c.Points
}

// whatIfHeadline says what doubling and halving the pool would change.
func whatIfHeadline(pts []whatif.Point) string {
	at := pointsAt(pts)
	now := at[1]
	return fmt.Sprintf("2× pool: hit ratio %s → %s   ½× pool: %s → %s",
		ratioPctText(now), ratioPctText(at[2]), ratioPctText(now), ratioPctText(at[0.5]))
}

// whatIfPolicyText names the eviction policy the headline's estimate is
// for, and what the other policy would hit at this size when the two
// differ ("" when the curve has one policy's points only, or for a noop
// pool, which the headline warns about).
func whatIfPolicyText(c whatif.Curve, policy string) string {
	if len(c.Prefix) != len(c.Points) || policy == l1.PolicyNoop {
		return ""
	}
	lru, prefix := ratioPctText(pointsAt(c.Points)[1]), ratioPctText(pointsAt(c.Prefix)[1])
	switch {
	case policy == l1.PolicyPrefix && lru != prefix:
		return "   prefix eviction; with LRU at this size: " + prefix + " → " + lru
	case policy == l1.PolicyPrefix:
		return "   prefix eviction"
	case lru != prefix:
		return "   LRU eviction; prefix-aware at this size: " + lru + " → " + prefix
	}
	return "   LRU eviction"
}

// pointsAt is pts' hit ratios by factor.
func pointsAt(pts []whatif.Point) map[float64]float64 {
	at := make(map[float64]float64, len(pts))
	for _, p := range pts {
		at[p.Factor] = p.HitRatio
	}
	return at
}

// barGlyph is one cell of a vertical bar filled to f of its height (0..1,
// clamped), in eighths.
func barGlyph(f float64) string {
	const glyphs = " ▁▂▃▄▅▆▇█"
	n := int(f*8 + 0.5)
	n = min(max(n, 0), 8)
	return string([]rune(glyphs)[n])
}

// ratioPctText is a ratio as a whole percentage ("41 %").
func ratioPctText(r float64) string { return fmt.Sprintf("%.0f %%", r*100) }

// factorText is a pool size factor as a short label (".25", "1.5", "4").
func factorText(f float64) string {
	s := strconv.FormatFloat(f, 'g', -1, 64)
	return strings.TrimPrefix(s, "0")
}

// sampleRateText is a sampling rate as a percentage with sensible precision.
func sampleRateText(r float64) string {
	if r >= 0.1 {
		return fmt.Sprintf("%.0f %%", r*100)
	}
	return fmt.Sprintf("%.2g %%", r*100)
}
