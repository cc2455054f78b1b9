package l1

import (
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
}

// Kept is what a successor needs to adopt a pool: the segment, the pool's
// geometry and its table, least recently used first.
type Kept struct {
	Segment     SegmentIdentity
	Size, Align int64
	Objects     []KeptObject
}

// Adopted says what an adoption restored.
type Adopted struct {
	Objects     int   // published objects, readable again
	Bytes       int64 // their sizes rounded to the alignment
	Held        int   // objects kept for their holders until their TTL
	HeldBytes   int64
	Expired     int // locked objects whose TTL had passed: their bytes are free
	ExpiredHeld int // of those, held (never readable) ones

	// The prompt links restored: objects marked as starting a prompt, and
	// objects linked to their parent. LinksDropped are the links left out
	// (the objects themselves are adopted, unlinked), LinkDropReason the
	// first of their reasons.
	Roots, Links   int
	LinksDropped   int
	LinkDropReason string
}

// RemoveKept removes a kept segment that will not be adopted, only when it
// is still the recorded file, ours, and held by no live process; dir "" is
// /dev/shm. It reports whether it was removed.
func RemoveKept(dir string, id SegmentIdentity) (bool, error) { return segment.RemoveKept(dir, id) }
