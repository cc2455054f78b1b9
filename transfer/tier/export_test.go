package tier

import "kvdock/core/keys"

// SetBeforeCopy installs a hook run between pinning an object and copying it.
func SetBeforeCopy(s *Set, f func(keys.ObjectKey)) { s.beforeCopy = f }

// Stop stops s's workers and jobs.
func Stop(s *Set) { s.stop() }

// HoldTierPhase makes s count one more lookup in its tier phase until the
// returned func is called.
func HoldTierPhase(s *Set) func() {
	s.jobs <- struct{}{}
	return func() { <-s.jobs }
}
