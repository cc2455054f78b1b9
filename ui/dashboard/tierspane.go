package dashboard

import (
	"fmt"
	"strings"
	"time"

	"charm.land/lipgloss/v2"

	"kvdock/core/tierstate"
	"kvdock/settings"
)

// tierRate is a tier's read and write throughput between the last two
// snapshots, in bytes per second; ok is false until two snapshots of the
// same tier were seen (or after its counters went back, a restart).
type tierRate struct {
	read, write float64
	ok          bool
}

// staleAfter is the age past which the tiers pane marks its figures
// stale: three missed refreshes of the 1 s tick.
const staleAfter = 3 * time.Second

// tiersPane is every L2 tier in lookup order: state and why, usage,
// reads, writes and the throughput between the last two snapshots; it
// scrolls when they do not fit.
type tiersPane struct {
	scrollPane
	// prev and prevAt are the previous snapshot's tiers, the rates are
	// derived from.
	prev   []tierstate.Tier
	prevAt time.Time
	rates  map[int]tierRate
}

func (p *tiersPane) View() string { return p.show(p.lines(p.w), p.h) }

// addRates derives each tier's throughput from the byte totals of the
// previous snapshot and this one; a tier is the same when its position and
// type are.
func (p *tiersPane) addRates(tiers []tierstate.Tier, at time.Time) {
	rates := make(map[int]tierRate, len(tiers))
	dt := at.Sub(p.prevAt).Seconds()
	for _, t := range tiers {
		for _, prev := range p.prev {
			if prev.Index != t.Index || prev.Type != t.Type || dt <= 0 || t.ReadBytes < prev.ReadBytes || t.WriteBytes < prev.WriteBytes {
				continue
			}
			rates[t.Index] = tierRate{
				read:  float64(t.ReadBytes-prev.ReadBytes) / dt,
				write: float64(t.WriteBytes-prev.WriteBytes) / dt,
				ok:    true,
			}
		}
	}
	p.prev = append(p.prev[:0], tiers...)
	p.prevAt = at
	p.rates = rates
}

// tierStateStyle tones a tier state; the label carries the meaning.
func (c *programContext) tierStateStyle(s tierstate.State) lipgloss.Style {
	switch s {
	case tierstate.Up:
		return c.st.OK
	case tierstate.Degraded:
		return c.st.Warn
	}
	return c.st.Bad
}

// tierStateText is the state label, "UNKNOWN" for a state this build does
// not know.
func tierStateText(s tierstate.State) string {
	switch s {
	case tierstate.Up, tierstate.Down, tierstate.Degraded:
		return strings.ToUpper(string(s))
	}
	return "UNKNOWN"
}

// lines are every L2 tier in lookup order under a line about them all,
// or what renderNoTiers says.
func (p *tiersPane) lines(w int) []string {
	pc := p.pc
	tiers := pc.snap.Tiers
	l2 := pc.running.L2
	if len(tiers) == 0 {
		lines := strings.Split(p.renderNoTiers(w), "\n")
		if kv := p.kvEventsLines(w); kv != nil {
			lines = append(append(lines, ""), kv...)
		}
		return lines
	}
	head := fmt.Sprintf("%d tier(s) in lookup order · store %s · %d loads in flight · timeout %s",
		len(tiers), l2.StorePolicy, l2.PrefetchMaxInFlight,
		durationText(time.Duration(l2.LoadTimeoutSeconds*float64(time.Second))))
	// When the figures were taken: a screen that stopped refreshing (an
	// engine that does not answer) shows its age rather than passing old
	// figures for new ones.
	if taken := pc.snap.Taken; !taken.IsZero() {
		head += " · refreshed " + taken.Format("15:04:05")
		if age := pc.opts.Now().Sub(taken); age >= staleAfter {
			head += " " + pc.st.Warn.Render("("+durationText(age)+" ago: STALE)")
		}
	}
	lines := strings.Split(wrapWords(head, w), "\n")
	lines = append(lines, p.kvEventsLines(w)...)
	for _, t := range tiers {
		lines = append(lines, "")
		lines = append(lines, p.tierBlock(t, w)...)
	}
	return lines
}

// tierBlock is one tier: title and state, then its figures.
func (p *tiersPane) tierBlock(t tierstate.Tier, w int) []string {
	pc := p.pc
	now := pc.opts.Now()
	state := pc.tierStateStyle(t.State).Render(tierStateText(t.State))
	if !t.Since.IsZero() {
		state += " for " + durationText(now.Sub(t.Since))
	}
	title := pc.st.Title.Render(fmt.Sprintf("Tier %d  %s", t.Index, t.Type)) + "  " + state + "  " + t.Target
	lines := []string{fit(title, w)}
	if t.Reason != "" {
		for _, l := range strings.Split(wrapWords("why: "+t.Reason, max(10, w-12)), "\n") {
			lines = append(lines, "          "+pc.tierStateStyle(t.State).Render(l))
		}
	}

	used := settings.BytesText(t.UsedBytes)
	usedLabel := "  Used    "
	if t.State == tierstate.Down {
		// What the tier held when it was last reached (the index's
		// count); the server may have lost it meanwhile.
		usedLabel = "  Held    "
		used = "last known " + used
	}
	if t.CapacityBytes > 0 {
		pct := percent(float64(t.UsedBytes), float64(t.CapacityBytes))
		nums := fmt.Sprintf(" %s / %s (%.1f%%) · %d object(s)", used, settings.BytesText(t.CapacityBytes), pct, t.Objects)
		barW := max(10, min(40, w-10-lipgloss.Width(nums)))
		lines = append(lines, pc.st.Bold.Render(usedLabel)+bar(pc.st, barW, pct)+nums)
	} else {
		lines = append(lines, pc.st.Bold.Render(usedLabel)+fmt.Sprintf("%s, no capacity bound · %d object(s)", used, t.Objects))
	}
	loads := fmt.Sprintf("%d loaded", t.Loads)
	if t.LoadTimeouts > 0 {
		loads += fmt.Sprintf(" (%d timed out)", t.LoadTimeouts)
	}
	corrupt := fmt.Sprintf("%d corrupt rejected", t.Corrupt)
	if t.Corrupt > 0 {
		corrupt = pc.st.Warn.Render(corrupt)
	}
	lines = append(lines,
		fit(pc.st.Bold.Render("  Reads   ")+fmt.Sprintf("%d hits · %d misses · ", t.Hits, t.Misses)+corrupt+" · "+loads, w))
	dropped := fmt.Sprintf("%d dropped", t.DroppedWrites)
	if t.DroppedWrites > 0 {
		dropped = pc.st.Warn.Render(dropped)
	}
	lines = append(lines,
		fit(pc.st.Bold.Render("  Writes  ")+fmt.Sprintf("queue %d (%s) · ", t.QueueDepth, settings.BytesText(t.QueueBytes))+dropped, w))
	rate := "read - · write - (needs two refreshes)"
	if r, ok := p.rates[t.Index]; ok && r.ok {
		rate = "read " + rateText(r.read) + " · write " + rateText(r.write)
	}
	rateLine := pc.st.Bold.Render("  Rate    ") + rate
	// The totals only where they fit whole: a cut figure misleads.
	if withTotals := rateLine + fmt.Sprintf("   totals %s read, %s written",
		settings.BytesText(int64(min(t.ReadBytes, 1<<62))), settings.BytesText(int64(min(t.WriteBytes, 1<<62)))); lipgloss.Width(withTotals) <= w {
		rateLine = withTotals
	}
	lines = append(lines, fit(rateLine, w))
	return lines
}

// kvEventsLines are the KV event stream routers read, while it is on:
// where it publishes and the replays asked, then what it published
// (batches, and the blocks stored and removed in them) and dropped; none
// when it is off. Two lines, so that each fits 80 columns whole.
func (p *tiersPane) kvEventsLines(w int) []string {
	pc := p.pc
	kv := pc.snap.KVEvents
	if !kv.Enabled {
		return nil
	}
	verb := "PUB on"
	if kv.Connect {
		verb = "PUB to"
	}
	dropped := fmt.Sprintf("%d dropped", kv.Dropped+kv.SendErrors)
	if kv.Dropped+kv.SendErrors > 0 {
		dropped = pc.st.Warn.Render(dropped)
	}
	return []string{
		fit(pc.st.Bold.Render("KV events ")+fmt.Sprintf("%s %s · %d replay request(s)", verb, kv.Endpoint, kv.ReplayRequests), w),
		fit(fmt.Sprintf("          %d batches published · %d blocks stored, %d removed · ", kv.Sent, kv.StoredEvents, kv.RemovedEvents)+dropped, w),
	}
}

// renderNoTiers says there is no tier, and how to add one; adapters that
// are configured but not opened (yet) are listed, credentials redacted.
func (p *tiersPane) renderNoTiers(w int) string {
	pc := p.pc
	configured := settings.AdapterTexts(pc.running)
	if len(configured) == 0 {
		text := []string{
			pc.st.Faint.Render("no L2 tier configured"),
			"",
			wrapWords("Chunks live only in the L1 pool. Add a tier behind it with --l2-adapter (repeatable; the first is tried first), then restart:", w),
			`  --l2-adapter '{"type": "fs", "base_path": "/data/l2"}'`,
			`  --l2-adapter '{"type": "resp", "host": "redis", "port": 6379}'`,
			wrapWords("or l2.adapters in the settings file, or KVDOCK_L2_ADAPTERS as a JSON array.", w),
		}
		return strings.Join(text, "\n")
	}
	lines := []string{
		pc.st.Warn.Render("no tier is open") + fmt.Sprintf(": %d adapter(s) configured, none reported by the engine yet", len(configured)),
		"",
	}
	for i, a := range configured {
		lines = append(lines, fit(fmt.Sprintf("  %d  %s", i, a), w))
	}
	return strings.Join(lines, "\n")
}
