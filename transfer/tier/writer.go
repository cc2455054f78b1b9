package tier

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/layout"
)

// PartsPutter is implemented by backends that can store a value given as
// its header and its payload, each where it lies, without joining them in a
// new buffer: the write-behind writers then stream a chunk straight from its
// L1 bytes instead of copying it out first. valid is called once every byte
// has been written and before the value becomes visible under key; false
// means the payload's memory may have been reused meanwhile (the L1 hold
// ended), and the backend must discard what it wrote and return an error
// wrapping ErrSourceChanged. pace, when not nil, is called before each
// piece of the value is written (the writer's yield to the request path).
type PartsPutter interface {
	PutParts(ctx context.Context, key string, head, payload []byte, valid func() bool, pace func()) error
}

// ErrSourceChanged is wrapped by PartsPutter.PutParts when valid said the
// payload's memory is no longer the value's.
var ErrSourceChanged = errors.New("tier: source bytes no longer held")

// errGone is a queued object no longer in L1 as queued: skipped.
var errGone = errors.New("object gone from L1")

const (
	// yieldSlice is how many bytes a writer copies or checksums between
	// yields of its P: a writer never holds a P for more than about a
	// millisecond, so the goroutines serving requests get one.
	yieldSlice = 1 << 20
	// writerNice is how much lower than the process the writers' threads
	// run: with few cores, the kernel gives the request path (and libzmq's
	// I/O threads) the CPU first and the writers what is left.
	writerNice = 10
)

// Enqueue queues published L1 objects ks (each lay.Bytes bytes) for every
// tier under the write-behind policy. It never blocks: a tier whose queue
// is full in items or bytes drops the object and counts it. The bytes are
// read out of L1 only when a worker takes the object, under a read hold.
func (s *Set) Enqueue(ks []keys.ObjectKey, lay layout.Layout) {
	if s.opts.StorePolicy != StoreWriteBehind || len(ks) == 0 || s.ctx.Err() != nil {
		return
	}
	for _, m := range s.tiers {
		for _, k := range ks {
			it := item{key: k, lay: lay, size: lay.Bytes}
			if m.st.qbytes.Add(it.size) > s.opts.QueueBytes {
				m.st.qbytes.Add(-it.size)
				m.st.dropped.Add(1)
				continue
			}
			select {
			case m.q <- it:
				m.st.queued.Add(1)
			default:
				m.st.qbytes.Add(-it.size)
				m.st.dropped.Add(1)
			}
		}
	}
}

// work writes m's queued objects until the Set stops. For a backend that
// streams from L1 on the writer's own thread (a PartsPutter: fs does its
// file writes there, resp its socket writes, most of a write's CPU), the
// writer runs on an OS thread of its own at a lower priority (see
// writerNice); the thread is never unlocked, so it ends with the goroutine
// instead of going back to the runtime's pool with its priority lowered.
// Backends that take whole values do their I/O on their own threads:
// lowering only the copy's priority measured a slower tier (a resp client's,
// before it streamed) and no faster request path, so their writers keep the
// process's priority.
func (s *Set) work(m *member) {
	if _, ok := m.b.(PartsPutter); ok {
		runtime.LockOSThread()
		lowerThreadPriority()
	}
	// spare is the last whole-value buffer (backends that take whole
	// values), reused while writes keep coming: a fresh 32 MiB buffer per
	// chunk is that much more zeroing or page faults, and garbage. The
	// writer lets it go whenever its queue is empty.
	var spare []byte
	for {
		var it item
		select {
		case <-s.ctx.Done():
			return
		case it = <-m.q:
		default:
			spare = nil
			select {
			case <-s.ctx.Done():
				return
			case it = <-m.q:
			}
		}
		spare = s.write(m, it, spare)
		m.st.queued.Add(-1)
		m.st.qbytes.Add(-it.size)
	}
}

// lowerThreadPriority raises the calling thread's nice value by writerNice
// (Linux: nice is per thread). Raising it needs no privilege; a failure
// leaves the thread as it was.
func lowerThreadPriority() {
	tid := unix.Gettid()
	cur, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	if err != nil {
		return
	}
	nice := 20 - cur // the raw system call answers 20 - nice
	_ = unix.Setpriority(unix.PRIO_PROCESS, tid, min(nice+writerNice, 19))
}

// write puts it to m. Nothing but the published object's bytes is ever
// written: the object is pinned (a read lock turned into a hold) while its
// bytes are read, so neither eviction nor a clear can free or reuse them;
// an object no longer published is skipped.
//
// spare is a value buffer the writer may reuse; write returns the one to
// keep for the next.
func (s *Set) write(m *member, it item, spare []byte) []byte {
	name := Key(it.key, it.lay)
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.WriteTimeout)
	defer cancel()
	m.writing(name, it.key)
	defer m.written(name)
	spare, err := s.put(ctx, m, it, name, spare)
	switch {
	case err == nil:
		m.st.written.Add(1)
	case errors.Is(err, errGone) || errors.Is(err, ErrSourceChanged):
		m.st.skipped.Add(1)
	default:
		m.st.failed.Add(1)
		s.log.Debug("tier write failed", "key", it.key, "err", err)
	}
	return spare
}

// put pins it in L1 and stores it to m under name: straight from its L1
// bytes, holding the pin for the write, when the backend takes a value in
// parts; else through a copy, the pin released before the tier write.
func (s *Set) put(ctx context.Context, m *member, it item, name string, spare []byte) ([]byte, error) {
	one := []keys.ObjectKey{it.key}
	if s.pool.PinRead(one, 1) != 1 {
		return spare, errGone
	}
	ref, ok := s.pool.HoldRead(it.key)
	if !ok {
		s.pool.FinishRead(one, 1)
		return spare, errGone
	}
	held := true
	unpin := func() {
		if held {
			held = false
			s.pool.ReleaseRead([]l1.ReadRef{ref})
		}
	}
	defer unpin()
	if ref.Length != it.size {
		return spare, errGone
	}
	if s.beforeCopy != nil {
		s.beforeCopy(it.key)
	}
	src, unview := s.pool.View(ref.Offset, ref.Length)
	defer unview()
	if src == nil {
		return spare, errGone
	}
	if pp, ok := m.b.(PartsPutter); ok {
		pace := func() { s.yieldToRequests(ctx) }
		head, err := newHeader(name, it.lay, src, pace)
		if err != nil {
			return spare, err
		}
		// The hold bounds nothing in time by itself (its read TTL can end
		// it while the write runs): the backend asks before it publishes.
		return spare, pp.PutParts(ctx, name, head, src, func() bool { return s.pool.Held(ref) }, pace)
	}
	v, dst, err := newValue(name, it.lay, len(src), spare)
	if err != nil {
		return spare, err
	}
	// The checksum is taken slice by slice right after each copy, while
	// the slice is still in the CPU's cache (one pass over the payload).
	h := len(v) - len(dst)
	sum := HeadSum(v[:h])
	for off := 0; off < len(src); off += yieldSlice {
		s.yieldToRequests(ctx)
		end := min(off+yieldSlice, len(src))
		copy(dst[off:end], src[off:end])
		sum = PayloadSum(sum, dst[off:end])
		runtime.Gosched()
	}
	unview()
	unpin() // the copy is ours: L1 may evict the object while the tier writes
	sealSum(v, h, sum)
	if err := m.b.Put(ctx, name, v); err != nil {
		return v, fmt.Errorf("put %d bytes: %w", len(v), err)
	}
	return v, nil
}

// A write-behind writer yields to the request path: before each piece
// (yieldSlice or the backend's write piece) it waits until no request has
// come for requestQuiet and no lookup is in its tier phase, but never
// longer than requestYieldMax, so writes still progress (at least a piece
// per requestYieldMax per writer) under a constant stream of requests.
// Without it, the writers' copies, checksums and file writes took the CPU
// from the requests (kvdock bench's saturated round trips,
// docs/BENCHMARKS.md). A tier then falls behind sooner under load, and
// drops (and counts) more writes.
//
// A lookup waiting on a tier (a resp EXISTS, a load) sends no message
// meanwhile: after requestQuiet the request path would look idle, and a
// write piece sent then queued ahead of the lookup's own call at the
// server. So a lookup in its tier phase counts as a request under way.
const (
	requestQuiet    = 300 * time.Microsecond
	requestYieldMax = 10 * time.Millisecond
	// tierPhasePoll is how often a yielding writer looks again while a
	// lookup is in its tier phase.
	tierPhasePoll = 100 * time.Microsecond
)

// yieldToRequests waits, as above, for a quiet moment on the request path;
// it returns at once without Options.LastRequest, and when ctx ends.
func (s *Set) yieldToRequests(ctx context.Context) {
	if s.opts.LastRequest == nil {
		return
	}
	deadline := time.Now().Add(requestYieldMax)
	for {
		quietFor := time.Since(s.opts.LastRequest())
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return
		}
		switch {
		case len(s.jobs) > 0:
			time.Sleep(min(tierPhasePoll, left))
		case quietFor < requestQuiet:
			time.Sleep(min(requestQuiet-quietFor, left))
		default:
			return
		}
	}
}
