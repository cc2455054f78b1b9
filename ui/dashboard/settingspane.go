package dashboard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"

	"kvdock/core/engine"
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
	return bytesShown(k, v)
}

// bytesKey reports that k's value counts bytes (max_message_bytes,
// queue_bytes, align_bytes, ...): the pane shows it in binary units.
func bytesKey(k settings.KeyInfo) bool {
	return (k.Kind == "int" || k.Kind == "int64") && strings.Contains(k.Key, "_bytes")
}

// bytesShown is v, a value of k as settings.Get prints it, in binary units
// when k counts bytes ("256 MiB" for 268435456); anything else unchanged.
// The editor still takes the number of bytes.
func bytesShown(k settings.KeyInfo, v string) string {
	if !bytesKey(k) {
		return v
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return v
	}
	return settings.BytesText(n)
}

// editHint says what the editor takes for a key of ki's kind; only free
// strings can be empty, an enumerated one takes its choices in any case,
// and only server.shm_name is auto.
func editHint(ki settings.KeyInfo) string {
	if len(ki.Choices) > 0 {
		return "one of " + strings.Join(ki.Choices, ", ") + " (any case)"
	}
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
		if bytesKey(ki) {
			return "a whole number of bytes"
		}
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
	if (ki.Kind == "string" && len(ki.Choices) == 0) || ki.Kind == "optional-string" {
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

// settingsMode is what has the keyboard in the settings pane.
type settingsMode int

const (
	setList settingsMode = iota
	setFind              // typing a key's name to jump to it
	setEdit              // editing the selected key's value
)

// configApplier is what the settings pane needs from the engine.
type configApplier interface {
	Apply(ctx context.Context, cfg settings.Config, sources map[string]settings.Source) (engine.ApplyResult, error)
	Config() (settings.Config, map[string]settings.Source)
}

// applyMsg is the engine's answer to an apply.
type applyMsg struct {
	res engine.ApplyResult
	err error
}

// settingsPane lists every setting with its value, source and restart
// class; it edits values into a pending config, validates it, applies it
// to the engine (after a yes) and saves it to the settings file.
type settingsPane struct {
	sized
	pc  *programContext
	ctx context.Context
	eng configApplier

	keys     settingsKeys
	editKeys editKeys // the editor's, naming the default of the key edited
	mode     settingsMode
	cur      listCursor
	keyInfos []settings.KeyInfo

	pending  settings.Config
	edit     lineEdit
	editErr  string
	find     textPrompt
	findFrom int      // selection before a find, restored by esc
	problems []string // validation problems shown after a refused apply
	changes  []settings.Change
}

func newSettingsPane(ctx context.Context, pc *programContext, eng configApplier) *settingsPane {
	return &settingsPane{
		pc: pc, ctx: ctx, eng: eng,
		keys: newSettingsKeys(), editKeys: newEditKeys(),
		keyInfos: settings.Keys(),
		pending:  pc.running,
		edit:     newLineEdit(pc.st, "new value: "),
		find:     newTextPrompt(pc.st, "find: ", newPromptKeys("select", "back")),
	}
}

func (p *settingsPane) Typing() bool { return p.mode != setList }
func (p *settingsPane) Leave()       { p.mode = setList }

func (p *settingsPane) ShortKeys() []key.Binding {
	switch p.mode {
	case setFind:
		return p.find.keys.list()
	case setEdit:
		return p.editKeys.list()
	}
	return p.keys.list()
}

func (p *settingsPane) HelpKeys() [][]key.Binding {
	return [][]key.Binding{p.keys.list(), p.editKeys.list()}
}

// pendingEdits counts the settings edited but not applied.
func (p *settingsPane) pendingEdits() int { return len(settings.Diff(p.pc.running, p.pending)) }

// pendingSources are the running sources with every pending change marked
// as coming from the dashboard.
func (p *settingsPane) pendingSources() map[string]settings.Source {
	src := make(map[string]settings.Source, len(p.pc.runSrc))
	for k, v := range p.pc.runSrc {
		src[k] = v
	}
	for _, c := range settings.Diff(p.pc.running, p.pending) {
		src[c.Key] = settings.Source{Kind: settings.SourceDashboard}
	}
	return src
}

func (p *settingsPane) Update(msg tea.Msg) tea.Cmd {
	switch p.mode {
	case setFind:
		p.onFind(msg)
		return nil
	case setEdit:
		p.onEdit(msg)
		return nil
	}
	kp, ok := msg.(tea.KeyPressMsg)
	if !ok {
		return nil
	}
	k := p.keys
	if p.cur.move(k.listKeys, kp, len(p.keyInfos), p.pc.pageSize()) {
		return nil
	}
	ki := p.keyInfos[p.cur.sel]
	if ki.ReadOnly && (key.Matches(kp, k.Edit) || key.Matches(kp, k.Reset)) {
		p.pc.setStatus(levelInfo, readOnlyText(ki))
		return nil
	}
	switch {
	case key.Matches(kp, k.Edit):
		p.mode = setEdit
		v, _ := settings.Get(p.pending, ki.Key)
		p.edit.SetValue(v)
		p.edit.mask = ki.Secret // edited in place, never shown
		p.editKeys = editKeysFor(ki)
		p.edit.Focus()
		p.checkEdit()
	case key.Matches(kp, k.Find):
		p.mode = setFind
		p.findFrom = p.cur.sel
		p.find.Open("")
	case key.Matches(kp, k.Reset):
		if err := settings.Reset(&p.pending, ki.Key); err != nil {
			p.pc.setStatus(levelBad, err.Error())
		}
	case key.Matches(kp, k.Discard):
		p.pending = p.pc.running
		p.problems = nil
		p.pc.setStatus(levelInfo, "pending edits discarded")
	case key.Matches(kp, k.Apply):
		p.askApply()
	case key.Matches(kp, k.Save):
		p.save()
	}
	return nil
}

// onEdit takes a key or a paste while a value is edited.
func (p *settingsPane) onEdit(msg tea.Msg) {
	ki := p.keyInfos[p.cur.sel]
	k := p.editKeys
	if kp, ok := msg.(tea.KeyPressMsg); ok {
		switch {
		case key.Matches(kp, k.Cancel):
			p.mode = setList
			p.edit.Blur()
			p.editErr = ""
			p.editKeys = newEditKeys()
			return
		case key.Matches(kp, k.Accept):
			if p.editErr != "" {
				return // the problem stays on screen until fixed or esc
			}
			if err := settings.Set(&p.pending, ki.Key, editValue(p.edit.Value())); err != nil {
				p.editErr = err.Error()
				return
			}
			p.mode = setList
			p.edit.Blur()
			p.editKeys = newEditKeys()
			return
		case key.Matches(kp, k.Default):
			p.edit.SetValue(ki.Default)
			p.checkEdit()
			return
		case key.Matches(kp, k.Empty):
			p.edit.SetValue("")
			p.checkEdit()
			return
		}
	}
	if p.edit.Update(msg) {
		p.checkEdit()
	}
}

// onFind takes a key or a paste while a setting's name is typed: the
// selection follows the text; esc goes back to where it was.
func (p *settingsPane) onFind(msg tea.Msg) {
	switch p.find.Update(msg) {
	case promptChanged:
		p.findKey()
	case promptAccepted:
		p.mode = setList
	case promptCancelled:
		p.mode = setList
		p.cur.sel = p.findFrom
	}
}

// findKey selects the first setting whose key is the typed text or, failing
// that, contains it.
func (p *settingsPane) findKey() {
	q := strings.ToLower(p.find.Value())
	if q == "" {
		p.cur.sel = p.findFrom
		return
	}
	for _, exact := range []bool{true, false} {
		for i, ki := range p.keyInfos {
			if exact && (ki.Key == q || strings.HasSuffix(ki.Key, "."+q)) || !exact && strings.Contains(ki.Key, q) {
				p.cur.sel = i
				return
			}
		}
	}
}

// checkEdit validates the editor's text as typed: Set on a copy of the
// pending config, then the key's own rules.
func (p *settingsPane) checkEdit() {
	ki := p.keyInfos[p.cur.sel]
	c := p.pending
	if err := settings.Set(&c, ki.Key, editValue(p.edit.Value())); err != nil {
		p.editErr = err.Error()
		return
	}
	p.editErr = ""
	var ve *settings.ValidationError
	err := settings.Validate(c, p.pendingSources())
	if err == nil {
		err = p.memoryCheck(c)
	}
	if errors.As(err, &ve) {
		for _, pr := range ve.Problems {
			if pr.Key == ki.Key || ki.Key == "l1.allow_overcommit" && pr.Key == "l1.size_gb" {
				p.editErr = fmt.Sprintf("%s = %s: %s", pr.Key, pr.Value, pr.Reason)
				return
			}
		}
	}
}

// memoryCheck is settings.CheckMemory for an edited config: a new pool
// size must fit the host's available memory plus what the running pool
// gives back (a rebuild closes it before the new one is made). An
// unchanged size, or no probe, checks nothing.
func (p *settingsPane) memoryCheck(c settings.Config) error {
	pc := p.pc
	if pc.opts.Memory == nil || c.L1.SizeBytes() == pc.running.L1.SizeBytes() {
		return nil
	}
	avail, err := pc.opts.Memory.MemAvailable()
	if err != nil {
		return nil
	}
	pool := pc.snap.Pool
	avail += min(pool.Size, max(pool.Prefaulted, pool.UsedBytes))
	return settings.CheckMemory(c, p.pendingSources(), avail)
}

// askApply shows the changes with their classes and asks to confirm.
func (p *settingsPane) askApply() {
	if p.pc.status.applying {
		p.pc.setStatus(levelWarn, "an apply is already running")
		return
	}
	p.changes = settings.Diff(p.pc.running, p.pending)
	if len(p.changes) == 0 {
		p.pc.setStatus(levelInfo, "nothing to apply: no pending edits")
		return
	}
	if !p.pendingValid("applying") {
		return
	}
	p.pc.ask(question{view: p.confirmApplyView, yes: p.startApply, no: "apply cancelled"})
}

// pendingValid validates the pending config; when it is invalid it lists
// the problems under the pane, says so in the header and returns false.
func (p *settingsPane) pendingValid(doing string) bool {
	p.problems = nil
	var ve *settings.ValidationError
	err := settings.Validate(p.pending, p.pendingSources())
	if err == nil {
		err = p.memoryCheck(p.pending)
	}
	if errors.As(err, &ve) {
		for _, pr := range ve.Problems {
			p.problems = append(p.problems, pr.String())
		}
		p.pc.setStatus(levelBad, fmt.Sprintf("INVALID: %d problem(s); fix them before %s", len(p.problems), doing))
		return false
	} else if err != nil {
		p.pc.setStatus(levelBad, "INVALID: "+err.Error())
		return false
	}
	return true
}

func (p *settingsPane) startApply() tea.Cmd {
	pc := p.pc
	pc.status.applying = true
	class := settings.Strongest(p.changes)
	pc.setStatus(levelWarn, fmt.Sprintf("%s: %s", class, changeKeys(p.changes)))
	eng, ctx, cfg, src := p.eng, p.ctx, p.pending, p.pendingSources()
	return func() tea.Msg {
		res, err := eng.Apply(ctx, cfg, src)
		return applyMsg{res: res, err: err}
	}
}

// applied takes Apply's answer: the header says what happened, a rollback
// included. The events pane has it from the engine, which records one
// event per apply; a note here would say it twice.
func (p *settingsPane) applied(msg applyMsg) {
	pc := p.pc
	pc.status.applying = false
	pc.running, pc.runSrc = p.eng.Config()
	what := changeKeys(msg.res.Changes)
	switch {
	case msg.err != nil && msg.res.RolledBack:
		pc.setStatus(levelBad, fmt.Sprintf("APPLY FAILED, ROLLED BACK to the running config: %v", strings.TrimSuffix(msg.err.Error(), " (rolled back to the running config)")))
	case msg.err != nil:
		pc.setStatus(levelBad, fmt.Sprintf("APPLY FAILED: %v", msg.err))
	default:
		text := fmt.Sprintf("applied (%s): %s", msg.res.Class, what)
		if msg.res.Class == settings.Rebuild {
			text += " - pool rebuilt, cache cleared"
		}
		var later []settings.Change
		for _, c := range msg.res.Changes {
			if c.Class == settings.NextStart {
				later = append(later, c)
			}
		}
		if len(later) > 0 {
			text += " - " + changeKeys(later) + " at the next start"
		}
		pc.setStatus(levelOK, "OK "+text)
		p.pending = pc.running
	}
}

func changeKeys(cs []settings.Change) string {
	if len(cs) == 0 {
		return "no changes"
	}
	keys := make([]string, len(cs))
	for i, c := range cs {
		keys[i] = c.Key
	}
	return strings.Join(keys, ", ")
}

// onlyHTTP reports that every restart-class change is the HTTP API's own
// (http.*): applying them restarts only its listener.
func onlyHTTP(changes []settings.Change) bool {
	for _, c := range changes {
		if c.Class == settings.Restart && !strings.HasPrefix(c.Key, "http.") {
			return false
		}
	}
	return true
}

func (p *settingsPane) confirmApplyView(w int) string {
	st := p.pc.st
	var b strings.Builder
	b.WriteString(st.Title.Render(fmt.Sprintf("Apply %d change(s)?", len(p.changes))) + "\n\n")
	for _, c := range p.changes {
		b.WriteString(fit(fmt.Sprintf("  [%s] %s: %s -> %s (%s)", strings.ToUpper(c.Class.String()), c.Key, c.Old, c.New, changeNote(c)), w) + "\n")
	}
	b.WriteString("\n")
	switch settings.Strongest(p.changes) {
	case settings.Rebuild:
		n := registeredContexts(p.pc.snap.Contexts)
		pool := p.pc.snap.Pool
		b.WriteString(st.Bad.Render("REBUILD") + fmt.Sprintf(": the cache will be cleared: %d objects, %s dropped.\n", pool.Objects, settings.BytesText(pool.UsedBytes)))
		b.WriteString(fmt.Sprintf("%d registered worker(s) must re-register.\n", n))
	case settings.Restart:
		what := "the wire server restarts; the cache and contexts are kept."
		if onlyHTTP(p.changes) {
			what = "the HTTP API restarts on its new address; the wire server, the cache and the contexts are untouched."
		}
		b.WriteString(st.Warn.Render("RESTART") + ": " + what + "\n")
	case settings.NextStart:
		b.WriteString(st.Warn.Render("NEXT START") + ": nothing restarts now; the change takes effect when kvdock starts again.\n")
	default:
		b.WriteString(st.OK.Render("LIVE") + ": applied in place.\n")
	}
	b.WriteString("A restart that fails rolls back to the running config.\n\n")
	b.WriteString("Apply? " + st.Key.Render("y") + " apply  " + st.Key.Render("n") + " cancel")
	return b.String()
}

// save writes the values set in the dashboard, applied or pending, into the
// settings file and keeps the rest of it; values that came from the
// environment, flags or defaults stay out (settings.SaveFile). With no file
// yet it creates the default one.
func (p *settingsPane) save() {
	pc := p.pc
	path := pc.opts.ConfigPath
	if path == "" {
		pc.setStatus(levelWarn, "nowhere to save: $XDG_CONFIG_HOME and $HOME are unset; start kvdock with --config PATH")
		return
	}
	src := p.pendingSources()
	if len(settings.Edited(src)) == 0 {
		pc.setStatus(levelInfo, "nothing to save: no value was set in the dashboard (values from env and flags are never saved)")
		return
	}
	if !p.pendingValid("saving") {
		return
	}
	res, err := settings.SaveFile(path, p.pending, src)
	if err != nil {
		pc.setStatus(levelBad, "SAVE FAILED: "+err.Error())
		pc.note(slog.LevelError, "save failed: "+err.Error())
		return
	}
	msg := fmt.Sprintf("saved %s to %s", strings.Join(res.Keys, ", "), res.Path)
	if res.Created {
		msg = fmt.Sprintf("created %s (mode %04o) with %s", res.Path, res.Mode, strings.Join(res.Keys, ", "))
	}
	if n := p.pendingEdits(); n > 0 {
		msg += fmt.Sprintf("; %d edit(s) saved but not applied (a applies)", n)
	}
	pc.setStatus(levelOK, "OK "+msg)
	pc.note(slog.LevelInfo, msg)
}

func (p *settingsPane) View() string {
	pc, st, w, h := p.pc, p.pc.st, p.w, p.h
	var b strings.Builder
	changes := settings.Diff(pc.running, p.pending)
	changed := map[string]settings.Change{}
	for _, c := range changes {
		changed[c.Key] = c
	}
	head := fmt.Sprintf("%d setting(s) · %d pending edit(s)", len(p.keyInfos), len(changes))
	if len(changes) > 0 {
		head += " · a to apply, u to undo"
	}
	b.WriteString(head + "\n")

	// "> * " marker, key, value, source, class. SOURCE and CLASS take
	// their longest value; a key longer than its column loses its middle
	// (the footer and the editor show it whole); VALUE takes the rest.
	cols := p.columns(w)
	b.WriteString(st.Header.Render(fit(fmt.Sprintf("    %-*s %-*s %-*s %s", cols.key, "KEY", cols.val, "VALUE", cols.src, "SOURCE", "CLASS"), w)) + "\n")

	// Room under the list: the selected key's help, the editor, problems.
	foot := p.footer(w)
	rows := max(1, h-2-strings.Count(foot, "\n")-1)
	n := len(p.keyInfos)
	start, end := p.cur.window(n, rows)
	if start > 0 {
		b.WriteString(st.Faint.Render(fmt.Sprintf("  … %d more above", start)) + "\n")
	}
	for i := start; i < end; i++ {
		ki := p.keyInfos[i]
		val := valueText(p.pending, ki)
		src := pc.runSrc[ki.Key].Kind.String()
		mark := " "
		if _, ok := changed[ki.Key]; ok {
			mark = "*"
			src = "dashboard"
			val = st.Changed.Render(fit(val, cols.val))
		} else {
			val = fit(val, cols.val)
		}
		sel := " "
		if i == p.cur.sel {
			sel = ">"
		}
		line := fmt.Sprintf("%s %s %s %s %-*s %s", sel, mark, fit(midTrunc(ki.Key, cols.key), cols.key), val, cols.src, src, ki.Class)
		if i == p.cur.sel {
			b.WriteString(st.Selected.Render(fit(line, w)) + "\n")
		} else {
			b.WriteString(fit(line, w) + "\n")
		}
	}
	if end < n {
		b.WriteString(st.Faint.Render(fmt.Sprintf("  … %d more below", n-end)) + "\n")
	}
	for i := listRows(start, end, n); i < rows; i++ {
		b.WriteString("\n")
	}
	b.WriteString(foot)
	return b.String()
}

// settingsColumns are the widths of the settings table's columns.
type settingsColumns struct{ key, val, src int }

// columns fits the table to w cells: SOURCE as wide as "dashboard", CLASS
// as its longest class ("next-start"), KEY its longest key where the
// screen allows and 28 cells at least, VALUE the rest up to 48.
func (p *settingsPane) columns(w int) settingsColumns {
	longKey, classW := 0, 0
	for _, ki := range p.keyInfos {
		longKey = max(longKey, len(ki.Key))
		classW = max(classW, len(ki.Class.String()))
	}
	c := settingsColumns{src: len("dashboard")}
	rest := w - 4 - 3 - c.src - classW // marker, separators, SOURCE, CLASS
	c.key = min(longKey, max(28, rest-48))
	c.val = max(10, min(48, rest-c.key))
	return c
}

func (p *settingsPane) footer(w int) string {
	pc, st := p.pc, p.pc.st
	ki := p.keyInfos[p.cur.sel]
	var lines []string
	lines = append(lines, st.Bold.Render(ki.Key)+": "+ki.Help)
	if ki.ReadOnly {
		lines = append(lines, "  "+readOnlyText(ki))
		adapters := settings.AdapterTexts(pc.running)
		if len(adapters) == 0 {
			lines = append(lines, "  running: none")
		}
		for i, a := range adapters {
			lines = append(lines, fmt.Sprintf("  running %d: %s", i, a))
		}
	} else {
		lines = append(lines, fmt.Sprintf("  --%s · %s · default %s · running %s", ki.Flag, ki.Env, bytesShown(ki, ki.Default), valueText(pc.running, ki)))
	}
	lines = append(lines, pc.logLine())
	if p.mode == setFind {
		lines = append(lines, p.find.View())
	}
	if p.mode == setEdit {
		lines = append(lines, p.edit.View())
		hint := editHint(ki)
		if v := editValue(p.edit.Value()); bytesKey(ki) && bytesShown(ki, v) != v {
			hint += " · " + v + " = " + bytesShown(ki, v)
		}
		if p.editErr != "" {
			lines = append(lines, st.Bad.Render("INVALID: ")+p.editErr)
		} else {
			lines = append(lines, st.OK.Render("ok")+" · "+hint)
		}
	}
	for _, pr := range p.problems {
		lines = append(lines, st.Bad.Render("INVALID: ")+pr)
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

// readOnlyText says where a key the dashboard does not edit is set.
func readOnlyText(ki settings.KeyInfo) string {
	return fmt.Sprintf("%s is read-only here: set it with --%s, %s or the settings file, then restart (6 Tiers shows the tiers)", ki.Key, ki.Flag, ki.Env)
}
