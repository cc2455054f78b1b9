// Package tierstate holds what the faces see of each L2 tier: a plain
// snapshot type, so the dashboard and the HTTP API read tier state without
// importing the transfer modules that run the tiers.
package tierstate

import "time"

// State is a tier's health as shown to operators.
type State string

const (
	Up       State = "up"
	Down     State = "down"
	Degraded State = "degraded"
)

// Tier is one L2 tier's snapshot.
type Tier struct {
	Index                    int    // position in lookup order (0 = tried first)
	Type                     string // "fs" | "resp"
	Target                   string // "/data/l2" or "redis://host:port" or "cluster host:port,…" — never a secret
	State                    State
	Reason                   string    // why down/degraded ("" when up)
	Since                    time.Time // last state change
	UsedBytes, CapacityBytes int64
	Objects                  int64
	Hits, Misses, Corrupt    uint64 // Corrupt = values rejected by header/checksum (counted by the tier layer)
	QueueDepth               int
	QueueBytes               int64
	DroppedWrites            uint64
	ReadBytes, WriteBytes    uint64 // totals; faces derive GB/s from deltas
	Loads, LoadTimeouts      uint64 // prefetch loads done / given up
}
