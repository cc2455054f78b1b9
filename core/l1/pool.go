// Package l1 is the L1 memory pool of the cache server: one contiguous region
// (a named shared-memory segment workers write into directly, or private
// memory), an aligned allocator over it, and the table of cached objects with
// their TTL read/write locks and LRU eviction.
//
// Object states follow LMCache's L1 manager: absent → write-locked
// (ReserveWrite) → ready (FinishWrite) → read-locked with a count
// (ReserveReadPrefix / FinishRead). A write-locked object is never readable;
// locks expire after their TTL so that a vanished worker cannot pin memory
// forever. All methods are safe for concurrent use.
package l1

import (
	"context"
	"errors"
	"fmt"
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
	DefaultTick      = time.Second
)

// Eviction policies.
const (
	PolicyLRU  = "LRU"
	PolicyNoop = "noop"
)

// ErrNoSpace means a ReserveWrite batch does not fit even after evicting
// every unlocked object the policy allows.
var ErrNoSpace = errors.New("l1: not enough free space in the pool")

// ErrSegmentBusy means the requested segment is held by a live server.
var ErrSegmentBusy = segment.ErrBusy

// NormalizeName strips leading '/' and adds SegmentPrefix unless present.
func NormalizeName(name string) string { return segment.NormalizeName(name) }

// Decision describes the memory behind the pool and why it was chosen.
type Decision = segment.Decision

// Options configures a Pool. Zero values take the defaults above.
type Options struct {
	Size, Align int64
	// Segment is the shared-memory name (normalised); "" = anonymous memory.
	Segment string
	// NoShmReason is the Decision reason when Segment is "".
	NoShmReason string
	// ShmDir is the shared-memory directory; "" = /dev/shm.
	ShmDir string
	// Prefault populates the pages in the background after Open.
	Prefault          bool
	WriteTTL, ReadTTL time.Duration
	// Policy is LRU or noop (case-insensitive).
	Policy           string
	Watermark, Ratio float64
	// Now is the clock for lock TTLs; nil = time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// Tick is the eviction loop period; 0 = 1 s.
	Tick time.Duration
	// Statfs returns the free bytes of a directory; nil = statfs(2).
	Statfs func(dir string) (int64, error)
}

// Reservation is one object reserved by ReserveWrite: ks[Index] lives at
// [Offset, Offset+Length) of the pool. Length is the requested size.
type Reservation struct {
	Index          int
	Key            keys.ObjectKey
	Offset, Length int64
}

// Stats is a snapshot of the pool's counters.
type Stats struct {
	Objects     int
	UsedBytes   int64 // allocated bytes (sizes rounded up to Align)
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

	Policy            string
	Watermark, Ratio  float64
	WriteTTL, ReadTTL time.Duration
}

// Pool is the L1 memory pool.
type Pool struct {
	seg  *segment.Segment
	now  func() time.Time
	log  *slog.Logger
	tick time.Duration

	mu        sync.Mutex
	closed    bool
	alloc     *alloc.Allocator
	t         table
	policy    string
	watermark float64
	ratio     float64
	writeTTL  time.Duration
	readTTL   time.Duration
	st        Stats
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
	if opts.Tick <= 0 {
		opts.Tick = DefaultTick
	}
	p := &Pool{now: opts.Now, log: opts.Logger, tick: opts.Tick}
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
	seg, err := segment.Open(segment.Options{
		Name:        opts.Segment,
		NoShmReason: opts.NoShmReason,
		Dir:         opts.ShmDir,
		Size:        opts.Size,
		Prefault:    opts.Prefault,
		Statfs:      opts.Statfs,
		Logger:      opts.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("l1: %w", err)
	}
	p.seg = seg
	p.alloc = a
	p.t.init()
	return p, nil
}

// Decision says which memory backs the pool and why.
func (p *Pool) Decision() Decision { return p.seg.Decision() }

// Close unmaps the pool, unlinks its segment and releases the flock.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	if err := p.seg.Close(); err != nil {
		return fmt.Errorf("l1: close pool: %w", err)
	}
	return nil
}

// Bytes is a view of [off, off+n) of the pool, or nil when out of range or
// after Close.
func (p *Pool) Bytes(off, n int64) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	mem := p.seg.Bytes()
	if p.closed || off < 0 || n < 0 || off > int64(len(mem)) || n > int64(len(mem))-off {
		return nil
	}
	return mem[off : off+n : off+n]
}

// Run sweeps expired locks and evicts on the watermark every tick (1 s)
// until ctx is done.
func (p *Pool) Run(ctx context.Context) {
	t := time.NewTicker(p.tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.maintain()
		}
	}
}

// maintain is one loop iteration: expire locks, then, at or above the
// watermark, evict Ratio of the objects (at least one) in policy order.
func (p *Pool) maintain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	p.st.EvictionTicks++
	p.sweep(now)
	if p.policy != PolicyLRU || p.t.len() == 0 {
		return
	}
	used := p.alloc.Size() - p.alloc.Free()
	if float64(used) < p.watermark*float64(p.alloc.Size()) {
		return
	}
	n := max(1, int(p.ratio*float64(p.t.len())))
	got := 0
	for got < n && p.evictOne(now) {
		got++
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
	default:
		return fmt.Errorf("l1: eviction policy %q: want LRU or noop", policy)
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
	s.Objects = p.t.len()
	s.Size = p.alloc.Size()
	s.UsedBytes = p.alloc.Size() - p.alloc.Free()
	s.FreeExtents = p.alloc.Extents()
	s.Prefaulted = p.seg.Prefaulted()
	s.WriteLocked, s.ReadLocked = p.t.writeLocked, p.t.readLocked
	s.Policy, s.Watermark, s.Ratio = p.policy, p.watermark, p.ratio
	s.WriteTTL, s.ReadTTL = p.writeTTL, p.readTTL
	return s
}
