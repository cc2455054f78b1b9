package dashboard

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"charm.land/lipgloss/v2"

	"kvdock/core/series"
)

// latencyRow is one request kind's last minute: requests per second, the
// p50 of its seconds (weighted by their requests), the p99 of its worst
// second, and the p99 of each second (NaN for a second without requests).
type latencyRow struct {
	name           string
	rate, p50, p99 float64
	p99s           []float64
}

// latencyRows are the request kinds seen in the last minute, busiest first.
func (pc *programContext) latencyRows() []latencyRow {
	var rows []latencyRow
	for name, l := range pc.snap.Rates.Latency {
		rate := l.Rate.Mean(minuteSeconds)
		if !(rate > 0) { // NaN too
			continue
		}
		r := latencyRow{name: name, rate: rate}
		rs, p50, p99 := lastN(l.Rate.Fine), lastN(l.P50.Fine), lastN(l.P99.Fine)
		n := min(len(rs), len(p50), len(p99))
		rs, p50, p99 = rs[len(rs)-n:], p50[len(p50)-n:], p99[len(p99)-n:]
		var weight float64
		for i := range n {
			if rs[i] > 0 {
				r.p50 += rs[i] * p50[i]
				weight += rs[i]
				r.p99 = max(r.p99, p99[i])
			}
		}
		if weight > 0 {
			r.p50 /= weight
		}
		// The chart's history: every point the snapshot holds.
		all, q := l.Rate.Fine, l.P99.Fine
		k := min(len(all), len(q))
		all, q = all[len(all)-k:], q[len(q)-k:]
		r.p99s = make([]float64, k)
		for i := range k {
			r.p99s[i] = math.NaN()
			if all[i] > 0 {
				r.p99s[i] = q[i]
			}
		}
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b latencyRow) int {
		if c := cmp.Compare(b.rate, a.rate); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	})
	return rows
}

// lastN is the last minute of v.
func lastN(v []float64) []float64 { return v[max(0, len(v)-minuteSeconds):] }

// latText prints a latency in seconds with a unit that keeps 2-3 digits.
func latText(s float64) string {
	switch {
	case s <= 0:
		return "-"
	case s < 1e-3:
		return fmt.Sprintf("%.0f µs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.1f ms", s*1e3)
	}
	return fmt.Sprintf("%.2f s", s)
}

// latencyBlock is the Events pane's head: request latency per kind over the
// last minute, at most a third of h rows of kinds, with a sparkline of each
// second's p99 where the width has room for one of at least 10 cells;
// then a blank line.
func (pc *programContext) latencyBlock(w, h int) []string {
	rows := pc.latencyRows()
	if len(rows) == 0 {
		return []string{pc.st.Bold.Render("Latency   ") + pc.st.Faint.Render("no requests in the last minute"), ""}
	}
	const nameHead = "REQUEST, LAST MIN"
	nameW := len(nameHead)
	for _, r := range rows {
		nameW = max(nameW, lipgloss.Width(r.name))
	}
	const numW = 8
	// Names and numbers first, the chart in what is left: a long kind name
	// (REGISTER_KV_CACHE_NON_GPU_CONTEXT) is cut only where the numbers
	// would not fit beside it.
	nameW = min(nameW, 40, max(len(nameHead), w-3*(numW+1)))
	nums := func(name, rate, p50, p99 string) string {
		return fit(name, nameW) + fmt.Sprintf(" %*s %*s %*s", numW, rate, numW, p50, numW, p99)
	}
	head := nums(nameHead, "REQ/S", "P50 AVG", "P99 MAX")
	sparkW := min(w-len(head)-3, series.FineLen)
	hist := 0
	for _, r := range rows {
		hist = max(hist, len(r.p99s))
	}
	sparkW = min(sparkW, hist)
	title := head
	if sparkW >= 10 {
		title = head + "   P99 EACH SECOND · last " + durationText(time.Duration(sparkW)*series.FineStep)
	}
	out := []string{pc.st.Header.Render(fit(title, w))}
	show := min(len(rows), max(1, (h-4)/3))
	if show < len(rows) {
		show = max(1, show-1) // the last row says what is left out
	}
	for _, r := range rows[:show] {
		line := nums(r.name, reqRateText(r.rate), latText(r.p50), latText(r.p99))
		if sparkW >= 10 {
			line += "   " + sparkline(r.p99s, sparkW, 0)
		}
		out = append(out, fit(line, w))
	}
	if left := rows[show:]; len(left) > 0 {
		names := make([]string, len(left))
		for i, r := range left {
			names[i] = r.name
		}
		out = append(out, fit(pc.st.Faint.Render(fmt.Sprintf("+%d more: %s", len(left), strings.Join(names, ", "))), w))
	}
	return append(out, "")
}

// reqRateText prints requests per second with a precision that suits its size.
func reqRateText(r float64) string {
	switch {
	case r >= 100:
		return fmt.Sprintf("%.0f", r)
	case r >= 10:
		return fmt.Sprintf("%.1f", r)
	}
	return fmt.Sprintf("%.2f", r)
}
