package dashboard

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"

	"kvdock/settings"
	"kvdock/ui/termtext"
)

// emptyLiteral typed in the editor means the empty string, so an empty
// value can be entered explicitly (an empty field means the same).
const emptyLiteral = `""`

// valueText shows a setting's value: empty strings as "" and an absent
// shm_name as (auto), so the two never look alike; a secret that is set as
// settings.Redacted.
func valueText(c settings.Config, k settings.KeyInfo) string {
	v, err := settings.Shown(c, k.Key)
	if err != nil {
		return "?"
	}
	v = termtext.Clean(v)
	if v == "" && (k.Kind == "string" || k.Kind == "optional-string") {
		return emptyLiteral
	}
	return v
}

// editHint says what the editor takes for a key of ki's kind; only strings
// can be empty, and only server.shm_name is auto.
func editHint(ki settings.KeyInfo) string {
	switch ki.Kind {
	case "string":
		return `empty or "" = empty string`
	case "optional-string":
		return `empty or "" = SHM off · ` + settings.AutoText + ` or ctrl+r = auto`
	case "bool":
		return "true or false"
	case "duration":
		return "a duration with a unit: 500ms, 2s, 1m"
	case "int", "int64":
		return "a whole number"
	case "float":
		return "a number"
	}
	return ""
}

// editKeysFor is the editor's key map for ki: ctrl+r names the default it
// puts back, and clearing says "empty" only where the empty string is a
// value.
func editKeysFor(ki settings.KeyInfo) editKeys {
	k := newEditKeys()
	switch {
	case ki.Kind == "optional-string":
		k.Default.SetHelp("ctrl+r", "default (auto)")
	case ki.Default == "":
		k.Default.SetHelp("ctrl+r", "default (empty)")
	default:
		k.Default.SetHelp("ctrl+r", "default "+termtext.Clean(ki.Default))
	}
	if ki.Kind == "string" || ki.Kind == "optional-string" {
		k.Empty.SetHelp("ctrl+u", "clear (empty)")
	}
	return k
}

// editValue turns the editor's text into what settings.Set takes.
func editValue(s string) string {
	if s == emptyLiteral {
		return ""
	}
	return s
}

// pendingSources are the running sources with every pending change marked
// as coming from the dashboard.
func (m *Model) pendingSources() map[string]settings.Source {
	src := make(map[string]settings.Source, len(m.runSrc))
	for k, v := range m.runSrc {
		src[k] = v
	}
	for _, c := range settings.Diff(m.running, m.pending) {
		src[c.Key] = settings.Source{Kind: settings.SourceDashboard}
	}
	return src
}

func (m *Model) onSettingsKey(msg tea.KeyPressMsg) tea.Cmd {
	k := m.keys.Settings
	if m.moveSel(msg, &m.setSel, len(m.keyInfos)) {
		return nil
	}
	ki := m.keyInfos[m.setSel]
	if ki.ReadOnly && (key.Matches(msg, k.Edit) || key.Matches(msg, k.Reset)) {
		m.setStatus(levelInfo, readOnlyText(ki))
		return nil
	}
	switch {
	case key.Matches(msg, k.Edit):
		m.mode = modeEdit
		v, _ := settings.Get(m.pending, ki.Key)
		m.edit.SetValue(v)
		m.edit.mask = ki.Secret // edited in place, never shown
		m.keys.Edit = editKeysFor(ki)
		m.edit.Focus()
		m.checkEdit()
		return nil
	case key.Matches(msg, k.Find):
		m.mode = modeFind
		m.findFrom = m.setSel
		m.find.Open("")
	case key.Matches(msg, k.Reset):
		if err := settings.Reset(&m.pending, ki.Key); err != nil {
			m.setStatus(levelBad, err.Error())
		}
	case key.Matches(msg, k.Discard):
		m.pending = m.running
		m.problems = nil
		m.setStatus(levelInfo, "pending edits discarded")
	case key.Matches(msg, k.Apply):
		m.askApply()
	case key.Matches(msg, k.Save):
		m.save()
	}
	return nil
}

func (m *Model) onEditKey(msg tea.KeyPressMsg) tea.Cmd {
	ki := m.keyInfos[m.setSel]
	k := m.keys.Edit
	switch {
	case key.Matches(msg, k.Cancel):
		m.mode = modeNormal
		m.edit.Blur()
		m.editErr = ""
		m.keys.Edit = newEditKeys()
		return nil
	case key.Matches(msg, k.Accept):
		if m.editErr != "" {
			return nil // the problem stays on screen until fixed or esc
		}
		if err := settings.Set(&m.pending, ki.Key, editValue(m.edit.Value())); err != nil {
			m.editErr = err.Error()
			return nil
		}
		m.mode = modeNormal
		m.edit.Blur()
		m.keys.Edit = newEditKeys()
		return nil
	case key.Matches(msg, k.Default):
		m.edit.SetValue(ki.Default)
		m.checkEdit()
		return nil
	case key.Matches(msg, k.Empty):
		m.edit.SetValue("")
		m.checkEdit()
		return nil
	}
	return m.onText(msg)
}

// onFind takes a key or a paste while a setting's name is typed: the
// selection follows the text; esc goes back to where it was.
func (m *Model) onFind(msg tea.Msg) {
	switch m.find.Update(msg) {
	case promptChanged:
		m.findKey()
	case promptAccepted:
		m.mode = modeNormal
	case promptCancelled:
		m.mode = modeNormal
		m.setSel = m.findFrom
	}
}

// findKey selects the first setting whose key is the typed text or, failing
// that, contains it.
func (m *Model) findKey() {
	q := strings.ToLower(m.find.Value())
	if q == "" {
		m.setSel = m.findFrom
		return
	}
	for _, exact := range []bool{true, false} {
		for i, ki := range m.keyInfos {
			if exact && (ki.Key == q || strings.HasSuffix(ki.Key, "."+q)) || !exact && strings.Contains(ki.Key, q) {
				m.setSel = i
				return
			}
		}
	}
}

// checkEdit validates the editor's text as typed: Set on a copy of the
// pending config, then the key's own rules.
func (m *Model) checkEdit() {
	ki := m.keyInfos[m.setSel]
	c := m.pending
	if err := settings.Set(&c, ki.Key, editValue(m.edit.Value())); err != nil {
		m.editErr = err.Error()
		return
	}
	m.editErr = ""
	var ve *settings.ValidationError
	err := settings.Validate(c, m.pendingSources())
	if err == nil {
		err = m.memoryCheck(c)
	}
	if errors.As(err, &ve) {
		for _, p := range ve.Problems {
			if p.Key == ki.Key || ki.Key == "l1.allow_overcommit" && p.Key == "l1.size_gb" {
				m.editErr = fmt.Sprintf("%s = %s: %s", p.Key, p.Value, p.Reason)
				return
			}
		}
	}
}

// askApply shows the changes with their classes and asks to confirm.
func (m *Model) askApply() {
	if m.applying {
		m.setStatus(levelWarn, "an apply is already running")
		return
	}
	m.changes = settings.Diff(m.running, m.pending)
	if len(m.changes) == 0 {
		m.setStatus(levelInfo, "nothing to apply: no pending edits")
		return
	}
	if !m.pendingValid("applying") {
		return
	}
	m.mode = modeConfirmApply
}

// pendingValid validates the pending config; when it is invalid it lists
// the problems under the pane, says so in the header and returns false.
func (m *Model) pendingValid(doing string) bool {
	m.problems = nil
	var ve *settings.ValidationError
	err := settings.Validate(m.pending, m.pendingSources())
	if err == nil {
		err = m.memoryCheck(m.pending)
	}
	if errors.As(err, &ve) {
		for _, p := range ve.Problems {
			m.problems = append(m.problems, p.String())
		}
		m.setStatus(levelBad, fmt.Sprintf("INVALID: %d problem(s); fix them before %s", len(m.problems), doing))
		return false
	} else if err != nil {
		m.setStatus(levelBad, "INVALID: "+err.Error())
		return false
	}
	return true
}

func (m *Model) startApply() tea.Cmd {
	m.mode = modeNormal
	m.applying = true
	class := settings.Strongest(m.changes)
	m.setStatus(levelWarn, fmt.Sprintf("%s: %s", class, changeKeys(m.changes)))
	m.note(slog.LevelInfo, fmt.Sprintf("applying (%s): %s", class, changeKeys(m.changes)))
	eng, ctx, cfg, src := m.eng, m.ctx, m.pending, m.pendingSources()
	return func() tea.Msg {
		res, err := eng.Apply(ctx, cfg, src)
		return applyMsg{res: res, err: err}
	}
}

// changeNote says what applying c does. The faces' own keys do not restart
// the engine: http.* restarts the HTTP API only.
func changeNote(c settings.Change) string {
	if strings.HasPrefix(c.Key, "http.") {
		return "HTTP API restarts"
	}
	switch c.Class {
	case settings.NextStart:
		return "takes effect at the next start"
	case settings.Restart:
		return "server restarts"
	case settings.Rebuild:
		return "cache will be cleared"
	}
	return "in place"
}

func (m *Model) renderConfirmApply(w int) string {
	var b strings.Builder
	b.WriteString(m.st.Title.Render(fmt.Sprintf("Apply %d change(s)?", len(m.changes))) + "\n\n")
	for _, c := range m.changes {
		b.WriteString(fit(fmt.Sprintf("  [%s] %s: %s -> %s (%s)", strings.ToUpper(c.Class.String()), c.Key, c.Old, c.New, changeNote(c)), w) + "\n")
	}
	b.WriteString("\n")
	switch settings.Strongest(m.changes) {
	case settings.Rebuild:
		n := registeredContexts(m.snap.Contexts)
		b.WriteString(m.st.Bad.Render("REBUILD") + fmt.Sprintf(": the cache will be cleared; %d registered worker(s) must re-register.\n", n))
	case settings.Restart:
		b.WriteString(m.st.Warn.Render("RESTART") + ": the wire server restarts; the cache and contexts are kept.\n")
	case settings.NextStart:
		b.WriteString(m.st.Warn.Render("NEXT START") + ": nothing restarts now; the change takes effect when kvdock starts again.\n")
	default:
		b.WriteString(m.st.OK.Render("LIVE") + ": applied in place.\n")
	}
	b.WriteString("A restart that fails rolls back to the running config.\n\n")
	b.WriteString("Apply? " + m.st.Key.Render("y") + " apply  " + m.st.Key.Render("n") + " cancel")
	return b.String()
}

// save writes the values set in the dashboard, applied or pending, into the
// settings file and keeps the rest of it; values that came from the
// environment, flags or defaults stay out (settings.SaveFile). With no file
// yet it creates the default one.
func (m *Model) save() {
	path := m.opts.ConfigPath
	if path == "" {
		m.setStatus(levelWarn, "nowhere to save: $XDG_CONFIG_HOME and $HOME are unset; start kvdock with --config PATH")
		return
	}
	src := m.pendingSources()
	if len(settings.Edited(src)) == 0 {
		m.setStatus(levelInfo, "nothing to save: no value was set in the dashboard (values from env and flags are never saved)")
		return
	}
	if !m.pendingValid("saving") {
		return
	}
	res, err := settings.SaveFile(path, m.pending, src)
	if err != nil {
		m.setStatus(levelBad, "SAVE FAILED: "+err.Error())
		m.note(slog.LevelError, "save failed: "+err.Error())
		return
	}
	msg := fmt.Sprintf("saved %s to %s", strings.Join(res.Keys, ", "), res.Path)
	if res.Created {
		msg = fmt.Sprintf("created %s (mode %04o) with %s", res.Path, res.Mode, strings.Join(res.Keys, ", "))
	}
	if n := len(settings.Diff(m.running, m.pending)); n > 0 {
		msg += fmt.Sprintf("; %d edit(s) saved but not applied (a applies)", n)
	}
	m.setStatus(levelOK, "OK "+msg)
	m.note(slog.LevelInfo, msg)
}

func (m *Model) renderSettings(w, h int) string {
	var b strings.Builder
	changes := settings.Diff(m.running, m.pending)
	changed := map[string]settings.Change{}
	for _, c := range changes {
		changed[c.Key] = c
	}
	head := fmt.Sprintf("%d setting(s) · %d pending edit(s)", len(m.keyInfos), len(changes))
	if len(changes) > 0 {
		head += " · a to apply, u to undo"
	}
	b.WriteString(head + "\n")

	// "> * " marker, key, value, source, class.
	keyW := 28
	valW := max(10, min(30, w-4-keyW-1-1-10-1-7))
	b.WriteString(m.st.Header.Render(fit(fmt.Sprintf("    %-*s %-*s %-10s %s", keyW, "KEY", valW, "VALUE", "SOURCE", "CLASS"), w)) + "\n")

	// Room under the list: the selected key's help, the editor, problems.
	foot := m.settingsFooter(w)
	listH := max(1, h-2-strings.Count(foot, "\n")-1)
	more := len(m.keyInfos) > listH
	if more {
		listH = max(1, listH-1) // room for "n more below"
	}
	start := 0
	if m.setSel >= listH {
		start = m.setSel - listH + 1
	}
	for i := start; i < len(m.keyInfos) && i < start+listH; i++ {
		ki := m.keyInfos[i]
		val := valueText(m.pending, ki)
		src := m.runSrc[ki.Key].Kind.String()
		mark := " "
		if _, ok := changed[ki.Key]; ok {
			mark = "*"
			src = "dashboard"
			val = m.st.Changed.Render(fit(val, valW))
		} else {
			val = fit(val, valW)
		}
		sel := " "
		if i == m.setSel {
			sel = ">"
		}
		line := fmt.Sprintf("%s %s %-*s %s %-10s %s", sel, mark, keyW, ki.Key, val, src, ki.Class)
		if i == m.setSel {
			b.WriteString(m.st.Selected.Render(fit(line, w)) + "\n")
		} else {
			b.WriteString(fit(line, w) + "\n")
		}
	}
	for i := min(len(m.keyInfos)-start, listH); i < listH; i++ {
		b.WriteString("\n")
	}
	if more {
		b.WriteString(m.st.Faint.Render(fmt.Sprintf("  … %d more below", max(0, len(m.keyInfos)-start-listH))) + "\n")
	}
	b.WriteString(foot)
	return b.String()
}

// readOnlyText says where a key the dashboard does not edit is set.
func readOnlyText(ki settings.KeyInfo) string {
	return fmt.Sprintf("%s is read-only here: set it with --%s, %s or the settings file, then restart (6 Tiers shows the tiers)", ki.Key, ki.Flag, ki.Env)
}

func (m *Model) settingsFooter(w int) string {
	ki := m.keyInfos[m.setSel]
	var lines []string
	lines = append(lines, m.st.Bold.Render(ki.Key)+": "+ki.Help)
	if ki.ReadOnly {
		lines = append(lines, "  "+readOnlyText(ki))
		adapters := settings.AdapterTexts(m.running)
		if len(adapters) == 0 {
			lines = append(lines, "  running: none")
		}
		for i, a := range adapters {
			lines = append(lines, fmt.Sprintf("  running %d: %s", i, a))
		}
	} else {
		lines = append(lines, fmt.Sprintf("  --%s · %s · default %s · running %s", ki.Flag, ki.Env, ki.Default, valueText(m.running, ki)))
	}
	lines = append(lines, m.logLine())
	if m.mode == modeFind {
		lines = append(lines, m.find.View())
	}
	if m.mode == modeEdit {
		lines = append(lines, m.edit.View())
		hint := editHint(ki)
		if m.editErr != "" {
			lines = append(lines, m.st.Bad.Render("INVALID: ")+m.editErr)
		} else {
			lines = append(lines, m.st.OK.Render("ok")+" · "+hint)
		}
	}
	for _, p := range m.problems {
		lines = append(lines, m.st.Bad.Render("INVALID: ")+p)
	}
	// Problems wrap rather than lose their end (the numbers, the way out).
	var out []string
	for _, l := range lines {
		if lipgloss.Width(l) <= w {
			out = append(out, fit(l, w))
			continue
		}
		for _, part := range strings.Split(wrapWords(l, w), "\n") {
			out = append(out, fit(part, w))
		}
	}
	return strings.Join(out, "\n")
}
