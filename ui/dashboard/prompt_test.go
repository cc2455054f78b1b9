package dashboard

import (
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
)

// TestTextPrompt: the one component behind the contexts filter and the
// settings finder reports typing, enter and esc, and takes pastes as one
// line.
func TestTextPrompt(t *testing.T) {
	p := newTextPrompt(NewStyles(colorprofile.NoTTY), "find: ", newPromptKeys("select", "back"))
	p.Open("po")
	if ev := p.Update(keyMsg("r")); ev != promptChanged || p.Value() != "por" {
		t.Fatalf("typing: %v %q", ev, p.Value())
	}
	if ev := p.Update(tea.PasteMsg{Content: "t\n\x1b[2Jx"}); ev != promptChanged || p.Value() != "port[2Jx" {
		t.Fatalf("paste: %v %q", ev, p.Value())
	}
	if ev := p.Update(tea.KeyPressMsg{Code: 'x', Mod: tea.ModAlt}); ev != promptIgnored || p.Value() != "port[2Jx" {
		t.Fatalf("alt+x: %v %q", ev, p.Value())
	}
	if !strings.Contains(p.View(), "find: ") {
		t.Fatalf("view %q", p.View())
	}
	if ev := p.Update(keyMsg("enter")); ev != promptAccepted || p.Value() != "port[2Jx" || p.field.focused {
		t.Fatalf("enter: %v %q", ev, p.Value())
	}
	p.Open("kept")
	if ev := p.Update(keyMsg("esc")); ev != promptCancelled || p.Value() != "" || p.field.focused {
		t.Fatalf("esc: %v %q", ev, p.Value())
	}
	// A pasted find goes through the same path as typing: the selection follows.
	m := newTestModel(t, newFakeEngine(t), 80, 24)
	press(t, m, "5", "/")
	m.Update(tea.PasteMsg{Content: "ratio"})
	if k := m.settings.keyInfos[m.settings.cur.sel].Key; k != "eviction.ratio" || m.settings.mode != setFind {
		t.Fatalf("pasted find selected %s (mode %v)", k, m.settings.mode)
	}
	press(t, m, "enter")
	if m.settings.mode != setList || m.settings.keyInfos[m.settings.cur.sel].Key != "eviction.ratio" {
		t.Fatalf("after enter: mode %v key %s", m.settings.mode, m.settings.keyInfos[m.settings.cur.sel].Key)
	}
}
