// Package l1 is the L1 memory pool of the cache server: one contiguous region
// (a named shared-memory segment workers write into directly, or private
// memory), an aligned allocator over it, and the table of cached objects with
// their TTL read/write locks and eviction: LRU, or prefix (prefix.go),
// which evicts a chunk only after every resident chunk that follows it.
//
// Object states follow LMCache's L1 manager: absent → write-locked
// (ReserveWrite) → ready (FinishWrite) → read-locked with a count
// (ReserveReadPrefix / FinishRead). A write-locked object is never readable;
// locks expire after their TTL so that a vanished worker cannot pin memory
// forever. All methods are safe for concurrent use.
//
// A Clear drops only unlocked objects: a locked one (being written, or
// read-locked for a worker that will read or is reading it) becomes doomed,
// invisible to lookups and new reservations, and is freed when its transfer
// ends or its lock expires, so a worker never sees its slot handed to
// someone else. A write is finished or aborted through its Reservation; a
// worker turns one of the read locks LOOKUP left into a hold (HoldRead)
// released through its ReadRef. Both name one lock of one record, so a late
// call never acts on a lock taken later by someone else, and no by-key
// release unlocks an object a worker is reading. Locks are charged to an
// Owner and capped per owner and in total, so one peer cannot pin the pool.
//
// Memory views (View) are counted; Close waits for them before it unmaps,
// and leaves the mapping in place (name unlinked, flock released) when they
// are not returned in time, so a late copy can never fault the process.
//
// What happens to objects (stored, evicted, expired, cleared, refused) is
// reported to an Observer, so the pool imports nothing that learns from it.
package l1

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"sync"
	"time"

	"kvdock/core/keys"
	"kvdock/core/l1/alloc"
	"kvdock/core/l1/segment"
)

// SegmentPrefix starts every pool segment name.
const SegmentPrefix = segment.Prefix

// Defaults applied to zero Options fields (LMCache's defaults).
const (
	DefaultAlign     = 4096
	DefaultWriteTTL  = 600 * time.Second
	DefaultReadTTL   = 300 * time.Second
	DefaultWatermark = 0.8
	DefaultRatio     = 0.2
	// MaintainEvery is how often the owner runs Maintain.
	MaintainEvery = time.Second
	// DefaultOwnerLockShare is the share of the pool one owner (a worker
	// instance, or all lookups) may hold locked at once.
	DefaultOwnerLockShare = 0.5
	// DefaultTotalLockShare is the share of the pool all owners together may
	// hold locked; the rest stays evictable for new stores.
	DefaultTotalLockShare = 0.9
	// DefaultCloseWait bounds how long Close waits for outstanding views.
	DefaultCloseWait = 10 * time.Second
)

// Eviction policies.
const (
	PolicyLRU  = "LRU"
	PolicyNoop = "noop"
	// PolicyPrefix evicts only chunks no resident chunk depends on (the
	// leaves of the prefix tree, prefix.go), the least recently used
	// first, every rank and group of a chunk together.
	PolicyPrefix = "prefix"
)

// ErrNoSpace means a ReserveWrite batch does not fit even after evicting
// every unlocked object the policy allows.
var ErrNoSpace = errors.New("l1: not enough free space in the pool")

// ErrLockCap means a ReserveWrite batch would take its owner, or all owners
// together, past the share of the pool they may hold locked.
var ErrLockCap = errors.New("l1: lock cap reached")

// OwnerKind says what kind of peer an Owner is.
type OwnerKind uint8

// Owner kinds.
const (
	OwnerInstance  OwnerKind = iota // a worker instance (its instance id)
	OwnerLookup                     // a lookup request (or, ID 0, the server's own readers)
	OwnerPrefetch                   // loads from the L2 tiers, all together
	OwnerAbandoned                  // holds whose holder went away (Abandon), until their TTL
)

// Owner names who holds a lock, for the lock caps. Peer, for a lookup
// owner, is the peer whose share of the lookups' cap its locks count
// against (lookupshare.go).
type Owner struct {
	Kind OwnerKind
	ID   int64
	Peer uint64
}

// InstanceOwner is the owner of a worker instance's locks.
func InstanceOwner(id int64) Owner { return Owner{Kind: OwnerInstance, ID: id} }

// LookupOwner is the owner of the read locks ReserveReadPrefix takes.
func LookupOwner() Owner { return Owner{Kind: OwnerLookup} }

// RequestOwner is the owner of the read locks the LOOKUP of one request
// takes (ReserveLookup): the peer (its ZMQ routing id) and the request id
// hashed, never 0 (LookupOwner's), so two peers that send the same request
// id are two owners; Peer is the routing id hashed, odd, so no peer shares
// the server's own readers' (0) or the carried lookups' (2).
func RequestOwner(peer, request string) Owner {
	h := fnv.New64a()
	_, _ = h.Write([]byte(peer))
	pid := h.Sum64() | 1
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(request))
	return Owner{Kind: OwnerLookup, ID: int64(h.Sum64() | 1), Peer: pid}
}

// PrefetchOwner is the owner of the write locks of loads from the L2 tiers.
func PrefetchOwner() Owner { return Owner{Kind: OwnerPrefetch} }

// AbandonedOwner is charged for the holds of holders that went away.
func AbandonedOwner() Owner { return Owner{Kind: OwnerAbandoned} }

func (o Owner) String() string {
	switch o.Kind {
	case OwnerAbandoned:
		return "abandoned holds"
	case OwnerLookup:
		if o == CarriedLookupOwner() {
			return "carried lookups"
		}
		if o.ID != 0 {
			return fmt.Sprintf("lookup %016x", uint64(o.ID))
		}
		return "lookups"
	case OwnerPrefetch:
		return "tier loads"
	}
	return fmt.Sprintf("instance %d", o.ID)
}

// ErrSegmentBusy means the requested segment is held by a live server.
var ErrSegmentBusy = segment.ErrBusy

// NormalizeName strips leading '/' and adds SegmentPrefix unless present.
func NormalizeName(name string) string { return segment.NormalizeName(name) }

// PrivateSegmentName is the private segment of the server at host:port:
// the memory of a pool that is not shared, kept by a restart like a shared
// segment and never advertised.
func PrivateSegmentName(host string, port int) string { return segment.PrivateName(host, port) }

// IsPrivateSegment reports whether name is a private segment's: never one
// to advertise.
func IsPrivateSegment(name string) bool { return segment.IsPrivate(name) }

// Decision describes the memory behind the pool and why it was chosen.
type Decision = segment.Decision

// Options configures a Pool. Zero values take the defaults above.
type Options struct {
	Size, Align int64
	// Plan is the seed decision this pool carries out, made once from the
	// settings before the pool exists: Plan.Segment is the shared segment to
	// create (normalised); "" = not shared because of Plan.Reason, in the
	// private segment Plan.Private (PrivateSegmentName, never advertised)
	// or, when that is "" too, anonymous memory. Open checks that the
	// segment fits the shared-memory directory; Pool.Decision is the
	// outcome, the one value read after Open.
	Plan Decision
	// ShmDir is the shared-memory directory; "" = /dev/shm.
	ShmDir string
	// Prefault populates the pages in the background after Open.
	Prefault          bool
	WriteTTL, ReadTTL time.Duration
	// Policy is LRU (when empty), prefix or noop (case-insensitive);
	// kvdock's settings default to prefix.
	Policy           string
	Watermark, Ratio float64
	// Now is the clock for lock TTLs; nil = time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// Statfs returns the free bytes of a directory; nil = statfs(2).
	Statfs func(dir string) (int64, error)
	// Bytes prints a size in the segment's reasons (segment.Options.Bytes:
	// the engine passes settings.BytesText); nil prints the count of bytes.
	Bytes func(n int64) string
	// ReadCapRefused, when set, is told (at most once a second, with the
	// reason) that a lock cap refused the scheduler's read locks: lookups
	// have no reply that could say so, so the operator hears it as an event.
	ReadCapRefused func(reason string)
	// OwnerLockShare caps the locked bytes of one owner as a share of the
	// pool, TotalLockShare those of all owners; 0 = the defaults. A
	// reservation or read lock past a cap is refused.
	OwnerLockShare, TotalLockShare float64
	// CloseWait bounds Close's wait for outstanding views; 0 = 10 s.
	CloseWait time.Duration
	// Observer, when set, is told what happens to objects (stored, lost,
	// cleared) and of every eviction loop tick.
	Observer Observer
	// ObserveMax bounds the objects one Clear or one refused batch reports
	// to the Observer one by one; 0 = DefaultObserveMax.
	ObserveMax int
}

// Reservation is one object reserved by ReserveWrite: ks[Index] lives at
// [Offset, Offset+Length) of the pool. Length is the requested size. It also
// names the write lock, for FinishWrite and AbortWrite.
type Reservation struct {
	Index          int
	Key            keys.ObjectKey
	Offset, Length int64
	rec            int32
	lock           uint64
}

// ReadRef is a worker's hold on a read-locked object (HoldRead): where the
// object lives and which read-lock era the hold belongs to, for ReleaseRead
// or ReturnRead, each called once per ref.
type ReadRef struct {
	Offset, Length int64
	rec            int32
	lock           uint64
}

// Stats is a snapshot of the pool's counters.
type Stats struct {
	Objects     int   // live objects (doomed ones not counted)
	UsedBytes   int64 // allocated bytes (sizes rounded up to Align): Size minus the allocator's free bytes
	LiveBytes   int64 // sum of the rounded sizes of every record, doomed included; equals UsedBytes unless space leaked
	LockedBytes int64 // rounded sizes of locked records (write, read or doomed), what the lock caps count
	Doomed      int   // objects a Clear dropped that are still locked by a transfer
	DoomedBytes int64
	LockOwners  int   // owners holding locks now
	Views       int   // outstanding memory views
	Size        int64 // allocatable bytes
	FreeExtents int
	Prefaulted  int64

	WriteLocked, ReadLocked int

	Evictions         uint64 // objects evicted by policy (loop and on demand)
	EvictionTicks     uint64 // eviction loop iterations
	AllocFailures     uint64 // ReserveWrite batches answered with ErrNoSpace
	ReadHits          uint64 // keys read-locked by ReserveReadPrefix
	ReadMisses        uint64 // ReserveReadPrefix calls stopped by a missing key
	WriteReservations uint64 // objects reserved by ReserveWrite
	WriteExisting     uint64 // keys ReserveWrite skipped because they exist
	ExpiredWriteLocks uint64 // reservations dropped by the write TTL
	ExpiredReadLocks  uint64 // read locks reset by the read TTL
	WriteDoomed       uint64 // keys ReserveWrite skipped because a cleared object of that key is still locked
	StaleFinishes     uint64 // FinishWrite/AbortWrite/ReleaseRead calls for a lock that had already ended
	AbandonedWrites   uint64 // reservations doomed by Abandon (bytes kept until their TTL)
	AbandonedReads    uint64 // read holds left in force by Abandon until their TTL
	LockCapRefusals   uint64 // reservations or read locks refused by a lock cap
	BenchRefusals     uint64 // benchmark batches refused for want of their own room (ErrBenchRoom)
	// BenchBytes is the rounded sizes of benchmark models' objects
	// (apart.go), included in UsedBytes.
	BenchBytes   int64
	OwnerLockCap int64 // bytes one owner may hold locked
	TotalLockCap int64 // bytes all owners together may hold locked
	// LookupReclaims counts the lookups' read-lock eras released so that a
	// peer under its share of the lookups' cap could lock (lookupshare.go).
	LookupReclaims uint64
	// AdmissionRefusals counts the new objects a store was not given a slot
	// for: the prefix policy's victim was due back before them
	// (nextuse.Admits). The store reserves the leading ones.
	AdmissionRefusals uint64

	// ResidentBytes is the rounded sizes of the objects not doomed;
	// UsableBytes those of them a LOOKUP can reach: they start a prompt or
	// the chunk before them is resident (prefix.go).
	ResidentBytes, UsableBytes int64

	Policy            string
	Watermark, Ratio  float64
	WriteTTL, ReadTTL time.Duration
}

// UsableRatio is UsableBytes over ResidentBytes, 1 for an empty pool.
func (s Stats) UsableRatio() float64 {
	if s.ResidentBytes <= 0 {
		return 1
	}
	return float64(s.UsableBytes) / float64(s.ResidentBytes)
}

// Pool is the L1 memory pool.
type Pool struct {
	seg *segment.Segment
	now func() time.Time
	log *slog.Logger

	mu        sync.Mutex
	closed    bool
	views     int           // outstanding View results
	viewsDone chan struct{} // closed when views drops to 0 during Close
	closeWait time.Duration
	alloc     *alloc.Allocator
	t         table
	// claimable indexes, by offset, the adopted records a carried transfer
	// may claim (claim.go), until EndClaims.
	claimable map[int64]int32
	policy    string
	watermark float64
	ratio     float64
	writeTTL  time.Duration
	readTTL   time.Duration
	st        Stats
	// obs hears what happens to objects (observer.go); key is the scratch
	// key it is handed for a record.
	obs        Observer
	observeMax int
	key        keys.ObjectKey

	// Lock accounting: bytes locked per owner (an entry lives only while
	// its owner holds locks, so the table is bounded by the locked records)
	// and in total; the caps are computed from the shares at Open.
	owners             map[Owner]uint32
	ownerSlots         []ownerCharge
	ownerFree          []uint32
	lockedBytes        int64
	ownerCap, totalCap int64
	nextLock           uint64
	lastCapLog         int64 // unix ns of the last lock-cap log line
	capSuppressed      uint64
	readCapRefused     func(reason string) // called under mu
	// lookupPeers is what each peer's lookups hold read-locked (an entry
	// lives while the peer holds some), for their shares of the lookups'
	// cap (lookupshare.go).
	lookupPeers map[uint64]int64
}

// ownerCharge is the bytes of locks one owner holds.
type ownerCharge struct {
	owner Owner
	bytes int64
}

// Open maps the pool (see package segment for the shared-memory rules: stale
// cleanup, capacity check with fallback to anonymous memory, flock for life)
// and returns it empty. A segment name held by a live server is an error
// wrapping ErrSegmentBusy.
func Open(opts Options) (*Pool, error) {
	if opts.Size <= 0 {
		return nil, fmt.Errorf("l1: pool size %d bytes, want > 0", opts.Size)
	}
	if opts.Align == 0 {
		opts.Align = DefaultAlign
	}
	if opts.Align < 0 || opts.Align&(opts.Align-1) != 0 {
		return nil, fmt.Errorf("l1: alignment %d bytes is not a power of two", opts.Align)
	}
	if opts.Size < opts.Align {
		return nil, fmt.Errorf("l1: pool size %d bytes is smaller than the alignment %d", opts.Size, opts.Align)
	}
	if opts.WriteTTL == 0 {
		opts.WriteTTL = DefaultWriteTTL
	}
	if opts.ReadTTL == 0 {
		opts.ReadTTL = DefaultReadTTL
	}
	if opts.Policy == "" {
		opts.Policy = PolicyLRU
	}
	if opts.Watermark == 0 {
		opts.Watermark = DefaultWatermark
	}
	if opts.Ratio == 0 {
		opts.Ratio = DefaultRatio
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.OwnerLockShare == 0 {
		opts.OwnerLockShare = DefaultOwnerLockShare
	}
	if opts.TotalLockShare == 0 {
		opts.TotalLockShare = DefaultTotalLockShare
	}
	if opts.CloseWait <= 0 {
		opts.CloseWait = DefaultCloseWait
	}
	if opts.ObserveMax <= 0 {
		opts.ObserveMax = DefaultObserveMax
	}
	p := &Pool{now: opts.Now, log: opts.Logger, closeWait: opts.CloseWait, owners: make(map[Owner]uint32),
		lookupPeers: make(map[uint64]int64), readCapRefused: opts.ReadCapRefused, obs: opts.Observer, observeMax: opts.ObserveMax}
	if err := p.setEviction(opts.Policy, opts.Watermark, opts.Ratio); err != nil {
		return nil, err
	}
	if err := p.setTTLs(opts.WriteTTL, opts.ReadTTL); err != nil {
		return nil, err
	}
	a, err := alloc.New(opts.Size, opts.Align)
	if err != nil {
		return nil, fmt.Errorf("l1: %w", err)
	}
	p.alloc = a
	if err := p.setLockShares(opts.OwnerLockShare, opts.TotalLockShare); err != nil {
		return nil, err
	}
	seg, err := segment.Open(segment.Options{
		Name:        opts.Plan.Segment,
		Private:     opts.Plan.Private,
		NoShmReason: opts.Plan.Reason,
		Dir:         opts.ShmDir,
		Size:        opts.Size,
		Prefault:    opts.Prefault,
		Statfs:      opts.Statfs,
		Logger:      opts.Logger,
		Bytes:       opts.Bytes,
	})
	if err != nil {
		return nil, fmt.Errorf("l1: %w", err)
	}
	p.seg = seg
	p.t.init()
	return p, nil
}

// Decision says which memory backs the pool and why.
func (p *Pool) Decision() Decision { return p.seg.Decision() }

// Close is CloseContext with the Options' CloseWait (default 10 s).
func (p *Pool) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), p.closeWait)
	defer cancel()
	return p.CloseContext(ctx)
}

// CloseContext refuses new views, waits until every outstanding view is
// released or ctx is done, then unmaps the pool, unlinks its segment and
// releases the flock. If views are still out when ctx is done it does not
// unmap (a copy through a view would fault the process): it unlinks the name
// and releases the flock, keeps the mapping until the process exits, logs
// it and returns an error. A second call does nothing.
func (p *Pool) CloseContext(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	var wait chan struct{}
	if p.views > 0 {
		wait = make(chan struct{})
		p.viewsDone = wait
	}
	p.mu.Unlock()
	if wait != nil {
		select {
		case <-wait:
		case <-ctx.Done():
			p.mu.Lock()
			n := p.views
			p.mu.Unlock()
			p.log.Error("l1 pool closed with memory views still in use: mapping kept until exit",
				"views", n, "size", p.seg.Decision().Size, "reason", ctx.Err())
			if err := p.seg.Detach(); err != nil {
				return fmt.Errorf("l1: close pool with %d views out: %w", n, err)
			}
			return fmt.Errorf("l1: close pool: %d memory views still out (%w): mapping kept, segment name released", n, ctx.Err())
		}
	}
	if err := p.seg.Close(); err != nil {
		return fmt.Errorf("l1: close pool: %w", err)
	}
	return nil
}

// View is [off, off+n) of the pool and the func that returns it. The pool
// is not unmapped while a view is out, so every copy through a view must
// happen before release (release is idempotent). Out of range, or once
// Close has begun, the view is nil (release is still safe to call).
func (p *Pool) View(off, n int64) ([]byte, func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed { // checked first: Close unmaps without the mutex
		return nil, func() {}
	}
	mem := p.seg.Bytes()
	if off < 0 || n < 0 || off > int64(len(mem)) || n > int64(len(mem))-off {
		return nil, func() {}
	}
	p.views++
	released := false
	return mem[off : off+n : off+n], func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if released {
			return
		}
		released = true
		p.views--
		if p.views == 0 && p.viewsDone != nil {
			close(p.viewsDone)
			p.viewsDone = nil
		}
	}
}

// Maintain is one pass of the pool's upkeep, which its owner runs every
// MaintainEvery: expire locks, then, at or above the
// watermark, evict Ratio of the objects (at least one) in policy order.
func (p *Pool) Maintain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	p.st.EvictionTicks++
	p.sweep(now)
	if p.policy == PolicyNoop {
		return
	}
	if p.obs != nil {
		p.obs.Tick(p.watermark, p.ratio)
	}
	if p.t.len() == 0 {
		return
	}
	used := p.alloc.Size() - p.alloc.Free()
	if float64(used) < p.watermark*float64(p.alloc.Size()) {
		return
	}
	n := max(1, int(p.ratio*float64(p.t.len())))
	got := p.evictBenchBelowWatermark(now) // benchmark objects first (apart.go)
	if got > 0 && float64(p.alloc.Size()-p.alloc.Free()) < p.watermark*float64(p.alloc.Size()) {
		n = got
	}
	for got < n {
		k := p.evictOne(now)
		if k == 0 {
			break
		}
		got += k
	}
	if got > 0 {
		p.log.Debug("l1 eviction", "evicted", got, "wanted", n, "used", used, "size", p.alloc.Size())
	}
}

// SetEviction changes the policy, watermark and ratio in place.
func (p *Pool) SetEviction(policy string, watermark, ratio float64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.setEviction(policy, watermark, ratio)
}

func (p *Pool) setEviction(policy string, watermark, ratio float64) error {
	var pol string
	switch {
	case strings.EqualFold(policy, PolicyLRU):
		pol = PolicyLRU
	case strings.EqualFold(policy, PolicyNoop):
		pol = PolicyNoop
	case strings.EqualFold(policy, PolicyPrefix):
		pol = PolicyPrefix
	default:
		return fmt.Errorf("l1: eviction policy %q: want LRU, prefix or noop", policy)
	}
	if !(watermark > 0 && watermark <= 1) {
		return fmt.Errorf("l1: eviction watermark %v: want a fraction in (0, 1]", watermark)
	}
	if !(ratio > 0 && ratio <= 1) {
		return fmt.Errorf("l1: eviction ratio %v: want a fraction in (0, 1]", ratio)
	}
	p.policy, p.watermark, p.ratio = pol, watermark, ratio
	return nil
}

// SetLockShares changes the lock caps in place: the share of the pool one
// owner, and all owners together, may hold locked. Locks already held stay;
// only new ones are refused past the caps.
func (p *Pool) SetLockShares(owner, total float64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.setLockShares(owner, total)
}

func (p *Pool) setLockShares(owner, total float64) error {
	if !(owner > 0 && owner <= 1) || !(total > 0 && total <= 1) {
		return fmt.Errorf("l1: lock shares %v per owner, %v in total: want fractions in (0, 1]", owner, total)
	}
	p.ownerCap = int64(owner * float64(p.alloc.Size()))
	p.totalCap = int64(total * float64(p.alloc.Size()))
	return nil
}

// SetTTLs changes the lock TTLs; they apply to locks taken from now on.
func (p *Pool) SetTTLs(write, read time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.setTTLs(write, read)
}

func (p *Pool) setTTLs(write, read time.Duration) error {
	if write <= 0 || read <= 0 {
		return fmt.Errorf("l1: lock TTLs write %v, read %v: want both > 0", write, read)
	}
	p.writeTTL, p.readTTL = write, read
	return nil
}

// Stats returns a snapshot of the counters.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sweep(p.now().UnixNano()) // by-state counts without waiting for the loop
	s := p.st
	s.Objects = p.t.len() - p.t.doomed
	s.Size = p.alloc.Size()
	s.UsedBytes = p.alloc.Size() - p.alloc.Free()
	s.LiveBytes = p.t.bytes
	s.BenchBytes = p.t.benchBytes
	s.ResidentBytes, s.UsableBytes = p.t.bytes-p.t.doomedBytes, p.t.usableBytes
	s.LockedBytes = p.lockedBytes
	s.Doomed, s.DoomedBytes = p.t.doomed, p.t.doomedBytes
	s.LockOwners = len(p.owners)
	s.Views = p.views
	s.OwnerLockCap, s.TotalLockCap = p.ownerCap, p.totalCap
	s.FreeExtents = p.alloc.Extents()
	s.Prefaulted = p.seg.Prefaulted()
	s.WriteLocked, s.ReadLocked = p.t.writeLocked, p.t.readLocked
	s.Policy, s.Watermark, s.Ratio = p.policy, p.watermark, p.ratio
	s.WriteTTL, s.ReadTTL = p.writeTTL, p.readTTL
	return s
}
