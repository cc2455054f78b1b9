package dashboard

import (
	"strings"

	tea "charm.land/bubbletea/v2"
)

// lineEdit is a one-line text field with a steady cursor. bubbles'
// textinput would pull in a clipboard module kvdock does not otherwise need,
// and its blinking cursor wakes the program several times a second.
type lineEdit struct {
	prompt  string
	value   []rune
	pos     int
	focused bool
	// mask draws every character as '•' (secrets).
	mask bool
	st   Styles
}

func newLineEdit(st Styles, prompt string) lineEdit { return lineEdit{prompt: prompt, st: st} }

func (e *lineEdit) SetValue(s string) { e.value = []rune(s); e.pos = len(e.value) }
func (e *lineEdit) Value() string     { return string(e.value) }
func (e *lineEdit) Focus()            { e.focused = true }
func (e *lineEdit) Blur()             { e.focused = false }

// Update edits the text for a key press or a paste; it reports whether the
// message was one it understood.
func (e *lineEdit) Update(msg tea.Msg) bool {
	switch msg := msg.(type) {
	case tea.PasteMsg:
		e.insert(msg.Content)
		return true
	case tea.KeyPressMsg:
		switch msg.String() {
		case "left", "ctrl+b":
			e.pos = max(0, e.pos-1)
		case "right", "ctrl+f":
			e.pos = min(len(e.value), e.pos+1)
		case "home", "ctrl+a":
			e.pos = 0
		case "end", "ctrl+e":
			e.pos = len(e.value)
		case "backspace", "ctrl+h":
			if e.pos > 0 {
				e.value = append(e.value[:e.pos-1], e.value[e.pos:]...)
				e.pos--
			}
		case "delete", "ctrl+d":
			if e.pos < len(e.value) {
				e.value = append(e.value[:e.pos], e.value[e.pos+1:]...)
			}
		case "ctrl+u":
			e.value = e.value[e.pos:]
			e.pos = 0
		case "ctrl+k":
			e.value = e.value[:e.pos]
		case "ctrl+w", "alt+backspace":
			i := e.pos
			for i > 0 && e.value[i-1] == ' ' {
				i--
			}
			for i > 0 && e.value[i-1] != ' ' {
				i--
			}
			e.value = append(e.value[:i], e.value[e.pos:]...)
			e.pos = i
		default:
			if msg.Text == "" || msg.Mod.Contains(tea.ModCtrl) || msg.Mod.Contains(tea.ModAlt) {
				return false
			}
			e.insert(msg.Text)
		}
		return true
	}
	return false
}

func (e *lineEdit) insert(s string) {
	// One line only: control characters (newlines from a paste) are dropped.
	r := []rune(strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return -1
		}
		return r
	}, s))
	v := make([]rune, 0, len(e.value)+len(r))
	v = append(v, e.value[:e.pos]...)
	v = append(v, r...)
	v = append(v, e.value[e.pos:]...)
	e.value = v
	e.pos += len(r)
}

// View draws the prompt, the text and, when focused, a reverse-video cursor
// cell (visible without colour).
func (e *lineEdit) View() string {
	p := e.st.Key.Render(e.prompt)
	value := e.value
	if e.mask {
		value = []rune(strings.Repeat("•", len(e.value)))
	}
	if !e.focused {
		return p + string(value)
	}
	under := " "
	if e.pos < len(value) {
		under = string(value[e.pos])
	}
	after := ""
	if e.pos+1 <= len(value) {
		after = string(value[min(len(value), e.pos+1):])
	}
	return p + string(value[:e.pos]) + e.st.Selected.Render(under) + after
}
