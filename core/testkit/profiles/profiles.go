// Package profiles loads the shipped wire protocol profiles for tests, so
// a test that speaks the wire gets its message table in one line.
package profiles

import (
	"testing"

	"kvdock/assets"
	"kvdock/core/protocol"
)

// Load returns the shipped profile name (e.g. "nongpu-v1") and fails t when
// it is missing or does not parse.
func Load(t testing.TB, name string) *protocol.Profile {
	t.Helper()
	p, err := protocol.Load(name, assets.Protocol)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
