package tier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/layout"
	"kvdock/core/tierstate"
	"kvdock/settings"
)

// Pool is the part of the L1 pool (core/l1) the tiers use.
type Pool interface {
	// PinRead, HoldRead and ReleaseRead pin a published object while its
	// bytes are copied out (a pin that is not a use of it);
	// ReserveReadPrefix locks what a lookup's tier phase loaded (a use);
	// FinishRead drops unused locks.
	PinRead(ks []keys.ObjectKey, count int) int
	ReserveReadPrefix(ks []keys.ObjectKey, count int) int
	FinishRead(ks []keys.ObjectKey, count int)
	HoldRead(k keys.ObjectKey) (l1.ReadRef, bool)
	ReleaseRead(refs []l1.ReadRef)
	// Held tells whether a hold is still in force (its bytes still the
	// object's), asked before a write streamed from them is published.
	Held(ref l1.ReadRef) bool
	// ReserveLoad, FinishWrite and AbortWrite put a loaded value into L1
	// (ReserveLoad: a value a lookup reads next, which admission never
	// refuses).
	ReserveLoad(owner l1.Owner, k keys.ObjectKey, size int64) ([]l1.Reservation, error)
	FinishWrite(rs []l1.Reservation) bool
	AbortWrite(rs []l1.Reservation)
	View(off, n int64) ([]byte, func())
}

// Layouts resolves a worker group's registered layout; *layout.Registry is one.
type Layouts interface {
	// LayoutOf is the layout of KV group g of the layouts registered as
	// id (keys.ObjectKey.Layout) for (model, worldSize): each group of a
	// hybrid model has its own, and its values are stored, named and
	// verified under it.
	LayoutOf(model string, worldSize int, id uint64, g uint32) (layout.Layout, bool)
}

// Store policies.
const (
	StoreWriteBehind = "write-behind"
	StoreNone        = "none"
)

// Defaults for Options.
const (
	DefaultQueueBytes     = 256 << 20
	DefaultQueueItems     = 4096
	DefaultWorkersPerTier = 2
	// watchEvery is how often Run looks at the tiers' states for events.
	watchEvery          = 250 * time.Millisecond
	DefaultMaxInFlight  = 8
	DefaultLoadTimeout  = 2 * time.Second
	DefaultWriteTimeout = 30 * time.Second
	DefaultMaxJobs      = 64
	// MaxPrefetchKeys bounds the keys one lookup asks the tiers for.
	MaxPrefetchKeys = 4096
)

// Options tune a Set; zero values take the defaults.
type Options struct {
	// StorePolicy is StoreWriteBehind (default) or StoreNone.
	StorePolicy string
	// QueueBytes and QueueItems bound each tier's write-behind queue (the
	// bytes of the chunks waiting, counted until their write ends).
	QueueBytes     int64
	QueueItems     int
	WorkersPerTier int
	// MaxInFlight bounds the tier loads running at once, over all lookups.
	MaxInFlight int
	// LoadTimeout bounds one lookup's tier phase (Has and loads).
	LoadTimeout  time.Duration
	WriteTimeout time.Duration
	// MaxJobs bounds the lookups in their tier phase at once; past it a
	// lookup answers its L1 hits only.
	MaxJobs int
	// Owner owns the write locks of loads in L1 (default l1.PrefetchOwner()).
	Owner  l1.Owner
	Logger *slog.Logger
	// StateChanged is told when a tier changes state (up, down with the
	// reason, degraded), for the events pane. Called from Run's watcher.
	StateChanged func(t tierstate.Tier)
	// LastRequest, when set, tells when the request path last saw a
	// message: the write-behind writers wait for a quiet moment before
	// each piece they checksum, copy or write (see yieldToRequests).
	LastRequest func() time.Time
	// Contents, when set, is told each object a tier came to hold
	// (present) or let go, as the tier tells it (ContentNotifier), in the
	// tier's order: the KV event stream's tier media. Only objects this Set
	// wrote are told.
	Contents func(tier int, k keys.ObjectKey, present bool)
	// Loaded, when set, is told of the objects a prefetch published in L1.
	Loaded func(ks []keys.ObjectKey)
}

// tierCounters are the Set's own counters of one tier. hits counts values
// loaded; misses counts the chunks a lookup asked the tier for and did not
// get: the chunk after the tier's last one (also from its memory, see
// KnownAbsent), every chunk asked of a tier that failed to answer, and a
// load that found its value gone.
type tierCounters struct {
	hits, misses, corrupt, loads, timeouts atomic.Uint64
	dropped, written, skipped, failed      atomic.Uint64
	queued                                 atomic.Int64 // items in the queue or being written
	qbytes                                 atomic.Int64 // their bytes
}

type item struct {
	key  keys.ObjectKey
	lay  layout.Layout
	size int64
}

type member struct {
	b  Backend
	q  chan item
	st tierCounters
	// names maps the backend keys of the values being written or held to
	// their objects, for Options.Contents (nil without it): bounded by the
	// tier's own values and the writes in flight.
	nmu   sync.Mutex
	names map[string]*named
	// seen is the state Run's watcher last reported (from NewSet on), with
	// its Since: a change of Since alone is a spell the watcher missed
	// between two ticks (down and back up), still worth an event.
	seen      tierstate.State
	seenSince time.Time
}

type stateChange struct {
	i  int
	st tierstate.Tier
}

// Set runs backends behind an L1 pool. It is safe for concurrent use.
type Set struct {
	tiers   []*member
	pool    Pool
	layouts Layouts
	opts    Options
	log     *slog.Logger

	inflight chan struct{} // load slots
	jobs     chan struct{} // prefetch job slots

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // workers and prefetch jobs
	mu     sync.Mutex
	closed bool

	// changes carries the state changes StateNotifier backends tell, to
	// Run's watcher; bounded (a full channel drops: the poll still sees the
	// final state).
	changes chan stateChange

	// beforeCopy, when set (tests), runs between pinning an object and
	// copying it out for a tier write.
	beforeCopy func(k keys.ObjectKey)
}

// NewSet returns a Set over backends (in lookup order), copying from and
// loading into pool. Run starts its workers; Close stops them and closes
// the backends.
func NewSet(backends []Backend, pool Pool, layouts Layouts, opts Options) *Set {
	if opts.StorePolicy == "" {
		opts.StorePolicy = StoreWriteBehind
	}
	opts.QueueBytes = settings.PositiveOr(opts.QueueBytes, DefaultQueueBytes)
	opts.QueueItems = settings.PositiveOr(opts.QueueItems, DefaultQueueItems)
	opts.WorkersPerTier = settings.PositiveOr(opts.WorkersPerTier, DefaultWorkersPerTier)
	opts.MaxInFlight = settings.PositiveOr(opts.MaxInFlight, DefaultMaxInFlight)
	opts.LoadTimeout = settings.PositiveOr(opts.LoadTimeout, DefaultLoadTimeout)
	opts.WriteTimeout = settings.PositiveOr(opts.WriteTimeout, DefaultWriteTimeout)
	opts.MaxJobs = settings.PositiveOr(opts.MaxJobs, DefaultMaxJobs)
	if opts.Owner == (l1.Owner{}) {
		opts.Owner = l1.PrefetchOwner()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Set{
		pool:     pool,
		layouts:  layouts,
		opts:     opts,
		log:      opts.Logger,
		inflight: make(chan struct{}, opts.MaxInFlight),
		jobs:     make(chan struct{}, opts.MaxJobs),
		changes:  make(chan stateChange, 64),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	for _, b := range backends {
		st := b.Stats()
		m := &member{b: b, q: make(chan item, opts.QueueItems), seen: st.State, seenSince: st.Since}
		s.tiers = append(s.tiers, m)
		if n, ok := b.(ContentNotifier); ok && opts.Contents != nil {
			i := len(s.tiers) - 1
			m.names = map[string]*named{}
			n.NotifyContents(func(key string, present bool) { s.told(i, m, key, present) })
		}
		if n, ok := b.(StateNotifier); ok {
			i := len(s.tiers) - 1
			n.NotifyState(func(st tierstate.Tier) {
				select {
				case s.changes <- stateChange{i, st}:
				default:
				}
			})
		}
	}
	return s
}

// Len is the number of tiers.
func (s *Set) Len() int { return len(s.tiers) }

// Run runs the write-behind workers and watches the tiers' states until ctx
// is done or Close is called; it returns once the workers have stopped.
func (s *Set) Run(ctx context.Context) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	for _, m := range s.tiers {
		for range s.opts.WorkersPerTier {
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.work(m)
			}()
		}
	}
	s.mu.Unlock()
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.stop()
			return
		case <-s.ctx.Done():
			return
		case c := <-s.changes:
			s.report(c.i, c.st)
		case <-t.C:
			for i, m := range s.tiers {
				s.report(i, m.b.Stats())
			}
		}
	}
}

// report tells StateChanged about tier i's state st unless it is the one
// last reported. Only Run calls it.
func (s *Set) report(i int, st tierstate.Tier) {
	m := s.tiers[i]
	// A told change older than what was last reported (the poll got there
	// first) is history: reporting it now would put the events out of order.
	if (st.State == m.seen && st.Since.Equal(m.seenSince)) || st.Since.Before(m.seenSince) {
		return
	}
	m.seen, m.seenSince = st.State, st.Since
	st.Index = i
	s.log.Warn("tier state", "tier", i, "type", st.Type, "state", st.State, "reason", st.Reason)
	if s.opts.StateChanged != nil {
		s.opts.StateChanged(st)
	}
}

// stop cancels every job and worker and waits for them; after it no call
// touches the pool.
func (s *Set) stop() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}

// Close stops the Set (as Run's ctx ending does) and closes the backends.
func (s *Set) Close() error {
	s.stop()
	var errs []error
	for i, m := range s.tiers {
		if err := m.b.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close tier %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// enter admits one background task; false once stopping.
func (s *Set) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// Stats is each tier's snapshot: the backend's part with the Set's
// counters (hits, misses, corrupt values, loads, the queue) added.
func (s *Set) Stats() []tierstate.Tier {
	out := make([]tierstate.Tier, len(s.tiers))
	for i, m := range s.tiers {
		t := m.b.Stats()
		t.Index = i
		// A backend's own Corrupt (files its start scan rejected) adds
		// to the values the loads rejected.
		t.Hits, t.Misses, t.Corrupt = m.st.hits.Load(), m.st.misses.Load(), t.Corrupt+m.st.corrupt.Load()
		t.Loads, t.LoadTimeouts = m.st.loads.Load(), m.st.timeouts.Load()
		t.QueueDepth = int(m.st.queued.Load())
		t.QueueBytes = m.st.qbytes.Load()
		// A write the tier refused (full, down) is as lost as one the full
		// queue dropped: both count, as the faces promise.
		t.DroppedWrites = m.st.dropped.Load() + m.st.failed.Load()
		out[i] = t
	}
	return out
}

// QueueStats are a tier's write-behind counters.
type QueueStats struct {
	Written, Skipped, Failed, Dropped uint64
	Depth                             int
	Bytes                             int64
}

// Queue returns tier i's write-behind counters.
func (s *Set) Queue(i int) QueueStats {
	m := s.tiers[i]
	return QueueStats{
		Written: m.st.written.Load(), Skipped: m.st.skipped.Load(), Failed: m.st.failed.Load(),
		Dropped: m.st.dropped.Load(), Depth: int(m.st.queued.Load()), Bytes: m.st.qbytes.Load(),
	}
}
