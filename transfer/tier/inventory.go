package tier

import (
	"context"
	"errors"
	"fmt"
)

// Inventory is implemented by backends that can list and clear their own
// objects: only the values kvdock wrote or verified (the fs tier's index
// of files whose header names their key, the resp tier's index of keys
// under its key prefix), never anything else found in the same directory
// or on the same server.
type Inventory interface {
	// Keys returns up to limit of the tier's keys, most recently used
	// first, and how many it holds in all.
	Keys(ctx context.Context, limit int) (keys []string, total int64, err error)
	// Clear removes every one of the tier's own objects and returns how
	// many went and the bytes they took.
	Clear(ctx context.Context) (objects, bytes int64, err error)
}

// ErrNoInventory means a tier's backend can neither list nor clear.
var ErrNoInventory = errors.New("tier: the backend cannot list or clear its objects")

// MaxListKeys bounds the keys one Keys call returns.
const MaxListKeys = 10000

func (s *Set) inventory(i int) (Inventory, error) {
	if i < 0 || i >= len(s.tiers) {
		return nil, fmt.Errorf("tier %d: there are %d tiers", i, len(s.tiers))
	}
	inv, ok := s.tiers[i].b.(Inventory)
	if !ok {
		return nil, fmt.Errorf("tier %d: %w", i, ErrNoInventory)
	}
	return inv, nil
}

// Keys lists up to limit (at most MaxListKeys) of tier i's keys and how
// many it holds.
func (s *Set) Keys(ctx context.Context, i, limit int) ([]string, int64, error) {
	inv, err := s.inventory(i)
	if err != nil {
		return nil, 0, err
	}
	ks, total, err := inv.Keys(ctx, min(max(limit, 0), MaxListKeys))
	if err != nil {
		return nil, 0, fmt.Errorf("tier %d: list keys: %w", i, err)
	}
	return ks, total, nil
}

// Clear removes tier i's own objects. A write still queued behind may land
// after it: what was published before the clear and not yet written.
func (s *Set) Clear(ctx context.Context, i int) (objects, bytes int64, err error) {
	inv, err := s.inventory(i)
	if err != nil {
		return 0, 0, err
	}
	objects, bytes, err = inv.Clear(ctx)
	if err != nil {
		return objects, bytes, fmt.Errorf("tier %d: clear: %w", i, err)
	}
	return objects, bytes, nil
}
