package dashboard

import (
	"fmt"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"

	"kvdock/core/engine"
)

// statsResetter zeroes the engine's insight figures; *engine.Engine is
// one. An engine without it is told so on Z.
type statsResetter interface {
	ResetStats(by engine.ClearOrigin) (time.Time, error)
}

// resetMsg is the engine's answer to a reset of the statistics.
type resetMsg struct{ err error }

// askResetStats asks to reset the statistics (Z): after a benchmark run,
// say, whose traffic no longer belongs in the figures.
func (m *Model) askResetStats() {
	m.pc.ask(question{
		view: func(int) string { return resetStatsView(m.pc) },
		yes:  m.resetStats,
		no:   "statistics kept",
	})
}

func resetStatsView(pc *programContext) string {
	st := pc.st
	var b strings.Builder
	b.WriteString(st.Warn.Render("RESET STATISTICS?") + "\n\n")
	b.WriteString("The hit ratio, tokens saved, miss breakdown and what-if start again from now.\n")
	b.WriteString("The cache, the workers and the pool's own counters stay as they are.\n\n")
	b.WriteString("Reset them? " + st.Key.Render("y") + " reset  " + st.Key.Render("n") + " cancel")
	return b.String()
}

// resetStats asks the engine off the UI goroutine.
func (m *Model) resetStats() tea.Cmd {
	rs, ok := m.eng.(statsResetter)
	if !ok {
		m.pc.setStatus(levelBad, "this engine cannot reset its statistics")
		return nil
	}
	return func() tea.Msg {
		_, err := rs.ResetStats(engine.ClearByDashboard)
		return resetMsg{err: err}
	}
}

// statsReset says in the header what the engine answered.
func (m *Model) statsReset(msg resetMsg) {
	if msg.err != nil {
		m.pc.setStatus(levelBad, fmt.Sprintf("RESET FAILED: %v", msg.err))
		return
	}
	m.pc.setStatus(levelOK, "statistics reset: the figures start again from now")
}
