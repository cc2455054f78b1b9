// Package tierstate holds the snapshot types the faces read of each L2 tier.
package tierstate // what the faces see of each L2 tier

import "time"

// State is a tier's health.
type State string

// The states a tier can be in.
const (
	Up       State = "up"
	Down     State = "down"
	Degraded State = "degraded"
)

// Tier is one tier's snapshot.
type Tier struct {
	Index                    int    // position in lookup order (0 = tried first)
	Type                     string // "fs" | "resp"
	Target                   string // "/data/l2" or "redis://host:port" or "cluster host:port,…" — never a secret
	State                    State
	Reason                   string    // why down/degraded ("" when up)
	Since                    time.Time // last state change
	UsedBytes, CapacityBytes int64
	Objects                  int64
	Hits, Misses, Corrupt    uint64 // Corrupt = values rejected by header/checksum (counted by T1's layer)
	QueueDepth               int
	QueueBytes               int64
	DroppedWrites            uint64
	ReadBytes, WriteBytes    uint64 // totals; faces derive GB/s from deltas
	Loads, LoadTimeouts      uint64 // prefetch loads done / given up
}
