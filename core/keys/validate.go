package keys

import (
	"errors"
	"fmt"
	"strings"
)

// MaxSaltLen is the longest accepted cache_salt, in bytes.
const MaxSaltLen = 128

// ValidateSalt checks a cache_salt: at most MaxSaltLen bytes, and none of
// '@', '/', '\\' or NUL, which would break the "@"-joined key strings and
// path-like storage names other backends build from it. "" (no salt) is valid.
func ValidateSalt(s string) error {
	if len(s) > MaxSaltLen {
		return fmt.Errorf("cache_salt is %d bytes: at most %d allowed", len(s), MaxSaltLen)
	}
	if i := strings.IndexAny(s, "@/\\\x00"); i >= 0 {
		return fmt.Errorf("cache_salt %q contains %q at byte %d: '@', '/', '\\' and NUL are not allowed", s, s[i], i)
	}
	return nil
}

// ValidateModel checks a model_name: non-empty and without '@', the separator
// of serialised ObjectKeys.
func ValidateModel(s string) error {
	if s == "" {
		return errors.New("model_name is empty")
	}
	if i := strings.IndexByte(s, '@'); i >= 0 {
		return fmt.Errorf("model_name %q contains '@' at byte %d: not allowed", s, i)
	}
	return nil
}

// MaxWorldSize is the largest world size a KV rank can encode (8 bits each).
const MaxWorldSize = 255

func validateRanks(worldSize int, worker *int) error {
	if worldSize < 1 || worldSize > MaxWorldSize {
		return fmt.Errorf("world_size %d: must be between 1 and %d", worldSize, MaxWorldSize)
	}
	if worker != nil && (*worker < 0 || *worker >= worldSize) {
		return fmt.Errorf("worker_id %d: must be between 0 and world_size-1 (%d)", *worker, worldSize-1)
	}
	return nil
}
