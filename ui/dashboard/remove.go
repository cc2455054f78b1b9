package dashboard

import (
	"fmt"
	"strings"

	tea "charm.land/bubbletea/v2"

	"kvdock/core/engine"
	"kvdock/core/workers"
)

// askRemove asks to remove the selected worker context (x in the contexts
// pane): seed-era workers are never reaped, so a dead one stays until the
// operator removes it.
func (m *Model) askRemove(rows []workers.ContextInfo) {
	if len(rows) == 0 || m.ctxSel < 0 || m.ctxSel >= len(rows) {
		m.setStatus(levelInfo, "no worker selected")
		return
	}
	c := rows[m.ctxSel]
	if gone(c) {
		m.setStatus(levelInfo, fmt.Sprintf("instance %d is already %s", c.InstanceID, c.State))
		return
	}
	m.removing = c
	m.mode = modeConfirmRemove
}

func (m *Model) renderConfirmRemove() string {
	c := m.removing
	var b strings.Builder
	b.WriteString(m.st.Warn.Render("REMOVE?") + fmt.Sprintf(" worker instance %d (%s, %s, last seen %s)\n\n",
		c.InstanceID, c.Model, stateText(m, c), ageText(m.opts.Now(), c.LastRequest)))
	b.WriteString("Its context goes and its pending stores are aborted (never published).\n")
	b.WriteString("A live worker gets no answers until it registers again.\n\n")
	b.WriteString("Remove it? " + m.st.Key.Render("y") + " remove  " + m.st.Key.Render("n") + " cancel")
	return b.String()
}

func (m *Model) startRemove() tea.Cmd {
	m.mode = modeNormal
	id, eng := m.removing.InstanceID, m.eng
	return func() tea.Msg {
		return removeMsg{id: id, err: eng.RemoveInstance(id, engine.ClearByDashboard)}
	}
}

func (m *Model) removeDone(msg removeMsg) {
	if msg.err != nil {
		m.setStatus(levelBad, fmt.Sprintf("REMOVE FAILED: %v", msg.err))
		return
	}
	m.setStatus(levelOK, fmt.Sprintf("instance %d removed", msg.id))
}
