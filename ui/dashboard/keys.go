package dashboard

import "charm.land/bubbles/v2/key"

// globalKeys work in every pane unless a text field has the keyboard.
type globalKeys struct {
	Next, Prev, Jump, Help, Quit, ForceQuit, ResetStats key.Binding
}

func newGlobalKeys() globalKeys {
	return globalKeys{
		Next:      key.NewBinding(key.WithKeys("tab"), key.WithHelp("tab", "next pane")),
		Prev:      key.NewBinding(key.WithKeys("shift+tab"), key.WithHelp("shift+tab", "prev pane")),
		Jump:      key.NewBinding(key.WithKeys("1", "2", "3", "4", "5", "6"), key.WithHelp("1-6", "go to pane")),
		Help:      key.NewBinding(key.WithKeys("?"), key.WithHelp("?", "help")),
		Quit:      key.NewBinding(key.WithKeys("q"), key.WithHelp("q", "quit")),
		ForceQuit: key.NewBinding(key.WithKeys("ctrl+c"), key.WithHelp("ctrl+c", "quit now")),
		// Z for zero: the other capitals sort the contexts table.
		ResetStats: key.NewBinding(key.WithKeys("Z"), key.WithHelp("Z", "zero stats")),
	}
}

func (k globalKeys) list() []key.Binding {
	return []key.Binding{k.Next, k.Prev, k.Jump, k.Help, k.Quit, k.ForceQuit, k.ResetStats}
}

// listKeys move a selection.
type listKeys struct {
	Up, Down, Top, Bottom, PageUp, PageDown key.Binding
}

func newListKeys() listKeys {
	return listKeys{
		Up:       key.NewBinding(key.WithKeys("up", "k"), key.WithHelp("↑/k", "up")),
		Down:     key.NewBinding(key.WithKeys("down", "j"), key.WithHelp("↓/j", "down")),
		Top:      key.NewBinding(key.WithKeys("home", "g"), key.WithHelp("g", "top")),
		Bottom:   key.NewBinding(key.WithKeys("end", "G"), key.WithHelp("G", "bottom")),
		PageUp:   key.NewBinding(key.WithKeys("pgup", "ctrl+u"), key.WithHelp("pgup/ctrl+u", "page up")),
		PageDown: key.NewBinding(key.WithKeys("pgdown", "ctrl+d"), key.WithHelp("pgdn/ctrl+d", "page down")),
	}
}

func (k listKeys) list() []key.Binding {
	return []key.Binding{k.Up, k.Down, k.PageUp, k.PageDown, k.Top, k.Bottom}
}

// contextKeys is the contexts table's key map. SortBy takes the
// shift+letter of each column (ctxColumn.key): pressing the sort column's
// letter again reverses the order.
type contextKeys struct {
	listKeys
	SortBy, Sort, Filter, Details, Clear, Remove key.Binding
}

func newContextKeys() contextKeys {
	letters := make([]string, 0, len(ctxColumns))
	for _, c := range ctxColumns {
		letters = append(letters, string(c.key))
	}
	return contextKeys{
		listKeys: newListKeys(),
		SortBy:   key.NewBinding(key.WithKeys(letters...), key.WithHelp("⇧+letter", "sort")),
		Sort:     key.NewBinding(key.WithKeys("s"), key.WithHelp("s", "next sort")),
		Filter:   key.NewBinding(key.WithKeys("/"), key.WithHelp("/", "filter")),
		Details:  key.NewBinding(key.WithKeys("enter"), key.WithHelp("enter", "details")),
		Clear:    key.NewBinding(key.WithKeys("esc"), key.WithHelp("esc", "close/clear filter")),
		Remove:   key.NewBinding(key.WithKeys("x"), key.WithHelp("x", "remove worker")),
	}
}

func (k contextKeys) list() []key.Binding {
	return append([]key.Binding{k.Filter, k.SortBy, k.Details, k.Sort, k.Clear, k.Remove}, k.listKeys.list()...)
}

// eventKeys scroll and filter the events pane.
type eventKeys struct {
	listKeys
	Filter, Level, Clear key.Binding
}

func newEventKeys() eventKeys {
	return eventKeys{
		listKeys: newListKeys(),
		Filter:   key.NewBinding(key.WithKeys("/"), key.WithHelp("/", "filter text")),
		Level:    key.NewBinding(key.WithKeys("l"), key.WithHelp("l", "min level")),
		Clear:    key.NewBinding(key.WithKeys("esc"), key.WithHelp("esc", "clear filters")),
	}
}

func (k eventKeys) list() []key.Binding {
	return append([]key.Binding{k.Filter, k.Level, k.Clear}, k.listKeys.list()...)
}

// settingsKeys is the settings list's key map.
type settingsKeys struct {
	listKeys
	Edit, Find, Reset, Discard, Apply, Save key.Binding
}

func newSettingsKeys() settingsKeys {
	return settingsKeys{
		listKeys: newListKeys(),
		Edit:     key.NewBinding(key.WithKeys("enter", "e"), key.WithHelp("enter", "edit")),
		Find:     key.NewBinding(key.WithKeys("/"), key.WithHelp("/", "find key")),
		Reset:    key.NewBinding(key.WithKeys("r"), key.WithHelp("r", "reset to default")),
		Discard:  key.NewBinding(key.WithKeys("u"), key.WithHelp("u", "undo all edits")),
		Apply:    key.NewBinding(key.WithKeys("a"), key.WithHelp("a", "apply")),
		Save:     key.NewBinding(key.WithKeys("w"), key.WithHelp("w", "save to config file")),
	}
}

func (k settingsKeys) list() []key.Binding {
	return append([]key.Binding{k.Edit, k.Find, k.Apply, k.Save, k.Reset, k.Discard}, k.listKeys.list()...)
}

// editKeys is the key map of the value editor.
type editKeys struct {
	Accept, Cancel, Default, Empty key.Binding
}

func newEditKeys() editKeys {
	return editKeys{
		Accept:  key.NewBinding(key.WithKeys("enter"), key.WithHelp("enter", "accept")),
		Cancel:  key.NewBinding(key.WithKeys("esc"), key.WithHelp("esc", "cancel")),
		Default: key.NewBinding(key.WithKeys("ctrl+r"), key.WithHelp("ctrl+r", "default")),
		Empty:   key.NewBinding(key.WithKeys("ctrl+u"), key.WithHelp("ctrl+u", "clear")),
	}
}

func (k editKeys) list() []key.Binding { return []key.Binding{k.Accept, k.Cancel, k.Default, k.Empty} }

// confirmKeys answer a yes/no question.
type confirmKeys struct {
	Yes, No key.Binding
}

func newConfirmKeys() confirmKeys {
	return confirmKeys{
		Yes: key.NewBinding(key.WithKeys("y", "Y"), key.WithHelp("y", "yes")),
		No:  key.NewBinding(key.WithKeys("n", "N", "esc"), key.WithHelp("n/esc", "no")),
	}
}

func (k confirmKeys) list() []key.Binding { return []key.Binding{k.Yes, k.No} }

// keyMap is the keys every view shares; each pane has its own beside
// them, and the help bar and the help screen are generated from the ones
// in use.
type keyMap struct {
	Global  globalKeys
	List    listKeys
	Confirm confirmKeys
}

func newKeyMap() keyMap {
	return keyMap{Global: newGlobalKeys(), List: newListKeys(), Confirm: newConfirmKeys()}
}
