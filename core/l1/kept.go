package l1

import (
	"fmt"

	"kvdock/core/keys"
	"kvdock/core/l1/segment"
)

// SegmentIdentity names a kept segment file beyond its name (inode, size,
// owner), so that a successor adopts only the file it was handed.
type SegmentIdentity = segment.Identity

// ErrNotAdoptable means a kept pool does not match what is recorded.
var ErrNotAdoptable = segment.ErrNotAdoptable

// KeptObject is one record of a kept pool's table.
type KeptObject struct {
	Key            keys.ObjectKey
	Offset, Length int64
	// Held objects are not readable: a write reservation handed to a
	// worker (Write), or an object cleared while workers read it. Their
	// bytes stay owned by that holder until Deadline, then are free.
	Held, Write bool
	// Readers and Holds are the read locks in force until Deadline: the
	// lookups' anonymous locks and the workers' holds.
	Readers, Holds uint32
	// Deadline is when the object's lock ends (unix ns); 0 when unlocked.
	Deadline int64

	// The prompt links (prefix.go), so that a successor's usable bytes and
	// prefix eviction order are this pool's. Parent is 1 + the index in
	// Kept.Objects of the object of the chunk before this one in its
	// prompt (0: none resident); Root says the object starts a prompt.
	// Only published objects carry them, and only to published objects.
	Parent int
	Root   bool

	// The prefix policy's order (prefix.go), so that a successor evicts in
	// this pool's order: the ticks of the pool's clock since the object's
	// last use, its reuse gap in ticks (0: none yet) and whether the gap
	// was measured (its own reuses, or a parent's it was lent). All zero:
	// adopted in the table's order.
	Age, Gap uint64
	Measured bool

	// Live marks a write reservation whose transfer the record carries
	// (Write and Held are set too): the successor adopts it as a live
	// reservation in the key index, for ClaimWrites to hand back to the
	// worker's commit; unclaimed, it ends at its deadline.
	Live bool
}

// Kept is what a successor needs to adopt a pool: the segment, the pool's
// geometry and its table, least recently used first.
type Kept struct {
	Segment     SegmentIdentity
	Size, Align int64
	Objects     []KeptObject
	MeanGap     uint64 // the prefix policy's mean reuse gap, in ticks
}

// Adopted says what an adoption restored.
type Adopted struct {
	Objects   int   // published objects, readable again
	Bytes     int64 // their sizes rounded to the alignment
	Held      int   // objects kept for their holders until their TTL
	HeldBytes int64
	Expired   int // locked objects whose TTL had passed: their bytes are free
	// Carried counts the live write reservations adopted for ClaimWrites.
	Carried     int
	ExpiredHeld int // of those, held (never readable) ones
	// The prompt links restored: objects marked as starting a prompt, and
	// objects linked to their parent. LinksDropped are the links left out
	// (the objects themselves are adopted, unlinked), LinkDropReason the
	// first of their reasons.
	Roots, Links   int
	LinksDropped   int
	LinkDropReason string
	// Clamped counts locks whose recorded deadline lay past now plus the
	// TTL of their kind: they end then, as a lock taken now would.
	Clamped int
	// Dropped is what was left out object by object (a key recorded
	// twice, a lookup's read lock past the lock caps), with the reasons.
	Dropped Drops
}

// Drops counts the parts of a kept state left out one by one, so that a
// bad or oversized part costs itself and never the whole state. Reasons
// are grouped by kind with a count and the first example, at most
// MaxDropKinds kinds (the rest are counted in N only).
type Drops struct {
	N     int
	Kinds []DropKind
}

// DropKind is one kind of drop: how many, and the first one's detail.
type DropKind struct {
	Kind    string
	N       int
	Example string
}

// MaxDropKinds bounds the kinds a Drops keeps.
const MaxDropKinds = 16

// Add counts one drop of kind, with detail saying which.
func (d *Drops) Add(kind, detail string) { d.AddN(kind, 1, detail) }

// AddN counts n drops of kind, detail saying which (the first, or all).
func (d *Drops) AddN(kind string, n int, detail string) {
	if n <= 0 {
		return
	}
	d.N += n
	for i := range d.Kinds {
		if d.Kinds[i].Kind == kind {
			d.Kinds[i].N += n
			return
		}
	}
	if len(d.Kinds) < MaxDropKinds {
		d.Kinds = append(d.Kinds, DropKind{Kind: kind, N: n, Example: detail})
	}
}

// Merge adds o's drops to d.
func (d *Drops) Merge(o Drops) {
	for _, k := range o.Kinds {
		d.AddN(k.Kind, k.N, k.Example)
	}
	if rest := o.N - o.counted(); rest > 0 {
		d.N += rest
	}
}

func (d Drops) counted() int {
	n := 0
	for _, k := range d.Kinds {
		n += k.N
	}
	return n
}

// Reasons renders one line per kind: "kind: n (first: detail)".
func (d Drops) Reasons() []string {
	out := make([]string, 0, len(d.Kinds)+1)
	for _, k := range d.Kinds {
		out = append(out, fmt.Sprintf("%s: %d (first: %s)", k.Kind, k.N, k.Example))
	}
	if rest := d.N - d.counted(); rest > 0 {
		out = append(out, fmt.Sprintf("%d more of other kinds", rest))
	}
	return out
}

// RemoveKept removes a kept segment that will not be adopted, only when it
// is still the recorded file, ours, and held by no live process; dir "" is
// /dev/shm. It reports whether it was removed.
func RemoveKept(dir string, id SegmentIdentity) (bool, error) { return segment.RemoveKept(dir, id) }
