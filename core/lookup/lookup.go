// Package lookup answers the scheduler's cache queries: LOOKUP (how many
// leading chunks of a prompt are cached, read-locking them for the workers
// that will retrieve them), the prefetch-job queries that report the answer
// (QUERY_PREFETCH_STATUS, QUERY_PREFETCH_LOOKUP_HITS), FREE_LOOKUP_LOCKS and
// END_SESSION, as plain Go calls that the RPC layer wires to the wire names.
//
// With L2 tiers (Options.Tiers), a lookup whose L1 prefix stops short asks
// the tiers for the chunks that follow, in the background: the job reports
// "still running" (None on the wire) until the tier phase ends, then the L1
// prefix plus the leading chunks loaded into L1 and read-locked.
package lookup

import (
	"container/list"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"kvdock/core/keys"
	"kvdock/core/misses"
	"kvdock/core/whatif"
)

// Store is the part of the L1 pool a lookup needs.
type Store interface {
	// ReserveLookup takes count read locks for request of peer (its
	// routing id: the lookups' cap is shared fairly between peers) on each
	// leading readable key, stopping at the first miss or lock-cap refusal,
	// and returns how many keys it locked and whether a cap refused the next.
	ReserveLookup(peer, request string, ks []keys.ObjectKey, count int) (n int, refused bool)
	// FinishRead releases count read locks on each key.
	FinishRead(ks []keys.ObjectKey, count int)
	// Touch refreshes the keys' recency for eviction.
	Touch(ks []keys.ObjectKey)
}

// Tiers is the L2 side a lookup continues in; *tier.Set satisfies it.
type Tiers interface {
	// Prefetch loads the leading chunks of ks (chunk-major, per keys a
	// chunk, of model and worldSize) it finds in the tiers into L1, read-locks
	// each key count times, and returns how many leading chunks it locked.
	// It returns within its own load timeout, or sooner when ctx ends.
	Prefetch(ctx context.Context, model string, worldSize int, ks []keys.ObjectKey, per, count int) int
}

// Classifier says why chunks missed; *misses.Classifier satisfies it.
type Classifier interface {
	// ClassifyMisses adds to c the reason each chunk of ks (per keys a
	// chunk, chunk-major) is not a hit; stored is the reason of a chunk
	// that is readable (AfterMiss, or Refused when a lock cap stopped the
	// lookup).
	ClassifyMisses(ks []keys.ObjectKey, per int, stored misses.Reason, c *misses.Counts)
}

// TiersKnownAbsent is implemented by Tiers that can tell from memory,
// without asking a tier, that none of them holds the first chunk of ks (per
// keys, of model and worldSize). Such a lookup answers its L1 hits at once:
// a tier phase, even one that ends in microseconds, makes the scheduler's
// first QUERY_PREFETCH_STATUS find it running and poll again later.
type TiersKnownAbsent interface {
	KnownAbsent(model string, worldSize int, ks []keys.ObjectKey, per int) bool
}

// Layouts tells which layouts a LOOKUP of a model answers for, as a LOOKUP
// names none: every layout registered for the model, by ID
// (keys.ObjectKey.Layout) and KV group count (none: the model is not
// registered; a hybrid model has several groups, each chunk then is one
// object per group). A chunk hits only when every layout holds it, each
// layout's objects locked for its own workers, so a worker of any layout
// retrieves every chunk the scheduler was told of, from its own layout's
// keys. *layout.Registry satisfies it.
type Layouts interface {
	Registered(model string, worldSize int) (ids []uint64, groups []int)
}

// Defaults for Options.
const (
	DefaultJobTTL      = 300 * time.Second // the L1 read-lock TTL: a job outliving its locks reports stale hits
	DefaultMaxJobs     = 65536
	DefaultMaxJobBytes = 16 << 20 // ~36k jobs with 256-byte request ids, 65536 with UUIDs
	JobSweepPeriod     = 60 * time.Second
	// DefaultMaxTierJobs bounds the lookups in their tier phase at once;
	// past it a lookup answers its L1 hits only.
	DefaultMaxTierJobs = 64
)

// maxTierKeys bounds the keys one lookup hands the tiers.
const maxTierKeys = 4096

// MaxTPSize is the largest tp_size a LOOKUP or FREE_LOOKUP_LOCKS accepts:
// upstream's range (a world size fits in 8 bits). It bounds the read locks
// one lookup takes per key at 1 + ExtraCount <= MaxTPSize.
const MaxTPSize = keys.MaxWorldSize

// lockBatch is how many chunks a lookup resolves and hands the store at a
// time: the keys of one batch (64 chunks × up to 255 ranks, ~1.1 MiB) are all
// it materialises, however long the prompt, and it stops at the first miss.
// A hybrid model's batch has as many fewer chunks as it has KV groups
// (chunkBatch), so a batch holds no more keys.
const lockBatch = 64

// chunkBatch is the chunks per batch for ks: lockBatch over its KV groups.
func chunkBatch(ks keys.KeySet) int { return max(1, lockBatch/ks.Groups()) }

// jobOverhead is the memory of one job besides its id: the struct, its list
// element and its map entry.
const jobOverhead = 192

// Options tune a Module; the zero value gives the defaults.
type Options struct {
	// JobTTL bounds how long an unqueried job is kept (default DefaultJobTTL).
	JobTTL time.Duration
	// MaxJobs bounds the job table; past it the oldest job is dropped
	// (default DefaultMaxJobs).
	MaxJobs int
	// MaxJobBytes bounds the job table's memory (ids and bookkeeping); past
	// it the oldest job is dropped (default DefaultMaxJobBytes).
	MaxJobBytes int64
	Now         func() time.Time
	Logger      *slog.Logger
	// Tiers, when set, continue a lookup past its L1 prefix.
	Tiers Tiers
	// MaxTierJobs bounds the lookups in their tier phase (default DefaultMaxTierJobs).
	MaxTierJobs int
	// Misses, when set, classifies every missed chunk of a lookup into
	// the tally Misses() reports.
	Misses Classifier
	// WhatIf, when set, is shown every key each lookup asks for, hit or
	// not, for the what-if pool size curve.
	WhatIf *whatif.Estimator
}

// Module holds the lookup jobs. It is safe for concurrent use.
//
// Jobs are kept per request id until QueryStatus answers them, until a newer
// LOOKUP of the same id replaces them, or until they are JobTTL old or pushed
// out, oldest first, by MaxJobs or MaxJobBytes (request ids are at most
// keys.MaxRequestIDLen bytes; a longer one is rejected and never kept). Dropping or replacing a job never releases its read locks:
// the scheduler may already have told workers to retrieve those chunks, and
// each worker's PREPARE_RETRIEVE consumes one lock, so releasing them here
// could let eviction free data a worker is about to read. Locks that nobody
// consumes expire with the L1 read TTL (or go with FREE_LOOKUP_LOCKS).
type Module struct {
	sessions *keys.Sessions
	store    Store
	layouts  Layouts
	ttl      time.Duration
	maxJobs  int
	maxBytes int64
	now      func() time.Time
	log      *slog.Logger
	tiers    Tiers
	maxTier  int
	classify Classifier
	misses   *misses.Tally
	whatif   *whatif.Estimator

	// bg ends the tier phases (Stop); wg counts them.
	bg      context.Context
	stopBg  context.CancelFunc
	wg      sync.WaitGroup
	stopped bool
	running int // jobs in their tier phase

	mu    sync.Mutex
	jobs  map[string]*job
	order *list.List // of *job, oldest first
	bytes int64      // sum of job.cost over jobs

	// work counts the workers' lookups, bench the benchmark's (IsBench).
	work, bench                          traffic
	replaced, expired, evicted, answered atomic.Int64
	freedKeys, touchedKeys               atomic.Int64
	tierJobs, tierSkipped                atomic.Int64
	models                               models
	unreg                                unregistered
}

type job struct {
	id        string
	created   time.Time
	elem      *list.Element
	hitChunks int
	running   bool  // the tier phase has not ended
	cost      int64 // bytes accounted in Module.bytes
	// done is closed when the tier phase ends (nil for jobs that never ran
	// one), for WAIT_PREFETCH_STATUS.
	done chan struct{}
}

// Stats is a snapshot of the module's counters (lmcache_mp.lookups,
// lookup_requested, lookup_hit, lookup_early_exit, active_prefetch_jobs).
// The lookup figures are the workers'; benchmark traffic is in Bench.
type Stats struct {
	Lookups         int64 // LOOKUP calls
	EarlyExits      int64 // lookups answered 0 without touching L1 (no layout, no full chunk)
	Failures        int64 // lookups rejected as invalid (answered 0 unless the request id itself was invalid)
	RequestedTokens int64 // tokens sent with lookups
	RequestedChunks int64 // full chunks in those tokens
	HitChunks       int64 // chunks found (leading, on every rank)
	HitTokens       int64 // HitChunks × chunk size
	ActiveJobs      int   // jobs waiting for QUERY_PREFETCH_STATUS
	JobBytes        int64 // memory those jobs hold, as counted against MaxJobBytes
	AnsweredJobs    int64 // jobs removed by QUERY_PREFETCH_STATUS
	ReplacedJobs    int64 // jobs replaced by a LOOKUP with the same request id
	ExpiredJobs     int64 // jobs dropped by JobTTL
	EvictedJobs     int64 // jobs dropped, oldest first, by MaxJobs or MaxJobBytes
	FreedKeys       int64 // keys released by FREE_LOOKUP_LOCKS
	TouchedKeys     int64 // keys touched by END_SESSION
	TierJobs        int64 // lookups that went on to the tiers
	TierHitChunks   int64 // chunks loaded from the tiers and reported as hits
	TierSkipped     int64 // lookups that could not start a tier phase (too many running)
	TierRunning     int   // lookups in their tier phase now
	// Bench is the benchmark's lookups (models named with
	// BenchModelPrefix), left out of the figures above.
	Bench BenchStats
}

// New returns a Module resolving keys through s, locking in store and
// checking registrations in layouts.
func New(s *keys.Sessions, store Store, layouts Layouts, opts Options) *Module {
	opts.JobTTL = positiveOr(opts.JobTTL, DefaultJobTTL)
	opts.MaxJobs = positiveOr(opts.MaxJobs, DefaultMaxJobs)
	opts.MaxJobBytes = positiveOr(opts.MaxJobBytes, DefaultMaxJobBytes)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxTierJobs <= 0 {
		opts.MaxTierJobs = DefaultMaxTierJobs
	}
	bg, stop := context.WithCancel(context.Background())
	return &Module{
		tiers:    opts.Tiers,
		maxTier:  opts.MaxTierJobs,
		classify: opts.Misses,
		misses:   misses.NewTally(),
		whatif:   opts.WhatIf,
		bg:       bg,
		stopBg:   stop,
		sessions: s,
		store:    store,
		layouts:  layouts,
		ttl:      opts.JobTTL,
		maxJobs:  opts.MaxJobs,
		maxBytes: opts.MaxJobBytes,
		now:      opts.Now,
		log:      opts.Logger,
		jobs:     make(map[string]*job),
		order:    list.New(),
	}
}

// ExtraCount is upstream's compute_extra_count: the read locks each key needs
// beyond one. With MLA, vLLM divides world_size by TP, so tp workers share a
// rank's KV and each of them consumes a lock: tp = tpSize if tpSize > 1 else
// worldSize, and extra = tp-1 when tp > worldSize, else 0.
func ExtraCount(tpSize, worldSize int) int {
	tp := worldSize
	if tpSize > 1 {
		tp = tpSize
	}
	if tp > worldSize {
		return tp - 1
	}
	return 0
}

// ValidateTPSize checks a LOOKUP or FREE_LOOKUP_LOCKS tp_size: 0 to
// MaxTPSize (0 and 1 both mean "no tensor parallelism beyond world_size").
func ValidateTPSize(tpSize int) error {
	if tpSize < 0 || tpSize > MaxTPSize {
		return fmt.Errorf("tp_size %d: must be between 0 and %d", tpSize, MaxTPSize)
	}
	return nil
}

// Lookup runs a scheduler LOOKUP: it hashes every full chunk of r.Tokens,
// read-locks the leading keys found in L1 (1 + ExtraCount locks each, every
// rank), a batch of chunks at a time, and records a job under r.RequestID
// with the number of chunks hit on all ranks. An unregistered (model, world
// size) or a prompt without a full chunk records 0. Locks taken on the keys of
// a chunk that missed on some rank are released at once: no worker will
// retrieve that chunk. With tiers, a prefix that stops short goes on in
// the tiers in the background (see startTierPhase) and the job reports
// "still running" until then. An invalid key or tp_size records 0 too (so the status
// query does not report a stale job) and returns the error; an invalid
// request id records nothing.
func (m *Module) Lookup(r keys.KeyRequest, tpSize int) error { return m.LookupFrom("", r, tpSize) }

// LookupFrom is Lookup for peer (the ZMQ routing id that sent it): its
// read locks count against that peer's share of the lookups' lock cap.
func (m *Module) LookupFrom(peer string, r keys.KeyRequest, tpSize int) error {
	t := m.trafficOf(r.Model)
	t.lookups.Add(1)
	t.reqTokens.Add(int64(len(r.Tokens)))
	if err := keys.ValidateRequestID(r.RequestID); err != nil {
		t.failures.Add(1)
		return fmt.Errorf("lookup: %w", err)
	}
	if err := ValidateTPSize(tpSize); err != nil {
		t.failures.Add(1)
		m.put(r.RequestID, 0, false)
		return fmt.Errorf("lookup: request %s: %w", keys.Clip(r.RequestID), err)
	}
	ids, groups := m.layouts.Registered(r.Model, r.WorldSize)
	if len(ids) == 0 {
		t.earlyExits.Add(1)
		m.unreg.note(r.Model, r.WorldSize, m.now())
		m.log.Debug("lookup: no layout registered", "request_id", r.RequestID, "model", keys.Clip(r.Model), "world_size", r.WorldSize)
		m.put(r.RequestID, 0, false)
		return nil
	}
	ks, err := m.sessions.LookupKeys(r)
	if err != nil {
		t.failures.Add(1)
		m.put(r.RequestID, 0, false)
		return fmt.Errorf("lookup: %w", err)
	}
	// A chunk of a hybrid model hits only when every group's object is
	// there, and of a model registered with several layouts only when
	// every layout's is: a store whose objects are not all committed is a
	// miss.
	ks = ks.WithLayouts(ids, groups)
	if ks.Chunks() == 0 {
		t.earlyExits.Add(1)
		m.put(r.RequestID, 0, false)
		return nil
	}
	t.reqChunks.Add(int64(ks.Chunks()))
	count := 1 + ExtraCount(tpSize, r.WorldSize)
	hit, refused := m.reservePrefix(peer, r.RequestID, ks, count, t == &m.work)
	t.hitChunks.Add(int64(hit))
	t.hitTokens.Add(int64(hit * m.sessions.Hasher().ChunkSize()))
	m.models.add(r.Model, r.WorldSize, 1, ks.Chunks(), hit, m.sessions.Hasher().ChunkSize())
	if refused {
		// The next chunks are in L1; a lock cap refused them, and the
		// tiers could only load what L1 holds.
		m.put(r.RequestID, hit, false)
		m.classifyMissesAs(r.Model, r.WorldSize, ks, hit, false, misses.Refused)
		return nil
	}
	if m.tiers == nil || hit >= ks.Chunks() {
		m.put(r.RequestID, hit, false)
		m.classifyMisses(r.Model, r.WorldSize, ks, hit, false)
		return nil
	}
	if ka, ok := m.tiers.(TiersKnownAbsent); ok && ka.KnownAbsent(r.Model, r.WorldSize, ks.Append(nil, hit, hit+1), ks.PerChunk()) {
		m.put(r.RequestID, hit, false)
		m.classifyMisses(r.Model, r.WorldSize, ks, hit, true)
		return nil
	}
	m.startTierPhase(r, ks, hit, count)
	return nil
}

// startTierPhase records the job of r as running and asks the tiers, in the
// background, for the chunks of ks after the L1 prefix of hit chunks. When
// too many tier phases run, or the module is stopping, the job reports the
// L1 hits only.
func (m *Module) startTierPhase(r keys.KeyRequest, ks keys.KeySet, hit, count int) {
	m.mu.Lock()
	if m.stopped || m.running >= m.maxTier {
		m.mu.Unlock()
		m.tierSkipped.Add(1)
		m.put(r.RequestID, hit, false)
		m.classifyMisses(r.Model, r.WorldSize, ks, hit, false)
		return
	}
	m.running++
	m.wg.Add(1)
	m.mu.Unlock()
	m.tierJobs.Add(1)
	per := ks.PerChunk()
	rest := ks.Append(nil, hit, hit+max(maxTierKeys/per, 1))
	j := m.put(r.RequestID, hit, true)
	model, ws, chunk := strings.Clone(r.Model), r.WorldSize, m.sessions.Hasher().ChunkSize()
	go func() {
		defer m.wg.Done()
		n := min(max(m.tiers.Prefetch(m.bg, model, ws, rest, per, count), 0), len(rest)/per)
		m.mu.Lock()
		m.running--
		kept := m.jobs[j.id] == j
		if kept {
			j.hitChunks += n
			j.running = false
		}
		close(j.done)
		m.mu.Unlock()
		if kept {
			m.classifyMisses(model, ws, ks, hit+n, true)
		} else {
			m.classifyMisses(model, ws, ks, hit, true)
		}
		if !kept {
			// Replaced, expired or pushed out while loading: no scheduler
			// was told of these chunks, so their locks go now.
			m.store.FinishRead(rest[:n*per], count)
			return
		}
		t := m.trafficOf(model)
		t.tierHits.Add(int64(n))
		t.hitChunks.Add(int64(n))
		t.hitTokens.Add(int64(n * chunk))
		m.models.add(model, ws, 0, 0, n, chunk)
	}()
}

// reservePrefix read-locks for request of peer the leading chunks of ks that are
// readable on every rank, count locks per key, and returns how many chunks
// it locked and whether a lock cap stopped it. It asks the store lockBatch
// chunks at a time and stops at the first miss. With a what-if estimator it
// goes on past the miss, a batch at a time, to show it the keys a larger
// pool might have held (no more work than a lookup that hits throughout);
// probe false (benchmark traffic) keeps the keys from the estimator.
func (m *Module) reservePrefix(peer, request string, ks keys.KeySet, count int, probe bool) (int, bool) {
	est := m.whatif
	if !probe {
		est = nil // a nil estimator is shown nothing
	}
	per, batch := ks.PerChunk(), chunkBatch(ks)
	buf := make([]keys.ObjectKey, 0, min(batch, ks.Chunks())*per)
	hit := 0
	var pre whatif.Prefix
	refused := false
	from := 0
	for ; from < ks.Chunks(); from += batch {
		buf = ks.Append(buf[:0], from, from+batch)
		locked, capped := m.store.ReserveLookup(peer, request, buf, count)
		n := min(max(locked, 0), len(buf))
		refused = capped
		full := n / per
		hit += full
		est.Probe(&pre, buf, full*per)
		if partial := buf[full*per : n]; len(partial) > 0 {
			m.store.FinishRead(partial, count)
		}
		if n < len(buf) {
			from += batch
			break
		}
	}
	for ; est != nil && from < ks.Chunks(); from += batch {
		buf = ks.Append(buf[:0], from, from+batch)
		est.Probe(&pre, buf, 0)
	}
	return hit, refused
}

// classifyMisses tallies why chunks [hit, Chunks) of ks missed, asking
// the classifier a batch (chunkBatch) at a time; tiers says the L2 tiers
// were asked for them too.
func (m *Module) classifyMisses(model string, worldSize int, ks keys.KeySet, hit int, tiers bool) {
	m.classifyMissesAs(model, worldSize, ks, hit, tiers, misses.AfterMiss)
}

// classifyMissesAs is classifyMisses with the reason of the chunks that
// are readable: stored.
// Benchmark traffic is not classified: the breakdown is the workers'.
func (m *Module) classifyMissesAs(model string, worldSize int, ks keys.KeySet, hit int, tiers bool, stored misses.Reason) {
	if m.classify == nil || hit >= ks.Chunks() || IsBench(model) {
		return
	}
	var c misses.Counts
	per, batch := ks.PerChunk(), chunkBatch(ks)
	buf := make([]keys.ObjectKey, 0, min(batch, ks.Chunks()-hit)*per)
	for from := hit; from < ks.Chunks(); from += batch {
		buf = ks.Append(buf[:0], from, from+batch)
		m.classify.ClassifyMisses(buf, per, stored, &c)
	}
	var tierMissed uint64
	if tiers {
		tierMissed = uint64(ks.Chunks() - hit)
	}
	m.misses.Add(misses.Context{Model: model, WorldSize: worldSize}, &c, tierMissed)
}

// Misses reports why lookups missed, per context and in total: every chunk
// a lookup asked for and did not hit (RequestedChunks - HitChunks in Stats)
// is counted under one reason.
func (m *Module) Misses() misses.Report { return m.misses.Report() }

// CarryMisses adds a predecessor's miss breakdown to the module's: a
// restart that adopted its pool hands it over (then Misses counts more
// than this process's Stats).
func (m *Module) CarryMisses(r misses.Report) { m.misses.Carry(r) }

// QueryStatus answers QUERY_PREFETCH_STATUS: the job's hit chunks, removing
// the job, so a second query of the same id answers 0. An unknown id answers
// 0. done is false (None on the wire, the job kept) while the job's tier
// phase runs.
func (m *Module) QueryStatus(requestID string) (hitChunks int, done bool) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked(now)
	j, ok := m.jobs[requestID]
	if !ok {
		return 0, true
	}
	if j.running {
		return 0, false
	}
	m.removeLocked(j)
	m.answered.Add(1)
	return j.hitChunks, true
}

// MaxWait bounds one WAIT_PREFETCH_STATUS: a worker's timeout above it is
// cut to it, so a waiting request never holds a shared worker for longer.
const MaxWait = 30 * time.Second

// WaitStatus answers WAIT_PREFETCH_STATUS: QueryStatus once the job's tier
// phase has ended, waiting for it at most timeout (cut to MaxWait; not
// positive: no wait) or until ctx ends. done false (None on the wire, the
// job kept) means the wait timed out. The wait holds no lock.
func (m *Module) WaitStatus(ctx context.Context, requestID string, timeout time.Duration) (hitChunks int, done bool) {
	m.mu.Lock()
	var ch chan struct{}
	if j, ok := m.jobs[requestID]; ok && j.running {
		ch = j.done
	}
	m.mu.Unlock()
	if ch != nil && timeout > 0 {
		t := time.NewTimer(min(timeout, MaxWait))
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	return m.QueryStatus(requestID)
}

// QueryHits answers QUERY_PREFETCH_LOOKUP_HITS: the job's hit chunks, keeping
// the job. An unknown id answers 0; done is false while the tier phase runs.
func (m *Module) QueryHits(requestID string) (hitChunks int, done bool) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked(now)
	if j, ok := m.jobs[requestID]; ok {
		if j.running {
			return 0, false
		}
		return j.hitChunks, true
	}
	return 0, true
}

// FreeLocks answers FREE_LOOKUP_LOCKS: it resolves the keys of chunks
// [r.Start, r.End) for r.Worker (nil = every rank) through the session and
// releases 1 + ExtraCount read locks on each, a batch of chunks at a time.
func (m *Module) FreeLocks(r keys.KeyRequest, tpSize int) error {
	if err := ValidateTPSize(tpSize); err != nil {
		return fmt.Errorf("free lookup locks: request %s: %w", keys.Clip(r.RequestID), err)
	}
	ks, err := m.sessions.Keys(r)
	if err != nil {
		return fmt.Errorf("free lookup locks: %w", err)
	}
	ks = ks.WithLayouts(m.layouts.Registered(r.Model, r.WorldSize))
	count := 1 + ExtraCount(tpSize, r.WorldSize)
	m.inBatches(ks, func(batch []keys.ObjectKey) { m.store.FinishRead(batch, count) })
	m.freedKeys.Add(int64(ks.Len()))
	return nil
}

// inBatches calls fn with the keys of ks, lockBatch chunks at a time.
func (m *Module) inBatches(ks keys.KeySet, fn func([]keys.ObjectKey)) {
	if ks.Chunks() == 0 {
		return
	}
	batch := chunkBatch(ks)
	buf := make([]keys.ObjectKey, 0, min(batch, ks.Chunks())*ks.PerChunk())
	for from := 0; from < ks.Chunks(); from += batch {
		buf = ks.Append(buf[:0], from, from+batch)
		fn(buf)
	}
}

// EndSession answers END_SESSION: it removes the session and, if it saw a
// LOOKUP, touches every key of that lookup (chunk 0 to the last full chunk,
// every rank) so the finished prompt is the most recently used. A missing
// session is not an error.
func (m *Module) EndSession(requestID string) {
	ks, ok := m.sessions.End(requestID)
	if !ok {
		m.log.Debug("end session: no live session", "request_id", requestID)
		return
	}
	ks = ks.WithLayouts(m.layouts.Registered(ks.Model(), ks.WorldSize()))
	m.inBatches(ks, m.store.Touch)
	m.touchedKeys.Add(int64(ks.Len()))
}

// ActiveJobs returns the number of jobs waiting to be answered.
func (m *Module) ActiveJobs() int {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked(now)
	return len(m.jobs)
}

// Sweep drops jobs older than JobTTL and returns how many went.
func (m *Module) Sweep() int {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.expireLocked(now)
}

// Stop ends the tier phases running (their jobs report what was loaded so
// far) and waits for them; no new one starts.
func (m *Module) Stop() {
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	m.stopBg()
	m.wg.Wait()
}

// Stats returns a snapshot of the counters.
func (m *Module) Stats() Stats {
	now := m.now()
	m.mu.Lock()
	m.expireLocked(now)
	active, bytes, running := len(m.jobs), m.bytes, m.running
	m.mu.Unlock()
	w := &m.work
	return Stats{
		Lookups:         w.lookups.Load(),
		EarlyExits:      w.earlyExits.Load(),
		Failures:        w.failures.Load(),
		RequestedTokens: w.reqTokens.Load(),
		RequestedChunks: w.reqChunks.Load(),
		HitChunks:       w.hitChunks.Load(),
		HitTokens:       w.hitTokens.Load(),
		ActiveJobs:      active,
		JobBytes:        bytes,
		AnsweredJobs:    m.answered.Load(),
		ReplacedJobs:    m.replaced.Load(),
		ExpiredJobs:     m.expired.Load(),
		EvictedJobs:     m.evicted.Load(),
		FreedKeys:       m.freedKeys.Load(),
		TouchedKeys:     m.touchedKeys.Load(),
		TierJobs:        m.tierJobs.Load(),
		TierHitChunks:   w.tierHits.Load(),
		TierSkipped:     m.tierSkipped.Load(),
		TierRunning:     running,
		Bench:           m.bench.bench(),
	}
}

// put records the job of id, replacing an older one, and returns it.
func (m *Module) put(id string, hitChunks int, running bool) *job {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked(now)
	if old, ok := m.jobs[id]; ok {
		m.removeLocked(old) // its locks stay: see Module
		m.replaced.Add(1)
	}
	// A clone: the id must not pin the buffer the request was decoded from.
	id = strings.Clone(id)
	j := &job{id: id, created: now, hitChunks: hitChunks, running: running, cost: int64(jobOverhead + len(id))}
	if running {
		j.done = make(chan struct{})
	}
	j.elem = m.order.PushBack(j)
	m.jobs[id] = j
	m.bytes += j.cost
	for len(m.jobs) > m.maxJobs || m.bytes > m.maxBytes {
		oldest := m.order.Front().Value.(*job)
		if oldest == j {
			break // a job alone over MaxJobBytes cannot happen: ids are capped
		}
		m.removeLocked(oldest)
		m.evicted.Add(1)
	}
	return j
}

func (m *Module) expireLocked(now time.Time) int {
	n := 0
	for e := m.order.Front(); e != nil; e = m.order.Front() {
		j := e.Value.(*job)
		if now.Sub(j.created) < m.ttl {
			break
		}
		m.removeLocked(j)
		n++
	}
	m.expired.Add(int64(n))
	return n
}

func (m *Module) removeLocked(j *job) {
	m.order.Remove(j.elem)
	delete(m.jobs, j.id)
	m.bytes -= j.cost
}

// positiveOr is v, or def where v is not positive: an option left unset
// takes its default. Each core leaf keeps its own, so none imports settings.
func positiveOr[T ~int | ~int64 | ~float64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}
