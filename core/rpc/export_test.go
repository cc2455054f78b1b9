package rpc

import (
	"os"
	"strconv"
	"time"
)

// DetectPeers is the number of peers whose detection state s keeps; read
// only after the server stopped serving or between its socket's messages in
// tests that wait for each reply.
func DetectPeers(s *Server) int {
	if s.detect == nil {
		return 0
	}
	return s.detect.size()
}

// SinceDispatch is how long ago the socket goroutine dispatched r (for
// handlers in tests: the time r waited before its handler ran).
func SinceDispatch(r *Request) time.Duration { return time.Since(r.head.start) }

// ScavengeDue drives the scavenger's decision without its ticker.
type ScavengeDue struct{ d scavengeDue }

// Tick is scavengeDue.tick; Freed is scavengeDue.freed.
func (s *ScavengeDue) Tick(msgs, moved, free int64) (run, lull bool) {
	return s.d.tick(msgs, moved, free)
}
func (s *ScavengeDue) Freed() { s.d.freed() }

// ScavengeQuiet and ScavengeAfter are the scavenger's thresholds.
const (
	ScavengeQuiet = scavengeQuiet
	ScavengeAfter = scavengeAfter
)

// Listeners counts this process's listening TCP sockets on port.
func Listeners(port int) int {
	ents, _ := os.ReadDir("/proc/self/fd")
	n := 0
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && isListener(fd, port) {
			n++
		}
	}
	return n
}
