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
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"strings"

	"kvdock/core/keys"
	"kvdock/core/layout"
	"kvdock/core/tierstate"
	"kvdock/settings"
)

// Backend stores opaque values under string keys; the value header is
// inside the value. Implementations are safe for concurrent use, bound their
// own memory and honour ctx in every call.
type Backend interface {
	// Put stores value under key, replacing what was there. value is
	// the caller's again once Put returns (the write-behind writers reuse
	// it for the next value): a backend that keeps it keeps a copy, and
	// one whose client may still read it after an early return waits for
	// that read.
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

// ContentNotifier is implemented by backends that tell, as it happens and
// in their own order, each value this process put that they came to hold
// (present) and each such value they no longer hold (evicted, deleted,
// cleared, expired, found gone), once each. A rewrite of a value still held
// tells nothing. f never blocks and never calls the backend; the backend
// may call it holding its own lock (that lock orders the calls).
type ContentNotifier interface {
	NotifyContents(f func(key string, present bool))
}

// ErrNotFound is wrapped by Backend.Get for an absent key.
var ErrNotFound = errors.New("tier: not found")

// Key is the backend key of k stored with layout lay (in the value format
// of this Version):
//
//	<hex of the full chunk hash>@<model>@<KV rank, 8 hex>[/g<group>]@<Fingerprint(lay)>[@<salt>]
//
// The KV group (object_group_id) appears for groups other than 0, so a
// hybrid model's groups never share a key even when two of them have the
// same layout, and every other model keeps the names it always had.
// Two hosts with the same model, chunking and layout produce the same keys,
// so they share a tier. Hosts that register the same model name with another
// layout (another dtype, hidden size, layer count or chunk size) get other
// keys: they neither overwrite nor reject-and-delete each other's values.
// The value header still guards the full layout, for a fingerprint that
// collides.
func Key(k keys.ObjectKey, lay layout.Layout) string {
	var b strings.Builder
	b.Grow(2*len(k.Chunk) + len(k.Model) + len(k.Salt) + 21)
	b.WriteString(hex.EncodeToString(k.Chunk[:]))
	b.WriteByte('@')
	b.WriteString(k.Model)
	fmt.Fprintf(&b, "@%08x", k.KVRank)
	if k.Group != 0 {
		fmt.Fprintf(&b, "/g%d", k.Group)
	}
	b.WriteByte('@')
	b.WriteString(Fingerprint(lay))
	if k.Salt != "" {
		b.WriteByte('@')
		b.WriteString(k.Salt)
	}
	return b.String()
}

// Fingerprint is the 8 lower-case hex digits of the CRC-32C (Castagnoli) of
// the value format version (u16 little-endian) and lay's shape and dtype
// encoded as in the value header: dims u8, each dim i64 little-endian, dtype
// length u8, dtype. The chunk size is one of the dims, so it is covered
// too; another format version also gets other keys.
func Fingerprint(lay layout.Layout) string {
	var buf [2 + 1 + 8*maxDims + 1 + maxDtype]byte
	b := binary.LittleEndian.AppendUint16(buf[:0], Version)
	return fmt.Sprintf("%08x", crc32.Checksum(appendLayout(b, lay), castagnoli))
}

// Opener opens one backend from its validated adapter.
type Opener func(ctx context.Context, adapter settings.Adapter, log *slog.Logger) (Backend, error)

// OpenAll opens the adapters in order (lookup order) through openers, by
// their "type". On a failure the backends already open are closed again
// and the error names the adapter by position and type.
func OpenAll(ctx context.Context, adapters []settings.Adapter, openers map[string]Opener, log *slog.Logger) ([]Backend, error) {
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
		typ := a.Type
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
