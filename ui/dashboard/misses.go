package dashboard

import (
	"fmt"
	"slices"
	"strings"

	"kvdock/core/misses"
)

// missLabels are the words the dashboard uses for each miss reason.
var missLabels = [misses.NumReasons]string{
	misses.NeverStored: "never stored",
	misses.Evicted:     "evicted",
	misses.Expired:     "expired",
	misses.Cleared:     "cleared",
	misses.OtherLayout: "other layout",
	misses.Refused:     "refused",
	misses.AfterMiss:   "after a miss",
}

// missText is a breakdown of missed chunks, largest reason first, as many
// reasons as fit in w cells ("… +N more" for the rest); "none" when nothing
// missed.
func missText(c misses.Counts, w int) string {
	total := c.Total()
	if total == 0 {
		return "none"
	}
	order := make([]misses.Reason, 0, misses.NumReasons)
	for r := range misses.NumReasons {
		if c[r] > 0 {
			order = append(order, r)
		}
	}
	slices.SortStableFunc(order, func(a, b misses.Reason) int {
		switch {
		case c[a] > c[b]:
			return -1
		case c[a] < c[b]:
			return 1
		}
		return 0
	})
	head := fmt.Sprintf("%s chunks:", countText(float64(total)))
	parts := make([]string, 0, len(order))
	for _, r := range order {
		parts = append(parts, fmt.Sprintf("%s %s", countText(float64(c[r])), missLabels[r]))
	}
	for n := len(parts); n > 0; n-- {
		s := head + " " + strings.Join(parts[:n], " · ")
		if n < len(parts) {
			s += fmt.Sprintf(" · +%d more", len(parts)-n)
		}
		if len(s) <= w || n == 1 {
			return s
		}
	}
	return head
}

// missLine is the Pool pane's line on why lookups missed, all contexts.
func (pc *programContext) missLine(w int) string {
	r := pc.snap.Misses
	s := pc.st.Bold.Render("Misses    ") + missText(r.Total, w-10)
	// Said only where a tier was there to miss: without one the count
	// is no news.
	if r.TierMissed > 0 && r.Total.Total() > 0 && len(pc.snap.Tiers) > 0 {
		s += fmt.Sprintf(" (%s missed L2 too)", countText(float64(r.TierMissed)))
	}
	return s
}

// contextMissLine is the details view's line on why lookups of the
// context's model and world size missed (the LOOKUPs of a scheduler name
// both, not an instance).
func (pc *programContext) contextMissLine(model string, worldSize int, w int) string {
	const label = "  misses     "
	c, ok := pc.snap.Misses.For(misses.Context{Model: model, WorldSize: worldSize})
	if !ok {
		return label + "none (no lookup of this model and world size missed)"
	}
	// The LOOKUPs name a model, not an instance: the figures are the
	// model's, which the line says.
	return label + "(model) " + missText(c.Missed, w-len(label)-8)
}
