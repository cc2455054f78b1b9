package dashboard

import (
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
)

// promptKeys end a prompt: Accept keeps what was typed, Cancel drops it.
type promptKeys struct {
	Accept, Cancel key.Binding
}

func newPromptKeys(acceptHelp, cancelHelp string) promptKeys {
	return promptKeys{
		Accept: key.NewBinding(key.WithKeys("enter"), key.WithHelp("enter", acceptHelp)),
		Cancel: key.NewBinding(key.WithKeys("esc"), key.WithHelp("esc", cancelHelp)),
	}
}

func (k promptKeys) list() []key.Binding { return []key.Binding{k.Accept, k.Cancel} }

// promptEvent is what a key press or a paste did to a prompt.
type promptEvent int

const (
	promptIgnored   promptEvent = iota // not a key the prompt uses
	promptChanged                      // the text changed (or the cursor moved)
	promptAccepted                     // enter: the prompt closed, text kept
	promptCancelled                    // esc: the prompt closed, text cleared
)

// textPrompt is a one-line query the operator types while it has the
// keyboard (the contexts filter, the settings finder): the pane reacts to
// each change as typed and to its closing.
type textPrompt struct {
	field lineEdit
	keys  promptKeys
}

func newTextPrompt(st Styles, prompt string, keys promptKeys) textPrompt {
	return textPrompt{field: newLineEdit(st, prompt), keys: keys}
}

// Open gives the prompt the keyboard, starting from value.
func (p *textPrompt) Open(value string) {
	p.field.SetValue(value)
	p.field.Focus()
}

// Value is the text typed so far.
func (p *textPrompt) Value() string { return p.field.Value() }

// Update takes a key press or a paste while the prompt is open.
func (p *textPrompt) Update(msg tea.Msg) promptEvent {
	if k, ok := msg.(tea.KeyPressMsg); ok {
		switch {
		case key.Matches(k, p.keys.Accept):
			p.field.Blur()
			return promptAccepted
		case key.Matches(k, p.keys.Cancel):
			p.field.Blur()
			p.field.SetValue("")
			return promptCancelled
		}
	}
	if p.field.Update(msg) {
		return promptChanged
	}
	return promptIgnored
}

// View draws the prompt and its text.
func (p *textPrompt) View() string { return p.field.View() }
