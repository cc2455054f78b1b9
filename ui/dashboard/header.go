package dashboard

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/x/ansi"

	"kvdock/core/engine"
	"kvdock/core/tierstate"
	"kvdock/settings"
)

// stateStyle tones a state label; the label itself carries the meaning.
func (c *programContext) stateStyle(s engine.State) lipgloss.Style {
	switch s {
	case engine.Serving:
		return c.st.OK
	case engine.Starting, engine.Restarting:
		return c.st.Warn
	case engine.Failed:
		return c.st.Bad
	}
	return c.st.Faint
}

func (c *programContext) renderHeader(w int) string {
	s := c.snap
	version := s.Version
	if version == "" {
		version = c.opts.Version
	}
	endpoint := s.Endpoint
	if endpoint == "" {
		endpoint = "(not bound)"
	}
	proto := s.Protocol
	if proto == "" {
		proto = c.running.Server.Protocol
	}
	state := c.stateStyle(s.State).Render(strings.ToUpper(s.State.String()))
	// The state comes right after the title: it is what a narrow screen
	// must still show.
	up := "  up " + durationText(s.Uptime)
	line1 := c.st.Title.Render("kvdock "+version) + "  state: " + state + "  " + endpoint + "  " + proto + up
	// Too narrow: the profile goes first (the Settings pane has it), then
	// the address is shortened in its middle; the uptime stays whole.
	if lipgloss.Width(line1) > w {
		line1 = c.st.Title.Render("kvdock "+version) + "  state: " + state + "  " + endpoint + up
	}
	if over := lipgloss.Width(line1) - w; over > 0 && ansi.StringWidth(endpoint) > over+8 {
		line1 = c.st.Title.Render("kvdock "+version) + "  state: " + state + "  " + midTrunc(endpoint, ansi.StringWidth(endpoint)-over) + up
	}
	// Under --protocol auto, the tables the peers were settled on, when
	// the line has room for them.
	if d := detectionsText(s); d != "" && lipgloss.Width(line1)+2+lipgloss.Width(d) <= w {
		line1 += "  " + d
	}
	if s.Error != "" {
		line1 += "  " + c.st.Bad.Render("error: "+s.Error)
	}

	// The pool line stays: a message (apply, save, remove results) takes
	// a line of its own under the rates, for as long as it shows.
	head := fit(line1, w) + "\n" + fit(c.summary(w), w) + "\n" + fit(c.ratesLine(w), w)
	if msg := c.statusLines(w); msg != "" {
		head += "\n" + msg
	}
	return head
}

// statusLines is the header's message, "" when there is none: APPLYING
// while an apply runs, else the last result, wrapped onto a second line
// rather than losing the why (a rollback and its cause).
func (c *programContext) statusLines(w int) string {
	if c.status.applying {
		return fit(c.st.Warn.Render("APPLYING")+" "+c.status.text, w)
	}
	if c.status.text == "" {
		return ""
	}
	st := c.st.Faint
	switch c.status.level {
	case levelOK:
		st = c.st.OK
	case levelWarn:
		st = c.st.Warn
	case levelBad:
		st = c.st.Bad
	}
	lines := strings.Split(ansi.Wrap(c.status.text, w, " "), "\n")
	if len(lines) > 2 {
		lines = lines[:2]
	}
	for i := range lines {
		lines[i] = fit(st.Render(lines[i]), w)
	}
	return strings.Join(lines, "\n")
}

// detectionsText is the peers --protocol auto settled on each table
// ("peers nongpu-v1 2 · rpc-messages 1"), "" under a fixed profile or
// before any peer settled.
func detectionsText(s engine.Snapshot) string {
	if s.Protocol != settings.ProtocolAuto {
		return ""
	}
	var parts []string
	for _, p := range slices.Sorted(maps.Keys(s.Requests.Detections)) {
		if n := s.Requests.Detections[p]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", p, n))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	out := "peers " + strings.Join(parts, " · ")
	if n := s.Requests.AmbiguousDetections; n > 0 {
		out += fmt.Sprintf(" (%d guessed)", n)
	}
	return out
}

// summary is the one-line overview under the title when nothing else is
// to be said, within w columns where it can: the share of resident bytes
// a LOOKUP can reach (usable) is left out when the line would not fit with
// it (the Pool pane has it too).
func (c *programContext) summary(w int) string {
	s := c.snap
	shm := "SHM " + s.Shm.ShmName
	if !s.Shm.Shared() {
		shm = "PICKLE (SHM off)"
	}
	pct := percent(float64(s.Pool.UsedBytes), float64(s.Pool.Size))
	workers := fmt.Sprintf("%d worker context(s)", registeredContexts(s.Contexts))
	gpu := "GPU n/a"
	if s.GPU.Available {
		gpu = fmt.Sprintf("%d GPU(s)", len(s.GPU.Devices))
	}
	head := fmt.Sprintf("pool %s %.0f%% used", shm, pct)
	tail := fmt.Sprintf(" · %s · %s", workers, gpu) + restartText(s.Restart)
	// A tier that is down comes before the rest: lookups skip it and its
	// writes are dropped, which the operator must see on every pane.
	if down := tiersDownText(s.Tiers); down != "" {
		tail = " · " + c.st.Bad.Render(down) + tail
		if lipgloss.Width(head+tail) > w {
			// Short forms rather than a cut word.
			tail = " · " + c.st.Bad.Render(down) + fmt.Sprintf(" · %d ctx", registeredContexts(s.Contexts)) + restartText(s.Restart)
		}
	}
	if usable := fmt.Sprintf(", %.1f%% usable", 100*s.Pool.UsableRatio()); lipgloss.Width(head+usable+tail) <= w {
		head += usable
	}
	// The restart in shorter words rather than cut (the Events pane has
	// the whole of it).
	if full := restartText(s.Restart); full != "" {
		base := strings.TrimSuffix(tail, full)
		for _, short := range []string{restartShort(s.Restart), " · restarted"} {
			if lipgloss.Width(head+tail) <= w {
				break
			}
			tail = base + short
		}
	}
	return head + tail
}

// restartShort is restartText in fewer words: the gap and whether the
// figures were kept.
func restartShort(r engine.Restart) string {
	stats := ", stats restarted"
	if r.StatsCarried {
		stats = ", stats kept"
	}
	if !r.Adopted {
		return " · restart: none adopted"
	}
	return fmt.Sprintf(" · restarted, gap %d ms", r.Gap.Milliseconds()) + stats
}

// tiersDownText names the L2 tiers that are down ("L2 tier 1 resp DOWN"),
// "" when none is.
func tiersDownText(tiers []tierstate.Tier) string {
	var down []string
	for _, t := range tiers {
		if t.State == tierstate.Down {
			down = append(down, fmt.Sprintf("%d %s", t.Index, t.Type))
		}
	}
	switch len(down) {
	case 0:
		return ""
	case 1:
		return "L2 tier " + down[0] + " DOWN"
	}
	return "L2 tiers " + strings.Join(down, ", ") + " DOWN"
}

// restartText is the last restart for the summary line: what was adopted
// of the previous process's pool and the gap, or that nothing was (the
// events pane and /status say why), and whether the figures went on
// (engine.StatsRule: "stats kept") or start with this process ("stats
// restarted"); "" when the start found no record.
func restartText(r engine.Restart) string {
	stats := ", stats restarted"
	if r.StatsCarried {
		stats = ", stats kept"
	}
	switch {
	case r.Adopted:
		return fmt.Sprintf(" · restarted: %d objects (%s), %d ctx adopted, gap %d ms",
			r.Objects, settings.BytesText(r.Bytes), r.Contexts, r.Gap.Milliseconds()) + stats
	case r.Reason != "":
		return " · restart: nothing adopted" + stats + " (see events)"
	}
	return ""
}
