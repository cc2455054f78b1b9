// Package tier is the consumer side of the L2 tiers: the interface every
// backend implements.
package tier

import (
	"context"
	"errors"

	"kvdock/core/tierstate"
)

// Backend stores opaque values under string keys (T1's header is inside the value).
type Backend interface {
	Put(ctx context.Context, key string, value []byte) error
	Get(ctx context.Context, key string) ([]byte, error) // wraps tier.ErrNotFound when absent
	Has(ctx context.Context, keys []string) (int, error) // how many LEADING keys are present (stop at first absent)
	Delete(ctx context.Context, key string) error        // absent is not an error
	Stats() tierstate.Tier                               // backend part: Type, Target, State, Reason, Since, Used/Capacity, Objects, Read/WriteBytes
	Close() error
}

// ErrNotFound is wrapped by Get when the key is absent.
var ErrNotFound = errors.New("tier: not found")
