package assets

import _ "embed"

//go:embed kvdock.yaml
var defaultConfig []byte

// DefaultConfig returns the annotated default settings file that
// `kvdock config init` writes: every key with its default and one line on
// what it does. The slice is a copy; callers may keep or change it.
func DefaultConfig() []byte {
	return append([]byte(nil), defaultConfig...)
}
