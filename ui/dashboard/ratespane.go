package dashboard

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"charm.land/lipgloss/v2"

	"kvdock/core/engine"
	"kvdock/core/series"
	"kvdock/core/workers"
	"kvdock/settings"
)

// minuteSeconds is the window the headline figures average over.
const minuteSeconds = 60

// rateText prints bytes per second in the binary units sizes use
// ("572 MiB/s", "1.4 GiB/s"), so a rate and the size beside it read in one
// system.
func rateText(bps float64) string {
	return settings.BytesText(int64(max(bps, 0))) + "/s"
}

// ratioText prints a hit ratio, "-" when nothing was asked.
func ratioText(r float64, ok bool) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*r)
}

// figure is one number of a rates line and the series its sparkline draws.
type figure struct {
	text string
	vals []float64
	top  float64 // scale; 0 = the largest value shown
}

// figuresLine is the first of heads (the same words, longest first) with
// room for the most figures, then the figures, dropping figures from the
// end when their numbers do not fit w, then giving each figure in turn a
// sparkline of up to maxSpark cells while the spare width allows one of at
// least 5: numbers first, charts where there is room.
func figuresLine(heads []string, figs []figure, w, maxSpark int) string {
	const sep = " · "
	head, used, n := "", 0, -1
	for _, h := range heads {
		hu, hn := lipgloss.Width(h), 0
		for _, f := range figs {
			fw := lipgloss.Width(sep) + lipgloss.Width(f.text)
			if hu+fw > w {
				break
			}
			hu += fw
			hn++
		}
		if hn > n {
			head, used, n = h, hu, hn
		}
	}
	var b strings.Builder
	b.WriteString(head)
	spare := w - used
	for _, f := range figs[:n] {
		b.WriteString(sep + f.text)
		if sw := min(maxSpark, spare-1); sw >= 5 {
			b.WriteString(" " + sparkline(f.vals, sw, f.top))
			spare -= sw + 1
		}
	}
	return b.String()
}

// ratesLine is the header's third line: tokens saved in the last hour (the
// headline, shorter on a narrow screen), then the server's hit ratio and store/retrieve bandwidth over
// the last minute with their recent history.
func (pc *programContext) ratesLine(w int) string {
	r := pc.snap.Rates.Server
	tokens := pc.st.Bold.Render(countText(r.TokensSavedHour) + " tokens")
	// The short wording where the long one would cost a figure.
	heads := []string{tokens + " not recomputed in the last hour", tokens + " saved in 1 h"}
	if what, label := pc.statsBegan(); what != "" {
		heads = []string{tokens + " not recomputed since " + what + " (" + label + ")", tokens + " saved in " + label}
	}
	// The screen's headline hit ratio and the bandwidths, all over one
	// window and said to be its averages: a short burst (a bench run)
	// shows in the sparklines, not in the figures.
	hit, ok := series.SumRatio(r.HitChunks.Fine, r.AskedChunks.Fine, minuteSeconds)
	figs := []figure{
		{text: pc.minuteLabel() + " avg: hit " + ratioText(hit, ok), vals: series.Ratio(r.HitChunks.Fine, r.AskedChunks.Fine), top: 1},
		{text: "in " + rateText(r.StoreBytes.Mean(minuteSeconds)), vals: r.StoreBytes.Fine},
		{text: "out " + rateText(r.RetrieveBytes.Mean(minuteSeconds)), vals: r.RetrieveBytes.Fine},
	}
	return figuresLine(heads, figs, w, max(10, (w-70)/3))
}

// statsBegan names when the figures began, less than an hour ago ("the
// start" of a server that carried nothing over, or "the reset") and how
// long ago; "" when they span the last hour (engine.StatsRule: a restart
// that hands its record over, like a rebuild, does not start them again).
func (pc *programContext) statsBegan() (what, label string) {
	s := pc.snap
	since := s.Stats.Since
	if since.IsZero() || s.Taken.Sub(since) >= time.Hour {
		return "", ""
	}
	what = "the start"
	if !s.Stats.ResetAt.IsZero() && !s.Stats.ResetAt.Before(since) {
		what = "the reset"
	}
	return what, engine.WindowLabel(since, s.Taken)
}

// minuteLabel is the window of a last-minute figure: "1 min", or less
// right after a start or a reset of the statistics.
func (pc *programContext) minuteLabel() string {
	now := pc.snap.Taken
	from := now.Add(-minuteSeconds * time.Second)
	if pc.snap.Stats.Since.After(from) {
		from = pc.snap.Stats.Since
	}
	return engine.WindowLabel(from, now)
}

// ctxHitRatio is a context's hit ratio over the last minute (of its worker
// group's lookups) and the per-second series.
func (pc *programContext) ctxHitRatio(c workers.ContextInfo) (ratio float64, ok bool, vals []float64) {
	r, found := pc.snap.Rates.Contexts[c.InstanceID]
	if !found {
		return 0, false, nil
	}
	ratio, ok = series.SumRatio(r.HitChunks.Fine, r.AskedChunks.Fine, minuteSeconds)
	return ratio, ok, series.Ratio(r.HitChunks.Fine, r.AskedChunks.Fine)
}

// hitColumn is the contexts table's hit ratio: the last minute's figure
// and, when the column has room, its sparkline.
var hitColumn = ctxColumn{
	title: "HIT%", width: 4, key: 'P', prio: 3, right: true, sortName: "hit ratio", grow: 13,
	value: func(pc *programContext, c workers.ContextInfo) string {
		r, ok, _ := pc.ctxHitRatio(c)
		return ratioText(r, ok)
	},
	chart: func(pc *programContext, c workers.ContextInfo, w int) string {
		r, ok, vals := pc.ctxHitRatio(c)
		num := ratioText(r, ok)
		if sw := w - 5; sw >= 5 {
			return sparkline(vals, sw, 1) + " " + fmt.Sprintf("%4s", num)
		}
		return num
	},
	lessBy: func(pc *programContext, a, b workers.ContextInfo) int {
		ra, oka, _ := pc.ctxHitRatio(a)
		rb, okb, _ := pc.ctxHitRatio(b)
		if !oka {
			ra = -1
		}
		if !okb {
			rb = -1
		}
		return cmp.Compare(ra, rb)
	},
}

// poolHistory is the Pool pane's history: usage and evictions over the
// last minutes (as much as the width shows, one column a second), or the
// last minute's numbers when there is no room for a chart.
func (pc *programContext) poolHistory(w int) []string {
	r := pc.snap.Rates.Server
	label := pc.st.Bold
	used, size := r.PoolUsed.Last(), float64(pc.snap.Pool.Size)
	usedText := fmt.Sprintf("%.0f%% now", percent(used, size))
	evText := fmt.Sprintf("%.1f/s last min", r.Evictions.Mean(minuteSeconds))
	chartW := min(w-10-1-len(evText), series.FineLen)
	if chartW < 10 {
		return []string{label.Render("History   ") + "used " + usedText + ", evictions " + evText}
	}
	span := durationText(time.Duration(min(len(r.PoolUsed.Fine), chartW)) * series.FineStep)
	return []string{
		label.Render("Used      ") + sparkline(r.PoolUsed.Fine, chartW, size) + " " + usedText,
		label.Render("Evicted   ") + sparkline(r.Evictions.Fine, chartW, 0) + " " + evText,
		pc.st.Faint.Render("          last " + span + ", a column a second; used to pool size, evicted to peak"),
	}
}

// contextSpecs are the details view's charts of one context: its group's
// hit ratio and lookups, its own store and retrieve bandwidth; ok is false
// before it has rates.
func (pc *programContext) contextSpecs(c workers.ContextInfo) (specs []chartSpec, r engine.ContextRates, ok bool) {
	r, ok = pc.snap.Rates.Contexts[c.InstanceID]
	if !ok {
		return nil, r, false
	}
	hit, hitOK := series.SumRatio(r.HitChunks.Fine, r.AskedChunks.Fine, minuteSeconds)
	count := func(v float64) string { return fmt.Sprintf("%.1f/s", v) }
	return []chartSpec{
		{"hit ratio (model)", "hit", ratioText(hit, hitOK), series.Ratio(r.HitChunks.Fine, r.AskedChunks.Fine), 1, func(float64) string { return "100%" }},
		{"lookups (model)", "lookups", count(r.Lookups.Mean(minuteSeconds)), r.Lookups.Fine, 0, count},
		{"store", "store", rateText(r.StoreBytes.Mean(minuteSeconds)), r.StoreBytes.Fine, 0, rateText},
		{"retrieve", "retrieve", rateText(r.RetrieveBytes.Mean(minuteSeconds)), r.RetrieveBytes.Fine, 0, rateText},
	}, r, true
}

// contextFigures are the details view's headline numbers of one context:
// the last minute's figure of each chart and the tokens saved. They always
// show; the charts take the room left under them.
func (pc *programContext) contextFigures(c workers.ContextInfo, w int) []string {
	specs, r, ok := pc.contextSpecs(c)
	if !ok {
		return []string{pc.st.Faint.Render("  no rates yet: they start with its first store, retrieve or lookup of its model")}
	}
	// The lookups name a model, not an instance: the hit ratio and the
	// lookups are the model's (all its instances), the bandwidths this
	// instance's own; each group says whose it is, on one line when it fits.
	group := func(specs []chartSpec) string {
		var parts []string
		for _, s := range specs {
			parts = append(parts, s.short+" "+s.now)
		}
		return strings.Join(parts, " · ")
	}
	model, own := "model: "+group(specs[:2]), "this instance: "+group(specs[2:])
	lines := []string{"  last minute, " + model + " · " + own}
	if lipgloss.Width(lines[0]) > w {
		lines = []string{"  last minute, " + model, "  last minute, " + own}
	}
	return append(lines, fmt.Sprintf("  tokens saved %s (last hour %s, its model's lookup hits × chunk size)",
		countText(float64(r.TokensSavedTotal)), countText(r.TokensSavedHour)))
}

// contextCharts draw the figures of contextFigures over the last minutes
// in h rows at most: a caption, then each chart up to 4 rows high with its
// title (and, given the rows, its figure and scale) beside it; none when
// even one row each does not fit.
func (pc *programContext) contextCharts(c workers.ContextInfo, w, h int) []string {
	specs, r, ok := pc.contextSpecs(c)
	const labelW = 20
	rows := (h - 1) / max(1, len(specs)) // each chart: rows of bars
	chartW := min(w-labelW-4, len(r.HitChunks.Fine), series.FineLen)
	if !ok || rows < 1 || chartW < 10 {
		return nil
	}
	rows = min(rows, 4)
	lines := []string{pc.st.Faint.Render(fmt.Sprintf("  last %s, one column a second; figures are the last minute's",
		durationText(time.Duration(chartW)*series.FineStep)))}
	for _, s := range specs {
		bars := blockChart(s.vals, chartW, rows, s.top)
		shown := s.vals[max(0, len(s.vals)-chartW):]
		for i, b := range bars {
			left := ""
			switch i {
			case 0:
				left = s.title
			case 1:
				left = s.now
			case 2:
				left = "top " + s.topText(scaleTop(shown, s.top))
			}
			lines = append(lines, "  "+fit(left, labelW)+" "+b)
		}
	}
	return lines
}

// chartSpec is one chart of the details view: its title (and short title), the last
// minute's figure, the series and its scale (0 = its peak) and how the
// scale's top is printed.
type chartSpec struct {
	title   string
	short   string // the title in the one line of numbers
	now     string
	vals    []float64
	top     float64
	topText func(float64) string
}
