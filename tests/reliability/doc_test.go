// Package reliability holds kvdock's hostile-peer, bad-input, fault,
// pressure, soak and secure-default tests. They drive the real binary
// through tests/harness, or an in-process engine.Engine where the test needs
// to apply settings or read the Go runtime's figures. The restarts and the
// eviction replay have packages of their own below this one.
// docs/RELIABILITY.md describes each scenario and the figures measured.
package reliability

import "kvdock/core/protocol"

// slot is the wire's slot descriptor; the tests read slots as the shared
// worker client decodes them.
type slot = protocol.Slot
