package keys

import (
	"errors"
	"fmt"
	"strings"
)

// MaxSaltLen is the longest accepted cache_salt, in bytes.
const MaxSaltLen = 128

// MaxModelLen and MaxRequestIDLen bound model_name and request_id, in bytes.
// Both are held (sessions, lookup jobs, instances) and shown (logs, /status);
// real ones are tens of bytes.
const (
	MaxModelLen     = 256
	MaxRequestIDLen = 256
)

// ValidateSalt checks a cache_salt: at most MaxSaltLen bytes, and none of
// '@', '/', '\\' or NUL, which would break the "@"-joined key strings and
// path-like storage names other backends build from it. "" (no salt) is valid.
func ValidateSalt(s string) error {
	if len(s) > MaxSaltLen {
		return fmt.Errorf("cache_salt %s is %d bytes: at most %d allowed", Clip(s), len(s), MaxSaltLen)
	}
	if i := strings.IndexAny(s, "@/\\\x00"); i >= 0 {
		return fmt.Errorf("cache_salt %q contains %q at byte %d: '@', '/', '\\' and NUL are not allowed", s, s[i], i)
	}
	return nil
}

// ValidateModel checks a model_name: non-empty, at most MaxModelLen bytes and
// without '@', the separator of serialised ObjectKeys.
func ValidateModel(s string) error {
	if s == "" {
		return errors.New("model_name is empty")
	}
	if len(s) > MaxModelLen {
		return fmt.Errorf("model_name %s is %d bytes: at most %d allowed", Clip(s), len(s), MaxModelLen)
	}
	if i := strings.IndexByte(s, '@'); i >= 0 {
		return fmt.Errorf("model_name %q contains '@' at byte %d: not allowed", s, i)
	}
	return nil
}

// ValidateRequestID checks a request_id: at most MaxRequestIDLen bytes. Any
// content is accepted, as upstream; "" is a valid id.
func ValidateRequestID(s string) error {
	if len(s) > MaxRequestIDLen {
		return fmt.Errorf("request_id %s is %d bytes: at most %d allowed", Clip(s), len(s), MaxRequestIDLen)
	}
	return nil
}

// clipLen is how much of a peer's string an error message quotes.
const clipLen = 32

// Clip quotes s for an error message, cut to its first 32 bytes with the
// length noted, so that a peer's oversized string does not end up whole in
// replies and logs.
func Clip(s string) string {
	if len(s) <= clipLen {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q… (%d bytes)", s[:clipLen], len(s))
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
