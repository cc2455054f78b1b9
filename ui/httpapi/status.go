package httpapi

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"kvdock/core/engine"
	"kvdock/core/workers"
)

// Status is the /status document. The first block keeps upstream's
// report_status names (an SDK reads chunk_size, shm_name and world_size);
// the rest is kvdock's own. Field names are stable.
type Status struct {
	IsHealthy                    bool                   `json:"is_healthy"`
	EngineType                   string                 `json:"engine_type"`
	ChunkSize                    int                    `json:"chunk_size"`
	HashAlgorithm                string                 `json:"hash_algorithm"`
	ActiveSessions               int                    `json:"active_sessions"`
	RegisteredNonCudaInstanceIDs []int64                `json:"registered_non_cuda_instance_ids"`
	NonCudaContextMeta           map[string]ContextMeta `json:"non_cuda_context_meta"`
	ActivePrefetchJobs           int                    `json:"active_prefetch_jobs"`
	StorageManager               StorageManager         `json:"storage_manager"`

	State    string `json:"state"`
	Error    string `json:"error,omitempty"`
	Endpoint string `json:"endpoint"`
	Protocol string `json:"protocol"`
	// ProtocolDetection is --protocol auto's view: the default profile and
	// the peers settled on each (protocol stays the configured name).
	ProtocolDetection ProtocolDetectionStatus `json:"protocol_detection"`
	TransferMode      string                  `json:"transfer_mode"`
	Version           string                  `json:"version"`
	StartedAt         *time.Time              `json:"started_at,omitempty"`
	UptimeSeconds     float64                 `json:"uptime_seconds"`
	TakenAt           time.Time               `json:"taken_at"`

	// ShmName and PoolSize are what REGISTER answers every worker ("" and 0:
	// pickle for everyone); ShmReason says why.
	ShmName   string `json:"shm_name"`
	PoolSize  int64  `json:"pool_size"`
	ShmReason string `json:"shm_reason"`
	ShmShared bool   `json:"shm_shared"`

	Pool PoolStatus `json:"pool"`
	// Contexts details at most MaxContextDetail contexts, the most recently
	// active; ContextsOmitted counts the others (every registered one is in
	// registered_non_cuda_instance_ids and non_cuda_context_meta).
	Contexts        []ContextStatus `json:"contexts"`
	ContextsOmitted int             `json:"contexts_omitted"`
	Transfer        TransferStatus  `json:"transfer"`
	// WorkerLiveness has upstream's name and fields.
	WorkerLiveness WorkerLiveness `json:"worker_liveness"`
	Lookup         LookupStatus   `json:"lookup"`
	Misses         MissesStatus   `json:"misses"`
	Host           HostStatus     `json:"host"`
	Requests       RequestsStatus `json:"requests"`
	GPU            GPUStatus      `json:"gpu"`
	// Tiers are the L2 tiers in lookup order ([] when none is configured).
	Tiers  []TierStatus  `json:"tiers"`
	Events []EventStatus `json:"events"`
	// KVEvents is the KV event stream for routers (docs/EVENTS.md).
	KVEvents engine.KVEventsStatus `json:"kv_events"`
	// Rates is the last minute of rates; TokensSaved the prefill tokens
	// served from cache.
	Rates       RatesStatus       `json:"rates"`
	TokensSaved TokensSavedStatus `json:"tokens_saved"`
	// WhatIf is the estimated hit ratio of other pool sizes.
	WhatIf WhatIfStatus `json:"whatif"`
	// StatsSince is when the insight figures (hit ratio, tokens saved,
	// miss breakdown, what-if) started: the start or the last reset
	// (StatsResetAt, POST /reset-stats); each figure also says its window.
	StatsSince   *time.Time `json:"stats_since,omitempty"`
	StatsResetAt *time.Time `json:"stats_reset_at,omitempty"`
	// StatsRule says what the figures span across rebuilds and restarts
	// (engine.StatsRule); StatsCarriedAt is when this process took its
	// predecessor's figures over (absent when it did not).
	StatsRule      string     `json:"stats_rule"`
	StatsCarriedAt *time.Time `json:"stats_carried_at,omitempty"`
	// Restart is what this start adopted of the previous process's pool.
	Restart RestartStatus `json:"restart"`
}

// TierStatus is one L2 tier: its state with the reason, its figures and its
// counters (totals since it was opened). Target never holds a secret.
type TierStatus struct {
	Index         int        `json:"index"`
	Type          string     `json:"type"`
	Target        string     `json:"target"`
	State         string     `json:"state"`
	Reason        string     `json:"reason,omitempty"`
	Since         *time.Time `json:"since,omitempty"`
	UsedBytes     int64      `json:"used_bytes"`
	CapacityBytes int64      `json:"capacity_bytes"`
	Objects       int64      `json:"objects"`
	Hits          uint64     `json:"hits"`
	Misses        uint64     `json:"misses"`
	Corrupt       uint64     `json:"corrupt"`
	QueueDepth    int        `json:"queue_depth"`
	QueueBytes    int64      `json:"queue_bytes"`
	DroppedWrites uint64     `json:"dropped_writes"`
	ReadBytes     uint64     `json:"read_bytes"`
	WriteBytes    uint64     `json:"write_bytes"`
	Loads         uint64     `json:"loads"`
	LoadTimeouts  uint64     `json:"load_timeouts"`
}

// ContextMeta is upstream's non_cuda_context_meta entry.
type ContextMeta struct {
	ModelName string `json:"model_name"`
	WorldSize int    `json:"world_size"`
	BlockSize int    `json:"block_size"`
	UseMLA    bool   `json:"use_mla"`
	// NumGroups is a hybrid model's KV group count (kvdock's addition; absent
	// for a model with one group, as upstream's meta has no such key).
	NumGroups int `json:"num_groups,omitempty"`
}

// StorageManager is the verified part of upstream's storage_manager report.
type StorageManager struct {
	IsHealthy            bool               `json:"is_healthy"`
	L1EvictionController EvictionController `json:"l1_eviction_controller"`
}

// EvictionController is upstream's l1_eviction_controller report.
type EvictionController struct {
	IsHealthy        bool    `json:"is_healthy"`
	ThreadAlive      bool    `json:"thread_alive"`
	EvictionPolicy   string  `json:"eviction_policy"`
	TriggerWatermark float64 `json:"trigger_watermark"`
	EvictionRatio    float64 `json:"eviction_ratio"`
}

// PoolStatus is the L1 pool as built (segment or anonymous, and why) and
// its figures.
type PoolStatus struct {
	Segment       string  `json:"segment"`
	Shared        bool    `json:"shared"`
	Reason        string  `json:"reason"`
	ShmFreeBytes  int64   `json:"shm_free_bytes"`
	CapacityBytes int64   `json:"capacity_bytes"`
	UsedBytes     int64   `json:"used_bytes"`
	UsageRatio    float64 `json:"usage_ratio"`
	// usable_bytes is what of resident_bytes a LOOKUP can reach (first
	// chunks, and chunks whose previous chunk is resident); usable_ratio
	// is their ratio (1 when nothing is resident).
	ResidentBytes      int64   `json:"resident_bytes"`
	UsableBytes        int64   `json:"usable_bytes"`
	UsableRatio        float64 `json:"usable_ratio"`
	Objects            int     `json:"objects"`
	FreeExtents        int     `json:"free_extents"`
	PrefaultedBytes    int64   `json:"prefaulted_bytes"`
	WriteLocked        int     `json:"write_locked"`
	ReadLocked         int     `json:"read_locked"`
	Evictions          uint64  `json:"evictions"`
	EvictionLoopTicks  uint64  `json:"eviction_loop_ticks"`
	AllocationFailures uint64  `json:"allocation_failures"`
	ReadHits           uint64  `json:"read_hits"`
	ReadMisses         uint64  `json:"read_misses"`
	WriteReservations  uint64  `json:"write_reservations"`
	WriteExisting      uint64  `json:"write_existing"`
	ExpiredWriteLocks  uint64  `json:"expired_write_locks"`
	ExpiredReadLocks   uint64  `json:"expired_read_locks"`
	EvictionPolicy     string  `json:"eviction_policy"`
	TriggerWatermark   float64 `json:"trigger_watermark"`
	EvictionRatio      float64 `json:"eviction_ratio"`
	WriteTTLSeconds    float64 `json:"write_ttl_seconds"`
	ReadTTLSeconds     float64 `json:"read_ttl_seconds"`
	// Live extents and locks: live_bytes is the sum of the records'
	// allocations (doomed included) and equals used_bytes unless space
	// leaked; doomed objects are ones a clear dropped while a transfer
	// still held them.
	LiveBytes         int64  `json:"live_bytes"`
	LockedBytes       int64  `json:"locked_bytes"`
	DoomedObjects     int    `json:"doomed_objects"`
	DoomedBytes       int64  `json:"doomed_bytes"`
	LockOwners        int    `json:"lock_owners"`
	Views             int    `json:"views"`
	WriteDoomed       uint64 `json:"write_doomed"`
	StaleFinishes     uint64 `json:"stale_finishes"`
	LockCapRefusals   uint64 `json:"lock_cap_refusals"`
	OwnerLockCapBytes int64  `json:"owner_lock_cap_bytes"`
	TotalLockCapBytes int64  `json:"total_lock_cap_bytes"`

	// PrivateSegment is the unadvertised segment behind a pool that is not
	// shared (--shm-name ""), which a restart keeps; "" for shared or
	// anonymous memory.
	PrivateSegment string `json:"private_segment,omitempty"`
	// bench_bytes is what benchmark traffic (kvdock bench's models) holds
	// of used_bytes; it may use at most the room below the watermark the
	// other models leave, and never evicts their chunks.
	BenchBytes    int64  `json:"bench_bytes"`
	BenchRefusals uint64 `json:"bench_refusals"`
	// admission_refusals counts the new chunks a store got no slot for
	// under the prefix policy: the leaf it would have evicted was due back
	// before them and was neither late nor unused since its store (the
	// store keeps its leading chunks).
	AdmissionRefusals uint64 `json:"admission_refusals"`
}

// ContextStatus is one registered worker context: its layout, its transfer
// mode (SHM or PICKLE) with the reason, and its counters.
type ContextStatus struct {
	InstanceID    int64  `json:"instance_id"`
	ModelName     string `json:"model_name"`
	WorldSize     int    `json:"world_size"`
	BlockSize     int    `json:"block_size"`
	NumLayers     int    `json:"num_layers"`
	HiddenDimSize int    `json:"hidden_dim_size"`
	UseMLA        bool   `json:"use_mla"`
	Dtype         string `json:"dtype"`
	Shape         []int  `json:"shape"`
	ChunkBytes    int64  `json:"chunk_bytes"`
	// Groups lists a hybrid model's KV groups (dtype, shape, chunk_bytes
	// above are group 0's); absent for a model with one group.
	Groups        []GroupStatus `json:"groups,omitempty"`
	Mode          string        `json:"mode"`
	Reason        string        `json:"reason"`
	RegisteredAt  time.Time     `json:"registered_at"`
	LastRequestAt *time.Time    `json:"last_request_at,omitempty"`
	// State is active, idle, reaped or removed; LastSeenSeconds is the
	// silence since LastRequestAt; Peer the ZMQ routing id (hex, its first
	// 16 bytes) holding the instance: the one that registered it, or that
	// spoke for it after the holder went silent; GoneAt when it was reaped
	// or removed.
	State           string     `json:"state"`
	LastSeenSeconds float64    `json:"last_seen_seconds"`
	Peer            string     `json:"peer,omitempty"`
	InFlight        int        `json:"in_flight"`
	GoneAt          *time.Time `json:"gone_at,omitempty"`
	Stores          int64      `json:"stores"`
	StoreFailures   int64      `json:"store_failures"`
	Retrieves       int64      `json:"retrieves"`
	HitChunks       int64      `json:"hit_chunks"`
	BytesIn         int64      `json:"bytes_in"`
	BytesOut        int64      `json:"bytes_out"`
}

// registered tells a registered context from a reaped or removed one
// (remembered for the operator, not registered).
func registered(c workers.ContextInfo) bool {
	return c.State != workers.StateReaped && c.State != workers.StateRemoved
}

// lastSeen is the silence of c at now, in seconds: until it went, for a
// reaped or removed context.
func lastSeen(now time.Time, c workers.ContextInfo) float64 {
	if c.LastRequest.IsZero() {
		return 0
	}
	if !c.Gone.IsZero() {
		now = c.Gone
	}
	return now.Sub(c.LastRequest).Seconds()
}

// WorkerLiveness is upstream's report_status "worker_liveness" part
// (management.py), plus kvdock's idle time.
type WorkerLiveness struct {
	Enabled                  bool    `json:"enabled"`
	ReapTimeoutSeconds       float64 `json:"reap_timeout_seconds"`
	RegistrationGraceSeconds float64 `json:"registration_grace_seconds"`
	IdleSeconds              float64 `json:"idle_seconds"`
	TrackedInstances         int     `json:"tracked_instances"`
}

// GroupStatus is one KV group's chunk layout.
type GroupStatus struct {
	Dtype      string `json:"dtype"`
	Shape      []int  `json:"shape"`
	ChunkBytes int64  `json:"chunk_bytes"`
}

// TransferStatus are the non-GPU transfer module's counters.
type TransferStatus struct {
	Instances     int   `json:"instances"`
	PendingWrites int   `json:"pending_writes"`
	PendingReads  int   `json:"pending_reads"`
	NoSpace       int64 `json:"no_space"`
	Rejected      int64 `json:"rejected"`
	Expired       int64 `json:"expired"`
	Fallbacks     int64 `json:"fallbacks"`
	// Reaped: instances dropped by the liveness reaper; Removed: by the
	// operator; Reused: ids registered again from another peer, taken as
	// new workers.
	Reaped  int64 `json:"reaped"`
	Removed int64 `json:"removed"`
	Reused  int64 `json:"reused"`
	// LayoutConflicts: registrations refused because their model was
	// registered with another layout; RefusedUnregisters: UNREGISTERs from
	// another peer than the live one holding the instance;
	// UnknownInstanceRequests: transfer requests naming an instance not
	// registered, answered with their failure reply.
	LayoutConflicts    int64 `json:"layout_conflicts"`
	RefusedUnregisters int64 `json:"refused_unregisters"`
	// ForeignCommits: commits refused because another peer prepared the
	// transfer they name.
	ForeignCommits          int64 `json:"foreign_commits"`
	UnknownInstanceRequests int64 `json:"unknown_instance_requests"`
}

// LookupStatus are the lookup module's counters.
type LookupStatus struct {
	Lookups         int64 `json:"lookups"`
	EarlyExits      int64 `json:"early_exits"`
	Failures        int64 `json:"failures"`
	RequestedTokens int64 `json:"requested_tokens"`
	RequestedChunks int64 `json:"requested_chunks"`
	HitChunks       int64 `json:"hit_chunks"`
	HitTokens       int64 `json:"hit_tokens"`
	ActiveJobs      int   `json:"active_jobs"`
	AnsweredJobs    int64 `json:"answered_jobs"`
	ReplacedJobs    int64 `json:"replaced_jobs"`
	ExpiredJobs     int64 `json:"expired_jobs"`
	FreedKeys       int64 `json:"freed_keys"`
	TouchedKeys     int64 `json:"touched_keys"`
	// Bench is the benchmark's lookups (models named "kvdock-bench:…"),
	// left out of the figures above, of rates, tokens_saved, misses and
	// whatif.
	Bench BenchLookupStatus `json:"bench"`
	// UnregisteredModels are models lookups named while no worker had
	// registered them (after a restart, before the workers register
	// again): each such lookup answers 0 and counts as an early exit.
	UnregisteredModels []UnregisteredStatus `json:"unregistered_models"`
}

// BenchLookupStatus are the benchmark's lookup counters.
type BenchLookupStatus struct {
	Lookups         int64 `json:"lookups"`
	EarlyExits      int64 `json:"early_exits"`
	Failures        int64 `json:"failures"`
	RequestedChunks int64 `json:"requested_chunks"`
	HitChunks       int64 `json:"hit_chunks"`
}

// UnregisteredStatus is one model looked up with no registered worker.
type UnregisteredStatus struct {
	ModelName string    `json:"model_name"`
	WorldSize int       `json:"world_size"`
	Lookups   int64     `json:"lookups"`
	LastAt    time.Time `json:"last_at"`
	// Message says it in words, as the dashboard does.
	Message string `json:"message"`
}

// RequestsStatus are the wire server's counters.
type RequestsStatus struct {
	Profile        string                  `json:"profile"`
	InFlight       int64                   `json:"in_flight"`
	Disconnects    int64                   `json:"disconnects"`
	Total          int64                   `json:"total"`
	ByType         map[string]RequestCount `json:"by_type"`
	BadInput       map[string]int64        `json:"bad_input"`
	DecodeFailures map[string]int64        `json:"decode_failures"`
}

// RequestCount are one request type's outcomes and mean latency.
type RequestCount struct {
	OK                 int64   `json:"ok"`
	Error              int64   `json:"error"`
	Dropped            int64   `json:"dropped"`
	Count              int64   `json:"count"`
	MeanLatencySeconds float64 `json:"mean_latency_seconds"`
}

// GPUStatus is the latest GPU telemetry reading.
type GPUStatus struct {
	Available bool        `json:"available"`
	Reason    string      `json:"reason,omitempty"`
	Driver    string      `json:"driver,omitempty"`
	SampledAt *time.Time  `json:"sampled_at,omitempty"`
	Error     string      `json:"error,omitempty"`
	Devices   []GPUDevice `json:"devices"`
}

// GPUDevice is one GPU; UtilizationPercent is null when unreadable.
type GPUDevice struct {
	Index              int          `json:"index"`
	Name               string       `json:"name"`
	UUID               string       `json:"uuid,omitempty"`
	MemoryUsedBytes    uint64       `json:"memory_used_bytes"`
	MemoryTotalBytes   uint64       `json:"memory_total_bytes"`
	UtilizationPercent *int         `json:"utilization_percent"`
	Processes          []GPUProcess `json:"processes"`
}

// GPUProcess is one process on a GPU; memory_known is false for N/A.
type GPUProcess struct {
	PID             int    `json:"pid"`
	MemoryUsedBytes uint64 `json:"memory_used_bytes"`
	MemoryKnown     bool   `json:"memory_known"`
	Kind            string `json:"kind"`
}

// EventStatus is one line of the engine's recent story.
type EventStatus struct {
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"`
	Level   string    `json:"level"`
	Message string    `json:"message"`
}

// maxEvents bounds the events /status carries.
const maxEvents = 20

// What one peer can make /status carry is bounded, so that the document
// stays under 1 MiB with server.max_instances' default of 1,024 contexts
// whatever their names (TestHostileStatusSize):
//
//   - MaxContextDetail contexts are detailed in contexts and
//     rates.contexts, the most recently active first; contexts_omitted
//     counts the rest;
//   - a model name is shown as it is when its JSON form is at most
//     ShownNameBytes and it has no control character or invalid UTF-8;
//     otherwise those are shown as '?' and it is cut to ShownNameBytes of
//     JSON, followed by "…" and its length (e.g. "…[256 bytes]");
//   - an event message is cut the same way to shownMessageBytes.
const (
	MaxContextDetail  = 256
	ShownNameBytes    = 128
	shownMessageBytes = 1024
)

// jsonCost is how many bytes encoding/json (escaping HTML) writes for r
// inside a string.
func jsonCost(r rune) int {
	switch r {
	case '<', '>', '&', '\u2028', '\u2029':
		return 6
	case '"', '\\':
		return 2
	}
	return utf8.RuneLen(r)
}

// shown is s for /status: as it is when plain (no control character, valid
// UTF-8) and its JSON form fits limit bytes; otherwise with '?' for each
// control character or invalid byte and cut to limit bytes of JSON, its
// length noted when cut.
func shown(s string, limit int) string {
	cost, plain := 0, true
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) {
			plain = false
			break
		}
		cost += jsonCost(r)
	}
	if plain && cost <= limit {
		return s
	}
	var b strings.Builder
	cost = 0
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) {
			r = '?'
		}
		if cost+jsonCost(r) > limit {
			return b.String() + fmt.Sprintf("…[%d bytes]", len(s))
		}
		b.WriteRune(r)
		cost += jsonCost(r)
	}
	return b.String()
}

// detailed returns the contexts /status details: all of them, or the
// MaxContextDetail most recently active, in their order.
func detailed(cs []workers.ContextInfo) []workers.ContextInfo {
	if len(cs) <= MaxContextDetail {
		return cs
	}
	idx := make([]int, len(cs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cs[b].LastRequest.Compare(cs[a].LastRequest) })
	idx = idx[:MaxContextDetail]
	slices.Sort(idx)
	out := make([]workers.ContextInfo, len(idx))
	for i, j := range idx {
		out[i] = cs[j]
	}
	return out
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// NewStatus builds the /status document from a snapshot.
func NewStatus(s engine.Snapshot) Status {
	cfg := s.Config
	healthy := s.Healthy()
	out := Status{
		IsHealthy:          healthy,
		EngineType:         "MPCacheEngine",
		ChunkSize:          cfg.Server.ChunkSize,
		HashAlgorithm:      cfg.Server.HashAlgorithm,
		ActiveSessions:     s.Sessions,
		ActivePrefetchJobs: s.Lookup.ActiveJobs,
		StorageManager: StorageManager{
			IsHealthy: healthy,
			L1EvictionController: EvictionController{
				IsHealthy: healthy, ThreadAlive: healthy,
				EvictionPolicy: s.Pool.Policy, TriggerWatermark: s.Pool.Watermark, EvictionRatio: s.Pool.Ratio,
			},
		},
		State:         s.State.String(),
		Error:         s.Error,
		Endpoint:      s.Endpoint,
		Protocol:      s.Protocol,
		TransferMode:  cfg.Server.TransferMode,
		Version:       s.Version,
		StartedAt:     timePtr(s.Started),
		UptimeSeconds: s.Uptime.Seconds(),
		Restart:       restartStatus(s.Restart),
		TakenAt:       s.Taken,
		ShmName:       s.Shm.ShmName,
		PoolSize:      s.Shm.PoolSize,
		ShmReason:     s.Shm.Reason,
		ShmShared:     s.Shm.Shared(),
		GPU:           gpuStatus(s),
		WhatIf:        whatIfStatus(s.WhatIf),
		KVEvents:      s.KVEvents,

		ProtocolDetection: protocolDetection(s),
	}
	all := s.Contexts
	out.RegisteredNonCudaInstanceIDs, out.NonCudaContextMeta = registrations(all)
	s.Contexts = detailed(all) // what rates.contexts and contexts detail
	out.ContextsOmitted = len(all) - len(s.Contexts)
	out.Rates, out.TokensSaved = ratesStatus(s)
	if out.StorageManager.L1EvictionController.EvictionPolicy == "" {
		out.StorageManager.L1EvictionController.EvictionPolicy = cfg.Eviction.Policy
	}
	out.Pool = poolStatus(s.Pool)
	out.Contexts = contextsStatus(s)
	out.Transfer, out.WorkerLiveness = transferStatus(s)
	out.Lookup = lookupStatus(s)
	out.StatsSince, out.StatsResetAt = timePtr(s.Stats.Since), timePtr(s.Stats.ResetAt)
	out.StatsRule, out.StatsCarriedAt = s.Stats.Rule, timePtr(s.Stats.Carried)

	out.Misses = missesStatus(s.Misses)
	out.Misses.Since = timePtr(s.Stats.PlaneStart(s.Rebuilt.At))
	if from := s.Stats.WhatIfStart(s.Rebuilt.At); !from.IsZero() {
		out.WhatIf.WindowSince = &from
		out.WhatIf.WindowSeconds = max(0, s.Taken.Sub(from).Seconds())
		out.WhatIf.Window = "last " + engine.WindowLabel(from, s.Taken)
	}
	for i := range out.Misses.Contexts {
		out.Misses.Contexts[i].ModelName = shown(out.Misses.Contexts[i].ModelName, ShownNameBytes)
	}
	out.Host = hostStatus(s.Host)
	out.Requests = requestsStatus(s)
	out.Tiers = tiersStatus(s)
	out.Events = eventsStatus(s)
	return out
}

// registrations is upstream's view of the registered instances: their ids
// and each one's model meta.
func registrations(all []workers.ContextInfo) ([]int64, map[string]ContextMeta) {
	ids := make([]int64, 0, len(all))
	meta := make(map[string]ContextMeta, len(all))
	for _, c := range all {
		if registered(c) {
			ids = append(ids, c.InstanceID)
			meta[strconv.FormatInt(c.InstanceID, 10)] = ContextMeta{
				ModelName: shown(c.Model, ShownNameBytes), WorldSize: c.WorldSize, BlockSize: c.BlockSize, UseMLA: c.MLA, NumGroups: len(c.Groups),
			}
		}
	}
	return ids, meta
}

func poolStatus(p engine.Pool) PoolStatus {
	ratio := 0.0
	if p.Size > 0 {
		ratio = float64(p.UsedBytes) / float64(p.Size)
	}
	return PoolStatus{
		Segment: p.Decision.Segment, PrivateSegment: p.Decision.Private, Shared: p.Decision.Shared, Reason: p.Decision.Reason,
		ShmFreeBytes: p.ShmFree, CapacityBytes: p.Size, UsedBytes: p.UsedBytes, UsageRatio: ratio,
		ResidentBytes: p.ResidentBytes, UsableBytes: p.UsableBytes, UsableRatio: p.UsableRatio(),
		Objects: p.Objects, FreeExtents: p.FreeExtents, PrefaultedBytes: p.Prefaulted,
		WriteLocked: p.WriteLocked, ReadLocked: p.ReadLocked,
		Evictions: p.Evictions, EvictionLoopTicks: p.EvictionTicks, AllocationFailures: p.AllocFailures,
		ReadHits: p.ReadHits, ReadMisses: p.ReadMisses, WriteReservations: p.WriteReservations,
		WriteExisting: p.WriteExisting, ExpiredWriteLocks: p.ExpiredWriteLocks, ExpiredReadLocks: p.ExpiredReadLocks,
		EvictionPolicy: p.Policy, TriggerWatermark: p.Watermark, EvictionRatio: p.Ratio,
		WriteTTLSeconds: p.WriteTTL.Seconds(), ReadTTLSeconds: p.ReadTTL.Seconds(),
		LiveBytes: p.LiveBytes, LockedBytes: p.LockedBytes, DoomedObjects: p.Doomed, DoomedBytes: p.DoomedBytes,
		BenchBytes: p.BenchBytes, BenchRefusals: p.BenchRefusals, AdmissionRefusals: p.AdmissionRefusals,
		LockOwners: p.LockOwners, Views: p.Views, WriteDoomed: p.WriteDoomed, StaleFinishes: p.StaleFinishes,
		LockCapRefusals: p.LockCapRefusals, OwnerLockCapBytes: p.OwnerLockCap, TotalLockCapBytes: p.TotalLockCap,
	}
}

// contextsStatus details s.Contexts (those detailed chose).
func contextsStatus(s engine.Snapshot) []ContextStatus {
	out := make([]ContextStatus, 0, len(s.Contexts))
	for _, c := range s.Contexts {
		shape := c.Layout.Shape
		if shape == nil {
			shape = []int{}
		}
		var groups []GroupStatus
		for _, g := range c.Groups {
			groups = append(groups, GroupStatus{Dtype: g.Dtype, Shape: append([]int{}, g.Shape...), ChunkBytes: g.Bytes})
		}
		out = append(out, ContextStatus{
			Groups:     groups,
			InstanceID: c.InstanceID, ModelName: shown(c.Model, ShownNameBytes), WorldSize: c.WorldSize, BlockSize: c.BlockSize,
			NumLayers: c.NumLayers, HiddenDimSize: c.HiddenDimSize, UseMLA: c.MLA,
			Dtype: c.Layout.Dtype, Shape: shape, ChunkBytes: c.Layout.Bytes,
			Mode: string(c.Mode), Reason: c.Reason,
			RegisteredAt: c.Registered, LastRequestAt: timePtr(c.LastRequest),
			State: string(c.State), LastSeenSeconds: lastSeen(s.Taken, c),
			Peer: c.Peer, InFlight: c.InFlight, GoneAt: timePtr(c.Gone),
			Stores: c.Stores, StoreFailures: c.StoreFailures, Retrieves: c.Retrieves,
			HitChunks: c.HitChunks, BytesIn: c.BytesIn, BytesOut: c.BytesOut,
		})
	}
	return out
}

func transferStatus(s engine.Snapshot) (TransferStatus, WorkerLiveness) {
	t, lv := s.Transfer, s.Liveness
	return TransferStatus{Instances: t.Instances, PendingWrites: t.PendingWrites, PendingReads: t.PendingReads,
			NoSpace: t.NoSpace, Rejected: t.Rejected, Expired: t.Expired, Fallbacks: t.Fallbacks,
			Reaped: t.Reaped, Removed: t.Removed, Reused: t.Reused,
			LayoutConflicts: t.Conflicts, RefusedUnregisters: t.RefusedUnregisters, ForeignCommits: t.ForeignCommits, UnknownInstanceRequests: t.Unknown},
		WorkerLiveness{Enabled: lv.Reaping, ReapTimeoutSeconds: lv.Timeout.Seconds(),
			RegistrationGraceSeconds: lv.Grace.Seconds(), IdleSeconds: lv.Idle.Seconds(), TrackedInstances: t.Instances}
}

func lookupStatus(s engine.Snapshot) LookupStatus {
	l := s.Lookup
	out := LookupStatus{Lookups: l.Lookups, EarlyExits: l.EarlyExits, Failures: l.Failures,
		RequestedTokens: l.RequestedTokens, RequestedChunks: l.RequestedChunks, HitChunks: l.HitChunks,
		HitTokens: l.HitTokens, ActiveJobs: l.ActiveJobs, AnsweredJobs: l.AnsweredJobs,
		ReplacedJobs: l.ReplacedJobs, ExpiredJobs: l.ExpiredJobs, FreedKeys: l.FreedKeys, TouchedKeys: l.TouchedKeys,
		Bench: BenchLookupStatus{Lookups: l.Bench.Lookups, EarlyExits: l.Bench.EarlyExits, Failures: l.Bench.Failures,
			RequestedChunks: l.Bench.RequestedChunks, HitChunks: l.Bench.HitChunks},
		UnregisteredModels: make([]UnregisteredStatus, 0, len(s.Unregistered))}
	for _, u := range s.Unregistered {
		name := shown(u.Model, ShownNameBytes)
		out.UnregisteredModels = append(out.UnregisteredModels, UnregisteredStatus{
			ModelName: name, WorldSize: u.WorldSize, Lookups: u.Lookups, LastAt: u.Last,
			Message: engine.UnregisteredMessage(name, u.WorldSize)})
	}
	return out
}

func requestsStatus(s engine.Snapshot) RequestsStatus {
	r := s.Requests
	out := RequestsStatus{
		Profile: r.Profile, InFlight: r.InFlight, Disconnects: r.Disconnects,
		ByType:         make(map[string]RequestCount, len(r.Requests)),
		BadInput:       map[string]int64{},
		DecodeFailures: map[string]int64{},
	}
	if out.Profile == "" {
		out.Profile = s.Protocol
	}
	for name, rs := range r.Requests {
		rc := RequestCount{OK: rs.OK, Error: rs.Error, Dropped: rs.Dropped, Count: rs.Count}
		if rs.Count > 0 {
			rc.MeanLatencySeconds = rs.Latency.Seconds() / float64(rs.Count)
		}
		out.ByType[name] = rc
		out.Total += rs.Count
	}
	for k, v := range r.BadInput {
		out.BadInput[k] = v
	}
	for k, v := range r.DecodeFailures {
		out.DecodeFailures[k] = v
	}
	return out
}

func tiersStatus(s engine.Snapshot) []TierStatus {
	out := make([]TierStatus, 0, len(s.Tiers))
	for _, t := range s.Tiers {
		out = append(out, TierStatus{Index: t.Index, Type: t.Type, Target: t.Target,
			State: string(t.State), Reason: t.Reason, Since: timePtr(t.Since),
			UsedBytes: t.UsedBytes, CapacityBytes: t.CapacityBytes, Objects: t.Objects,
			Hits: t.Hits, Misses: t.Misses, Corrupt: t.Corrupt,
			QueueDepth: t.QueueDepth, QueueBytes: t.QueueBytes, DroppedWrites: t.DroppedWrites,
			ReadBytes: t.ReadBytes, WriteBytes: t.WriteBytes, Loads: t.Loads, LoadTimeouts: t.LoadTimeouts})
	}
	return out
}

// eventsStatus is the last maxEvents events.
func eventsStatus(s engine.Snapshot) []EventStatus {
	evs := s.Events
	if len(evs) > maxEvents {
		evs = evs[len(evs)-maxEvents:]
	}
	out := []EventStatus{}
	for _, e := range evs {
		out = append(out, EventStatus{Seq: e.Seq, Time: e.Time, Kind: string(e.Kind),
			Level: e.Level.String(), Message: shown(e.Message, shownMessageBytes)})
	}
	return out
}

func gpuStatus(s engine.Snapshot) GPUStatus {
	g := s.GPU
	out := GPUStatus{Available: g.Available, Reason: g.Reason, Driver: g.Driver,
		SampledAt: timePtr(g.Sampled), Error: g.Err, Devices: []GPUDevice{}}
	for _, d := range g.Devices {
		dev := GPUDevice{Index: d.Index, Name: d.Name, UUID: d.UUID,
			MemoryUsedBytes: d.MemUsed, MemoryTotalBytes: d.MemTotal, Processes: []GPUProcess{}}
		if d.Util >= 0 {
			u := d.Util
			dev.UtilizationPercent = &u
		}
		for _, p := range d.Processes {
			dev.Processes = append(dev.Processes, GPUProcess{PID: p.PID, MemoryUsedBytes: p.MemUsed,
				MemoryKnown: p.MemKnown, Kind: p.Kind})
		}
		out.Devices = append(out.Devices, dev)
	}
	slices.SortFunc(out.Devices, func(a, b GPUDevice) int { return a.Index - b.Index })
	return out
}
