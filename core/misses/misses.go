// Package misses says why a LOOKUP's chunks missed. It holds the reasons,
// the per-context tally the lookup module feeds, and the Ghost: a fixed-size
// record of keys the L1 pool recently lost (evicted, expired, cleared) or
// refused to store, so that "evicted" and "never stored" can be told apart
// without keeping the keys themselves, and the Classifier that judges each
// missed chunk from the ghost and what the pool answers of it.
//
// Objects in kvdock never expire by age: an object stays until it is
// evicted, cleared or deleted. What expires is a lock: a store reserves its
// slot under a write lock, and a worker that does not commit within the
// write TTL loses the reservation, so the chunk was never stored. That is
// the Expired reason. A Clear (POST /clear-cache, a pool change) is Cleared.
package misses

import (
	"encoding/binary"
	"hash/maphash"
	"math/bits"
	"slices"
	"strings"
	"sync"

	"kvdock/core/keys"
)

// Reason is why one chunk of a LOOKUP was not a hit.
type Reason uint8

// The reasons, in report order.
const (
	// NeverStored: no store of this key is known (nothing in the pool, in
	// the ghost, or under another layout).
	NeverStored Reason = iota
	// Evicted: the pool dropped the object to make room (LRU).
	Evicted
	// Expired: a store reserved the slot but its write lock's TTL passed
	// before the worker committed, so the object was never published.
	Expired
	// Cleared: the object was dropped by a clear of the cache or a delete.
	Cleared
	// OtherLayout: the chunk is stored for the same model name (and salt)
	// by workers of another world size, whose keys and layout differ:
	// sharing between them is impossible.
	OtherLayout
	// Refused: a store of this key was refused for space (not enough
	// evictable memory, or a lock cap).
	Refused
	// AfterMiss: the chunk is stored, but an earlier chunk of the prompt
	// missed and a LOOKUP serves a leading prefix only.
	AfterMiss
	// NumReasons is the number of reasons.
	NumReasons
)

var reasonNames = [NumReasons]string{"never_stored", "evicted", "expired", "cleared", "other_layout", "refused", "after_miss"}

// String is the reason's stable name (used in /status and as the metrics
// label).
func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// Counts is missed chunks by reason.
type Counts [NumReasons]uint64

// Total is the sum over every reason.
func (c Counts) Total() uint64 {
	var n uint64
	for _, v := range c {
		n += v
	}
	return n
}

// Add adds o to c.
func (c *Counts) Add(o *Counts) {
	for i, v := range o {
		c[i] += v
	}
}

// Map renders c by reason name, every reason present.
func (c Counts) Map() map[string]uint64 {
	m := make(map[string]uint64, NumReasons)
	for i, v := range c {
		m[Reason(i).String()] = v
	}
	return m
}

// Context is what a LOOKUP names: a model and the world size of the
// workers that store it.
type Context struct {
	Model     string
	WorldSize int
}

// ContextCounts is the tally of one context.
type ContextCounts struct {
	Context
	// Missed is the context's missed chunks by reason.
	Missed Counts
	// TierMissed is how many of them the L2 tiers were asked for and did
	// not have either.
	TierMissed uint64
}

// Report is a snapshot of a Tally.
type Report struct {
	// Total is every missed chunk by reason.
	Total      Counts
	TierMissed uint64
	// Contexts are the contexts tallied one by one, by model then world size.
	Contexts []ContextCounts
	// Other is the tally of contexts past MaxContexts, together.
	Other ContextCounts
	// GhostEntries and GhostBytes are the capacity and memory of the pool's
	// ghost (filled in by the engine, which owns both halves).
	GhostEntries int
	GhostBytes   int64
}

// For returns the counts of ctx, and false when ctx is not tallied one by one.
func (r Report) For(ctx Context) (ContextCounts, bool) {
	for _, c := range r.Contexts {
		if c.Context == ctx {
			return c, true
		}
	}
	return ContextCounts{}, false
}

// MaxContexts bounds the contexts a Tally keeps one by one; the rest are
// tallied together. Lookups reach the tally only for registered (model,
// world size) pairs, which server.max_instances bounds already; this bound
// keeps a long life of registrations from growing the map.
const MaxContexts = 256

// Tally accumulates missed chunks by context and reason. It is safe for
// concurrent use.
type Tally struct {
	mu    sync.Mutex
	total ContextCounts
	other ContextCounts
	byCtx map[Context]*ContextCounts
}

// NewTally returns an empty tally.
func NewTally() *Tally { return &Tally{byCtx: make(map[Context]*ContextCounts)} }

// Add tallies c for ctx; tierMissed of them also missed in the L2 tiers.
func (t *Tally) Add(ctx Context, c *Counts, tierMissed uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total.Missed.Add(c)
	t.total.TierMissed += tierMissed
	e, ok := t.byCtx[ctx]
	if !ok {
		if len(t.byCtx) >= MaxContexts {
			e = &t.other
		} else {
			// A clone: the name must not pin the request it came from.
			ctx.Model = strings.Clone(ctx.Model)
			e = &ContextCounts{Context: ctx}
			t.byCtx[ctx] = e
		}
	}
	e.Missed.Add(c)
	e.TierMissed += tierMissed
}

// Report returns a snapshot.
func (t *Tally) Report() Report {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := Report{Total: t.total.Missed, TierMissed: t.total.TierMissed, Other: t.other,
		Contexts: make([]ContextCounts, 0, len(t.byCtx))}
	for _, e := range t.byCtx {
		r.Contexts = append(r.Contexts, *e)
	}
	slices.SortFunc(r.Contexts, func(a, b ContextCounts) int {
		if c := strings.Compare(a.Model, b.Model); c != 0 {
			return c
		}
		return a.WorldSize - b.WorldSize
	})
	return r
}

// Ghost remembers, for a bounded number of object keys the pool recently
// lost or refused, why. It is a set-associative table of 64-bit key digests
// (8 ways a bucket, the oldest entry of a full bucket replaced first), so
// memory is fixed at creation (8 bytes an entry plus 1 byte a bucket) and
// recording or asking allocates nothing. A digest's low 3 bits carry the
// reason; two keys collide only if 61 bits of their digests match. It is
// safe for concurrent use; its lock is held for one bucket's scan.
type Ghost struct {
	mu     sync.Mutex
	seed   maphash.Seed
	slots  []uint64
	cursor []uint8 // per bucket: the way written next
	mask   uint64  // buckets - 1
}

const ways = 8

// DefaultGhostEntries is the ghost's default capacity: 65536 keys in 520
// KiB, several times the objects of a typical pool (a 64 GiB pool of 4 MiB
// chunks holds 16384).
const DefaultGhostEntries = 1 << 16

// NewGhost returns a ghost of at least entries keys (rounded up to a power
// of two, at least 8).
func NewGhost(entries int) *Ghost {
	buckets := max(1, entries/ways)
	buckets = 1 << bits.Len(uint(buckets-1))
	return &Ghost{seed: maphash.MakeSeed(), slots: make([]uint64, buckets*ways),
		cursor: make([]uint8, buckets), mask: uint64(buckets - 1)}
}

// Entries is the ghost's capacity in keys.
func (g *Ghost) Entries() int { return len(g.slots) }

// Bytes is the ghost's memory.
func (g *Ghost) Bytes() int64 { return int64(8*len(g.slots) + len(g.cursor)) }

// Digest is the ghost's digest of an object key: chunk hash, model, rank,
// KV group and salt.
func (g *Ghost) Digest(chunk *keys.Hash, model, salt string, rank, group uint32) uint64 {
	var h maphash.Hash
	h.SetSeed(g.seed)
	h.Write(chunk[:])
	var b [9]byte
	binary.LittleEndian.PutUint32(b[:4], rank)
	binary.LittleEndian.PutUint32(b[4:8], group)
	b[8] = byte(len(salt))
	h.Write(b[:])
	h.WriteString(model)
	h.WriteByte(0)
	h.WriteString(salt)
	return h.Sum64()
}

// DigestKey is Digest of k.
func (g *Ghost) DigestKey(k *keys.ObjectKey) uint64 {
	return g.Digest(&k.Chunk, k.Model, k.Salt, k.KVRank, k.Group)
}

func tagOf(d uint64) uint64 {
	t := d &^ 7
	if t == 0 {
		t = 8
	}
	return t
}

// Note records that the key of digest d went for reason r (the latest
// reason of a key wins).
func (g *Ghost) Note(d uint64, r Reason) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := (d >> 3) & g.mask
	bucket := g.slots[b*ways : b*ways+ways]
	t := tagOf(d)
	for i, e := range bucket {
		if e&^7 == t {
			bucket[i] = t | uint64(r)
			return
		}
	}
	c := g.cursor[b]
	bucket[c] = t | uint64(r)
	g.cursor[b] = (c + 1) % ways
}

// Find returns the reason recorded for digest d.
func (g *Ghost) Find(d uint64) (Reason, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := (d >> 3) & g.mask
	t := tagOf(d)
	for _, e := range g.slots[b*ways : b*ways+ways] {
		if e&^7 == t {
			return Reason(e & 7), true
		}
	}
	return 0, false
}
