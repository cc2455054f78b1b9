// Package tier is the L2 side of the cache: the Backend interface every tier
// (fs, resp) implements, the value header that makes a tier value safe to
// load (Encode, Verify), and the Set that runs the tiers behind the L1 pool:
// a bounded write-behind queue per tier that copies published chunks out of
// L1, and the prefetcher that loads a lookup's missing prefix from the tiers
// into L1, read-locked for the workers like an L1 hit.
//
// Nothing here ever waits on a tier for an L1 request: the queue drops and
// counts when a tier falls behind, and a lookup's tier phase ends at its load
// timeout whatever the tier does.
package tier

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"kvdock/core/keys"
	"kvdock/core/tierstate"
)

// Backend stores opaque values under string keys; the value header is
// inside the value. Implementations are safe for concurrent use, bound their
// own memory and honour ctx in every call.
type Backend interface {
	// Put stores value under key, replacing what was there.
	Put(ctx context.Context, key string, value []byte) error
	// Get returns the value under key, an error wrapping ErrNotFound when absent.
	Get(ctx context.Context, key string) ([]byte, error)
	// Has returns how many LEADING keys are present (it stops at the first absent one).
	Has(ctx context.Context, keys []string) (int, error)
	// Delete removes key; an absent key is not an error.
	Delete(ctx context.Context, key string) error
	// Stats is the backend's part of the snapshot: Type, Target, State,
	// Reason, Since, Used/Capacity, Objects, Read/WriteBytes.
	Stats() tierstate.Tier
	Close() error
}

// StateNotifier is implemented by backends that tell their state changes
// as they happen. The Set reports each one (its watcher only polls), so an
// outage shorter than a watcher tick still reaches the events pane, with
// its reason.
type StateNotifier interface {
	// NotifyState makes the backend call f with its Type, Target, State,
	// Reason and Since after every change of state. f never blocks and never
	// calls the backend; the backend may call it holding its own lock.
	NotifyState(f func(tierstate.Tier))
}

// ErrNotFound is wrapped by Backend.Get for an absent key.
var ErrNotFound = errors.New("tier: not found")

// Key is the backend key of k: the hex of the full chunk hash, the model,
// the KV rank and the salt when there is one. Two hosts with the same model
// and chunking produce the same keys, so they can share a tier; the value
// header guards the layout.
func Key(k keys.ObjectKey) string {
	var b strings.Builder
	b.Grow(2*len(k.Chunk) + len(k.Model) + len(k.Salt) + 12)
	b.WriteString(hex.EncodeToString(k.Chunk[:]))
	b.WriteByte('@')
	b.WriteString(k.Model)
	fmt.Fprintf(&b, "@%08x", k.KVRank)
	if k.Salt != "" {
		b.WriteByte('@')
		b.WriteString(k.Salt)
	}
	return b.String()
}

// Opener opens one backend from its validated adapter object.
type Opener func(ctx context.Context, adapter map[string]any, log *slog.Logger) (Backend, error)

// OpenAll opens the adapters in order (lookup order) through openers, by
// their "type". On a failure the backends already open are closed again
// and the error names the adapter by position and type.
func OpenAll(ctx context.Context, adapters []map[string]any, openers map[string]Opener, log *slog.Logger) ([]Backend, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	out := make([]Backend, 0, len(adapters))
	fail := func(err error) ([]Backend, error) {
		for _, b := range out {
			_ = b.Close()
		}
		return nil, err
	}
	for i, a := range adapters {
		typ, _ := a["type"].(string)
		open, ok := openers[typ]
		if !ok {
			return fail(fmt.Errorf("l2 adapter %d: type %q is not available", i, typ))
		}
		b, err := open(ctx, a, log.With("tier", i, "type", typ))
		if err != nil {
			return fail(fmt.Errorf("l2 adapter %d (%s): %w", i, typ, err))
		}
		out = append(out, b)
	}
	return out, nil
}
