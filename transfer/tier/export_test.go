package tier

import "kvdock/core/keys"

// SetBeforeCopy installs a hook run between pinning an object and copying it.
func SetBeforeCopy(s *Set, f func(keys.ObjectKey)) { s.beforeCopy = f }

// Stop stops s's workers and jobs.
func Stop(s *Set) { s.stop() }
