// Package tierstate holds what the faces (dashboard, /status, /metrics) see
// of each L2 tier: one plain snapshot value per tier, copied out of the tier
// layer on every engine snapshot. It is a core leaf: it imports only the
// standard library, so the engine, the transfer tiers and the faces can all
// share it without importing each other.
package tierstate

import "time"

// State is a tier's health as the faces show it.
type State string

// The states a tier can be in.
const (
	// Up: the tier answers and takes writes.
	Up State = "up"
	// Down: the tier cannot be reached; lookups skip it and writes are dropped.
	Down State = "down"
	// Degraded: the tier answers but not fully (full, slow, refusing writes).
	Degraded State = "degraded"
)

// Tier is one L2 tier at the moment of a snapshot. Counters are totals since
// the tier was opened; faces derive rates from deltas between snapshots.
type Tier struct {
	Index  int    // position in lookup order (0 = tried first)
	Type   string // "fs" | "resp"
	Target string // "/data/l2" or "redis://host:port" or "cluster host:port,…" — never a secret
	State  State
	Reason string    // why down/degraded ("" when up)
	Since  time.Time // last state change

	UsedBytes, CapacityBytes int64
	Objects                  int64

	Hits, Misses, Corrupt uint64 // Corrupt = values rejected by header/checksum

	QueueDepth    int
	QueueBytes    int64
	DroppedWrites uint64

	ReadBytes, WriteBytes uint64 // totals; faces derive GB/s from deltas
	Loads, LoadTimeouts   uint64 // prefetch loads done / given up
}
