// Package workers holds what a transfer module reports about the workers
// registered with it: each instance's context and transfer mode, the shared
// segment advertised at registration, the module-wide counters and the
// events it emits for the operator.
//
// These are the snapshot types the faces read: the transfer module
// (transfer/nongpu) fills them, core/engine puts them into its Snapshot, and
// ui/dashboard and ui/metrics show them, so no face imports the transfer
// module itself. The package holds data only.
package workers

import (
	"log/slog"
	"time"

	"kvdock/core/layout"
)

// Mode is an instance's transfer strategy.
type Mode string

// The two strategies; the dashboard shows these labels.
const (
	ModeSHM    Mode = "SHM"
	ModePickle Mode = "PICKLE"
)

// EventKind classifies an Event.
type EventKind string

// Event kinds.
const (
	EventRegister   EventKind = "register"
	EventUnregister EventKind = "unregister"
	EventFallback   EventKind = "fallback"
	EventSHMBack    EventKind = "shm_back" // a PICKLE instance committed an SHM write
	EventExpired    EventKind = "expired"
	EventNoSpace    EventKind = "no_space"
	EventError      EventKind = "error"
	// EventReaped: a silent instance was dropped by the liveness reaper.
	EventReaped EventKind = "reaped"
	// EventRemoved: the operator removed an instance (dashboard, ctl, HTTP).
	EventRemoved EventKind = "removed"
	// EventReused: an instance id registered again from another ZMQ peer was
	// taken as a new worker.
	EventReused EventKind = "reused"
)

// State is where an instance stands as far as liveness goes; the dashboard,
// /status and the metrics show these labels.
type State string

// The liveness states. Reaped and removed instances are no longer
// registered: they are remembered (a bounded few) so the operator sees
// where they went.
const (
	StateActive  State = "active"
	StateIdle    State = "idle"
	StateReaped  State = "reaped"
	StateRemoved State = "removed"
)

// States lists every state, in display order.
func States() []State { return []State{StateActive, StateIdle, StateReaped, StateRemoved} }

// Event is one line for the operator: what happened to which instance.
type Event struct {
	Time     time.Time
	Kind     EventKind
	Level    slog.Level
	Instance int64
	Message  string
}

// ContextInfo is one registered instance as the dashboard and /status show it.
type ContextInfo struct {
	InstanceID    int64
	Model         string
	WorldSize     int
	BlockSize     int
	NumLayers     int
	HiddenDimSize int
	Layout        layout.Layout
	// Groups lists a hybrid model's per-group layouts (Layout is group 0's);
	// nil for a model with one KV group.
	Groups     []layout.Layout
	MLA        bool
	Mode       Mode
	Reason     string
	Registered time.Time
	// LastRequest is the last time the instance was heard of: any request
	// naming it, a PING carrying its id, its registration.
	LastRequest time.Time
	// Peer is the ZMQ routing id (hex) that last spoke for the instance.
	Peer string
	// InFlight counts the instance's requests being served now.
	InFlight int
	// State is active, idle (silent for the idle time), reaped or removed;
	// Gone is when it was reaped or removed.
	State State
	Gone  time.Time
	// Pinged and Transferred are the two signals after which the reaper
	// applies the normal timeout instead of the registration grace.
	Pinged, Transferred bool
	Stores              int64 // COMMIT_STORE requests answered true
	StoreFailures       int64 // stores that stored nothing or not everything (no space, rejected data)
	Retrieves           int64 // PREPARE_RETRIEVE requests
	HitChunks           int64 // chunks served by successful retrieves
	BytesIn             int64 // KV bytes stored
	BytesOut            int64 // KV bytes served
}

// Stats are module-wide counters.
type Stats struct {
	Instances     int
	PendingWrites int
	PendingReads  int
	NoSpace       int64 // reservations refused for lack of space (answered as upstream: nothing reserved)
	Rejected      int64 // pickled tensors that did not match the registered layout
	Expired       int64 // pending entries dropped by TTL
	Fallbacks     int64 // SHM instances that turned out to use pickle
	Reaped        int64 // instances dropped by the liveness reaper
	Removed       int64 // instances removed by the operator
	Reused        int64 // instance ids registered again from another peer, taken as new workers
	// Conflicts counts registrations refused because their model (and world
	// size) is registered with another layout.
	Conflicts int64
	// RefusedUnregisters counts UNREGISTERs refused because they came from
	// another peer than the live one that registered the instance.
	RefusedUnregisters int64
	// ForeignCommits counts commits refused because another peer prepared
	// the transfer they name.
	ForeignCommits int64
	// Unknown counts transfer requests naming an instance that is not
	// registered, answered with the request's failure reply.
	Unknown int64
}

// Info is what registration advertises to every worker: the shared segment
// and its size, or {"", 0} for the pickle fallback, with the reason.
type Info struct {
	ShmName  string
	PoolSize int64
	Reason   string
}

// Shared reports whether workers are told to attach a segment (the worker
// only tries SHM for a non-empty name and a positive size).
func (i Info) Shared() bool { return i.ShmName != "" && i.PoolSize > 0 }

// Liveness is how silent workers are judged, as the faces show it.
type Liveness struct {
	// Reaping: the reaper runs (a profile whose PING carries the instance
	// id, and a positive timeout).
	Reaping bool
	// Timeout, Grace and Idle are --worker-reap-timeout-seconds,
	// --worker-registration-grace-seconds and --worker-idle-seconds.
	Timeout, Grace, Idle time.Duration
}
