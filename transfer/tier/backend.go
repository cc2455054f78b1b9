// Package tier is the L2 tier layer behind the L1 pool: the interface every
// storage backend implements and the pieces shared by the backends.
package tier

import (
	"context"
	"errors"

	"kvdock/core/tierstate"
)

// Backend stores opaque values under string keys (the value header is inside the value).
type Backend interface {
	Put(ctx context.Context, key string, value []byte) error
	Get(ctx context.Context, key string) ([]byte, error) // wraps tier.ErrNotFound when absent
	Has(ctx context.Context, keys []string) (int, error) // how many LEADING keys are present (stop at first absent)
	Delete(ctx context.Context, key string) error        // absent is not an error
	Stats() tierstate.Tier                               // backend part: Type, Target, State, Reason, Since, Used/Capacity, Objects, Read/WriteBytes
	Close() error
}

// ErrNotFound is wrapped by Get when a key is absent.
var ErrNotFound = errors.New("tier: not found")
