// Package lookup answers the scheduler's cache queries: LOOKUP (how many
// leading chunks of a prompt are cached, read-locking them for the workers
// that will retrieve them), the prefetch-job queries that report the answer
// (QUERY_PREFETCH_STATUS, QUERY_PREFETCH_LOOKUP_HITS), FREE_LOOKUP_LOCKS and
// END_SESSION, as plain Go calls that the RPC layer wires to the wire names.
//
// kvdock has no L2 tier, so every lookup job finishes inside Lookup; the
// "still running" answer of the protocol never occurs here.
package lookup

import (
	"container/list"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"kvdock/core/keys"
)

// Store is the part of the L1 pool a lookup needs.
type Store interface {
	// ReserveReadPrefix takes count read locks on each leading readable key,
	// stopping at the first miss, and returns how many keys it locked.
	ReserveReadPrefix(ks []keys.ObjectKey, count int) int
	// FinishRead releases count read locks on each key.
	FinishRead(ks []keys.ObjectKey, count int)
	// Touch refreshes the keys' recency for eviction.
	Touch(ks []keys.ObjectKey)
}

// Layouts tells whether a worker group registered a KV layout;
// *layout.Registry satisfies it.
type Layouts interface {
	Has(model string, worldSize int) bool
}

// Defaults for Options.
const (
	DefaultJobTTL  = 300 * time.Second // the L1 read-lock TTL: a job outliving its locks reports stale hits
	DefaultMaxJobs = 65536
	JobSweepPeriod = 60 * time.Second
)

// Options tune a Module; the zero value gives the defaults.
type Options struct {
	// JobTTL bounds how long an unqueried job is kept (default DefaultJobTTL).
	JobTTL time.Duration
	// MaxJobs bounds the job table; past it the oldest job is dropped
	// (default DefaultMaxJobs).
	MaxJobs int
	Now     func() time.Time
	Logger  *slog.Logger
}

// Module holds the lookup jobs. It is safe for concurrent use.
//
// Jobs are kept per request id until QueryStatus answers them, until a newer
// LOOKUP of the same id replaces them, or until they are JobTTL old or pushed
// out by MaxJobs. Dropping or replacing a job never releases its read locks:
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
	now      func() time.Time
	log      *slog.Logger

	mu    sync.Mutex
	jobs  map[string]*job
	order *list.List // of *job, oldest first

	lookups, earlyExits, failures          atomic.Int64
	reqTokens, reqChunks, hitChunks, hitTk atomic.Int64
	replaced, expired, answered            atomic.Int64
	freedKeys, touchedKeys                 atomic.Int64
}

type job struct {
	id        string
	created   time.Time
	elem      *list.Element
	hitChunks int
}

// Stats is a snapshot of the module's counters (lmcache_mp.lookups,
// lookup_requested, lookup_hit, lookup_early_exit, active_prefetch_jobs).
type Stats struct {
	Lookups         int64 // LOOKUP calls
	EarlyExits      int64 // lookups answered 0 without touching L1 (no layout, no full chunk)
	Failures        int64 // lookups rejected as invalid (still answered 0)
	RequestedTokens int64 // tokens sent with lookups
	RequestedChunks int64 // full chunks in those tokens
	HitChunks       int64 // chunks found (leading, on every rank)
	HitTokens       int64 // HitChunks × chunk size
	ActiveJobs      int   // jobs waiting for QUERY_PREFETCH_STATUS
	AnsweredJobs    int64 // jobs removed by QUERY_PREFETCH_STATUS
	ReplacedJobs    int64 // jobs replaced by a LOOKUP with the same request id
	ExpiredJobs     int64 // jobs dropped by JobTTL or MaxJobs
	FreedKeys       int64 // keys released by FREE_LOOKUP_LOCKS
	TouchedKeys     int64 // keys touched by END_SESSION
}

// New returns a Module resolving keys through s, locking in store and
// checking registrations in layouts.
func New(s *keys.Sessions, store Store, layouts Layouts, opts Options) *Module {
	if opts.JobTTL <= 0 {
		opts.JobTTL = DefaultJobTTL
	}
	if opts.MaxJobs <= 0 {
		opts.MaxJobs = DefaultMaxJobs
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Module{
		sessions: s,
		store:    store,
		layouts:  layouts,
		ttl:      opts.JobTTL,
		maxJobs:  opts.MaxJobs,
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

// Lookup runs a scheduler LOOKUP: it hashes every full chunk of r.Tokens,
// read-locks the leading keys found in L1 (1 + ExtraCount locks each, every
// rank) and records a job under r.RequestID with the number of chunks hit on
// all ranks. An unregistered (model, world size) or a prompt without a full
// chunk records 0. Locks taken on the keys of a chunk that missed on some
// rank are released at once: no worker will retrieve that chunk. An invalid
// key records 0 too (so the status query does not report a stale job) and
// returns the error.
func (m *Module) Lookup(r keys.KeyRequest, tpSize int) error {
	m.lookups.Add(1)
	m.reqTokens.Add(int64(len(r.Tokens)))
	if !m.layouts.Has(r.Model, r.WorldSize) {
		m.earlyExits.Add(1)
		m.log.Debug("lookup: no layout registered", "request_id", r.RequestID, "model", r.Model, "world_size", r.WorldSize)
		m.put(r.RequestID, 0)
		return nil
	}
	ks, err := m.sessions.LookupKeys(r)
	if err != nil {
		m.failures.Add(1)
		m.put(r.RequestID, 0)
		return fmt.Errorf("lookup: %w", err)
	}
	if len(ks) == 0 {
		m.earlyExits.Add(1)
		m.put(r.RequestID, 0)
		return nil
	}
	ws := r.WorldSize
	m.reqChunks.Add(int64(len(ks) / ws))
	count := 1 + ExtraCount(tpSize, ws)
	n := min(max(m.store.ReserveReadPrefix(ks, count), 0), len(ks))
	hit := n / ws
	if partial := ks[hit*ws : n]; len(partial) > 0 {
		m.store.FinishRead(partial, count)
	}
	m.hitChunks.Add(int64(hit))
	m.hitTk.Add(int64(hit * m.sessions.Hasher().ChunkSize()))
	m.put(r.RequestID, hit)
	return nil
}

// QueryStatus answers QUERY_PREFETCH_STATUS: the job's hit chunks, removing
// the job, so a second query of the same id answers 0. An unknown id answers
// 0. done is false only while an L2 prefetch runs, which kvdock never has.
func (m *Module) QueryStatus(requestID string) (hitChunks int, done bool) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked(now)
	j, ok := m.jobs[requestID]
	if !ok {
		return 0, true
	}
	m.removeLocked(j)
	m.answered.Add(1)
	return j.hitChunks, true
}

// QueryHits answers QUERY_PREFETCH_LOOKUP_HITS: the job's hit chunks, keeping
// the job. An unknown id answers 0; done is as for QueryStatus.
func (m *Module) QueryHits(requestID string) (hitChunks int, done bool) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked(now)
	if j, ok := m.jobs[requestID]; ok {
		return j.hitChunks, true
	}
	return 0, true
}

// FreeLocks answers FREE_LOOKUP_LOCKS: it resolves the keys of chunks
// [r.Start, r.End) for r.Worker (nil = every rank) through the session and
// releases 1 + ExtraCount read locks on each.
func (m *Module) FreeLocks(r keys.KeyRequest, tpSize int) error {
	ks, err := m.sessions.ObjectKeys(r)
	if err != nil {
		return fmt.Errorf("free lookup locks: %w", err)
	}
	if len(ks) == 0 {
		return nil
	}
	m.store.FinishRead(ks, 1+ExtraCount(tpSize, r.WorldSize))
	m.freedKeys.Add(int64(len(ks)))
	return nil
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
	if len(ks) > 0 {
		m.store.Touch(ks)
		m.touchedKeys.Add(int64(len(ks)))
	}
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

// Run sweeps stale jobs every JobSweepPeriod until ctx is done. (The session
// table has its own Run; the owner of both starts both.)
func (m *Module) Run(ctx context.Context) {
	t := time.NewTicker(JobSweepPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.Sweep()
		}
	}
}

// Stats returns a snapshot of the counters.
func (m *Module) Stats() Stats {
	return Stats{
		Lookups:         m.lookups.Load(),
		EarlyExits:      m.earlyExits.Load(),
		Failures:        m.failures.Load(),
		RequestedTokens: m.reqTokens.Load(),
		RequestedChunks: m.reqChunks.Load(),
		HitChunks:       m.hitChunks.Load(),
		HitTokens:       m.hitTk.Load(),
		ActiveJobs:      m.ActiveJobs(),
		AnsweredJobs:    m.answered.Load(),
		ReplacedJobs:    m.replaced.Load(),
		ExpiredJobs:     m.expired.Load(),
		FreedKeys:       m.freedKeys.Load(),
		TouchedKeys:     m.touchedKeys.Load(),
	}
}

// put records the job of id, replacing an older one.
func (m *Module) put(id string, hitChunks int) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked(now)
	if old, ok := m.jobs[id]; ok {
		m.removeLocked(old) // its locks stay: see Module
		m.replaced.Add(1)
	}
	j := &job{id: id, created: now, hitChunks: hitChunks}
	j.elem = m.order.PushBack(j)
	m.jobs[id] = j
	for len(m.jobs) > m.maxJobs {
		m.removeLocked(m.order.Front().Value.(*job))
		m.expired.Add(1)
	}
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
}
