package tier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/layout"
)

// layoutGroup names one KV group of one layout (keys.ObjectKey.Layout and
// Group): a model registered with several layouts has a group 0 in each.
type layoutGroup struct {
	id    uint64
	group uint32
}

// Prefetch is a lookup's tier phase. ks are the keys of the chunks after the
// lookup's L1 prefix, chunk-major and rank-minor, per keys a chunk, of
// (model, worldSize). It asks the tiers, in order, for the leading chunks
// they hold, loads those into L1 (verified against the header, bounded by
// MaxInFlight loads at once) and read-locks each loaded chunk count times,
// as a lookup hit is locked. It returns how many leading chunks are loaded
// and locked; the locks of chunks loaded after the first failure are
// released again. It returns within LoadTimeout whatever the tiers do (a
// load still running then is abandoned: its result is undone when it ends).
// ctx may end it earlier.
func (s *Set) Prefetch(ctx context.Context, model string, worldSize int, ks []keys.ObjectKey, per, count int) int {
	if len(s.tiers) == 0 || per <= 0 || len(ks) < per || count <= 0 {
		return 0
	}
	// Each key is named and verified under its own group's layout (of the
	// layouts its key names).
	lays := make(map[layoutGroup]layout.Layout, 1)
	for _, k := range ks[:min(len(ks), MaxPrefetchKeys)] {
		lg := layoutGroup{k.Layout, k.Group}
		if _, seen := lays[lg]; seen {
			continue
		}
		lay, ok := s.layouts.LayoutOf(model, worldSize, k.Layout, k.Group)
		if !ok {
			return 0
		}
		lays[lg] = lay
	}
	select {
	case s.jobs <- struct{}{}:
	default:
		return 0 // too many lookups in their tier phase: L1 hits only
	}
	defer func() { <-s.jobs }()
	if !s.enter() {
		return 0
	}
	defer s.wg.Done()
	ctx, cancel := context.WithTimeout(ctx, s.opts.LoadTimeout)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()

	ks = ks[:min(len(ks), MaxPrefetchKeys)/per*per]
	names := make([]string, len(ks))
	for i, k := range ks {
		names[i] = Key(k, lays[layoutGroup{k.Layout, k.Group}])
	}
	owner := s.find(ctx, names, per)
	chunks := len(owner)
	if chunks == 0 {
		return 0
	}
	j := &loadJob{ok: make([]bool, chunks), todo: chunks, done: make(chan struct{})}
	// One load slot per chunk in flight, taken before its goroutine starts:
	// goroutines, like loads, stay within MaxInFlight over all lookups.
launch:
	for c := range chunks {
		m := s.tiers[owner[c]]
		select {
		case s.inflight <- struct{}{}:
		case <-ctx.Done():
			m.st.timeouts.Add(1)
			for rest := c; rest < chunks; rest++ {
				j.finish(rest, false, nil, 0, s.pool)
			}
			break launch
		}
		if !s.enter() {
			<-s.inflight
			j.finish(c, false, nil, 0, s.pool)
			continue
		}
		go func() {
			defer s.wg.Done()
			defer func() { <-s.inflight }()
			ck := ks[c*per : (c+1)*per]
			ok := s.loadChunk(ctx, m, ck, names[c*per:(c+1)*per], lays, count)
			j.finish(c, ok, ck, count, s.pool)
		}()
	}
	select {
	case <-j.done:
	case <-ctx.Done():
	}
	return j.settle(ks, per, count, s.pool)
}

// AbsenceKnower is implemented by backends that can tell from memory alone
// that they do not hold key (the fs index; resp's recent absent answers).
// false means "may hold it": the backend is then asked.
type AbsenceKnower interface {
	KnownAbsent(key string) bool
}

// KnownAbsent tells, without asking any tier, that Prefetch of ks would find
// nothing: every tier knows from memory that it lacks the first chunk's first
// key (or no layout is registered for the group).
func (s *Set) KnownAbsent(model string, worldSize int, ks []keys.ObjectKey, per int) bool {
	if len(s.tiers) == 0 || per <= 0 || len(ks) < per {
		return true
	}
	// The first key's KV group (a hybrid model's chunk is absent when any
	// group of it is), under that group's layout.
	lay, ok := s.layouts.LayoutOf(model, worldSize, ks[0].Layout, ks[0].Group)
	if !ok {
		return true
	}
	name := Key(ks[0], lay)
	for _, m := range s.tiers {
		if k, ok := m.b.(AbsenceKnower); !ok || !k.KnownAbsent(name) {
			return false
		}
	}
	// Every tier was asked (from memory) and lacks the chunk.
	for _, m := range s.tiers {
		m.st.misses.Add(1)
	}
	return true
}

// find returns, for each leading chunk present in some tier, the index of
// the tier that holds all its keys: each tier in order continues where the
// ones before stopped, until none has the next chunk. A tier is asked about
// a chunk once: its lack of it counts as one miss of that tier.
func (s *Set) find(ctx context.Context, names []string, per int) []int {
	var owner []int
	pos := 0
	// lacked[i] is the position tier i last said it lacks (or failed at).
	lacked := make([]int, len(s.tiers))
	for i := range lacked {
		lacked[i] = -1
	}
	for advanced := true; advanced && pos < len(names); {
		advanced = false
		for i, m := range s.tiers {
			if ctx.Err() != nil || pos >= len(names) {
				return owner
			}
			if lacked[i] == pos {
				continue
			}
			n, err := m.b.Has(ctx, names[pos:])
			if err != nil {
				if ctx.Err() == nil {
					// Asked and not answered (a tier down fails at once):
					// the chunk was not found there.
					m.st.misses.Add(1)
				}
				lacked[i] = pos
				s.log.Debug("tier lookup failed", "tier", i, "err", err)
				continue
			}
			full := min(max(n, 0), len(names)-pos) / per
			if full*per < len(names)-pos {
				m.st.misses.Add(1)
				lacked[i] = pos + full*per
			}
			for range full {
				owner = append(owner, i)
			}
			if full > 0 {
				pos += full * per
				advanced = true
			}
		}
	}
	return owner
}

// loadJob collects the chunk loads of one Prefetch. Once settled, a load
// that ends later undoes its own locks.
type loadJob struct {
	mu      sync.Mutex
	ok      []bool
	todo    int
	settled bool
	done    chan struct{}
}

func (j *loadJob) finish(c int, ok bool, ck []keys.ObjectKey, count int, pool Pool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.settled {
		if ok {
			pool.FinishRead(ck, count) // nobody will be told of this chunk
		}
		return
	}
	j.ok[c] = ok
	j.todo--
	if j.todo == 0 {
		close(j.done)
	}
}

// settle fixes the answer: the leading loaded chunks; later loaded ones are
// unlocked (they stay in L1 as ordinary objects).
func (j *loadJob) settle(ks []keys.ObjectKey, per, count int, pool Pool) int {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.settled = true
	hit := 0
	for hit < len(j.ok) && j.ok[hit] {
		hit++
	}
	for c := hit + 1; c < len(j.ok); c++ {
		if j.ok[c] {
			pool.FinishRead(ks[c*per:(c+1)*per], count)
		}
	}
	return hit
}

// loadChunk loads every key of one chunk from m into L1 and read-locks
// them count times; false, with nothing left locked, on any failure.
func (s *Set) loadChunk(ctx context.Context, m *member, ck []keys.ObjectKey, names []string, lays map[layoutGroup]layout.Layout, count int) bool {
	for i, k := range ck {
		if !s.loadKey(ctx, m, k, names[i], lays[layoutGroup{k.Layout, k.Group}]) {
			return false
		}
	}
	if ctx.Err() != nil {
		return false
	}
	n := s.pool.ReserveReadPrefix(ck, count)
	if n < len(ck) {
		s.pool.FinishRead(ck[:n], count)
		return false
	}
	return true
}

// ReaderInto is implemented by backends that can read a value into memory
// the caller provides: the prefetcher then reads a chunk's payload straight
// into its reserved L1 slot, verifies it there and only then publishes it
// (one pass over the bytes instead of a read into a buffer and a copy).
type ReaderInto interface {
	// GetInto reads the value under key into head, then payload, when it
	// is exactly len(head)+len(payload) bytes long, calling each (when
	// not nil) with every piece of payload as soon as it is read, in
	// order: the caller checksums the bytes while they are still in the
	// CPU's cache. It returns an error wrapping ErrNotFound when key is
	// absent, ErrSizeMismatch (with nothing read) when the value has
	// another length. On any error the contents of head and payload are
	// undefined.
	GetInto(ctx context.Context, key string, head, payload []byte, each func(piece []byte)) error
}

// ErrSizeMismatch is wrapped by ReaderInto.GetInto for a value whose length
// is not the one asked for.
var ErrSizeMismatch = errors.New("tier: value has another length")

// HeadReader is implemented by backends that can read the start of a value
// without the rest: a value of another length than our layout's is then
// classified (another layout's, or damage) from its header alone.
type HeadReader interface {
	// GetHead reads the first len(buf) bytes of the value under key into
	// buf (all of it when it is shorter) and returns how many, with the
	// value's full length. Errors are Get's.
	GetHead(ctx context.Context, key string, buf []byte) (n int, size int64, err error)
}

// mismatched is the error of a value under name whose length is not our
// layout's (err, ErrSizeMismatch's): ErrCorrupt, and also ErrForeign when
// its header, read alone (HeadReader), is an intact header of another
// layout under name whose payload length accounts for the value's length.
// Its checksum is not checked (that would mean reading a value of any
// length): a damaged payload behind such a header stays until our next
// write of the chunk replaces it, served never.
func (s *Set) mismatched(ctx context.Context, m *member, name string, lay layout.Layout, err error) error {
	err = fmt.Errorf("%w: %w", ErrCorrupt, err)
	hr, ok := m.b.(HeadReader)
	if !ok {
		return err
	}
	// The longest header a value stored under name can have.
	buf := make([]byte, fixedBytes+len(name)+8*maxDims+maxDtype)
	n, size, herr := hr.GetHead(ctx, name, buf)
	if herr != nil {
		return err
	}
	if key, herr := StoredKey(buf[:n], size); herr != nil || string(key) != name {
		return err
	}
	// Our own header up to the payload length: a value that has it is
	// ours, damaged.
	ours := appendHeader(nil, name, lay, 0)
	if bytes.HasPrefix(buf[:n], ours[:len(ours)-8]) {
		return err
	}
	return fmt.Errorf("%w: %w: a header of another layout, %d bytes", ErrCorrupt, ErrForeign, size)
}

// loadKey puts the value of k into L1 unless it is there already.
func (s *Set) loadKey(ctx context.Context, m *member, k keys.ObjectKey, name string, lay layout.Layout) bool {
	if ri, ok := m.b.(ReaderInto); ok {
		return s.loadInto(ctx, m, ri, k, name, lay)
	}
	v, err := m.b.Get(ctx, name)
	if !s.fetched(ctx, m, k, err) {
		return false
	}
	payload, err := Verify(v, name, lay)
	if err != nil {
		s.rejected(m, k, name, err)
		return false
	}
	m.st.hits.Add(1)
	res, dst, release, present := s.reserve(ctx, m, k, lay, int64(len(payload)))
	if dst == nil {
		return present
	}
	copy(dst, payload)
	release()
	if !s.finishLoad(res) {
		return false
	}
	m.st.loads.Add(1)
	return true
}

// reserve write-locks an L1 slot of lay.Bytes for k and views it: dst,
// n bytes long, is the slot until unview is called, and the caller then
// finishes or aborts res. dst is nil when nothing is reserved: ctx has
// ended (counted as a timeout), L1 has no room or no view of n bytes, or
// k is in L1 already (stored meanwhile), which present says.
func (s *Set) reserve(ctx context.Context, m *member, k keys.ObjectKey, lay layout.Layout, n int64) (res []l1.Reservation, dst []byte, unview func(), present bool) {
	if ctx.Err() != nil {
		m.st.timeouts.Add(1)
		return nil, nil, nil, false
	}
	res, err := s.pool.ReserveLoad(s.opts.Owner, k, lay.Bytes)
	if err != nil {
		s.log.Debug("no L1 room for a tier load", "key", k, "err", err)
		return nil, nil, nil, false
	}
	if len(res) == 0 {
		return nil, nil, nil, true
	}
	dst, unview = s.pool.View(res[0].Offset, res[0].Length)
	if dst == nil || int64(len(dst)) != n {
		unview()
		s.pool.AbortWrite(res)
		return nil, nil, nil, false
	}
	return res, dst, unview, false
}

// fetched accounts for a failed tier read (a miss or a timeout) and
// returns false; true when err is nil.
func (s *Set) fetched(ctx context.Context, m *member, k keys.ObjectKey, err error) bool {
	switch {
	case err == nil:
		return true
	case errors.Is(err, ErrCorrupt):
		// The backend found the value damaged (and removed it).
		m.st.corrupt.Add(1)
		s.log.Warn("tier value rejected by the tier", "key", k, "err", err)
	case errors.Is(err, ErrNotFound):
		m.st.misses.Add(1)
	case ctx.Err() != nil:
		m.st.timeouts.Add(1)
	default:
		m.st.misses.Add(1)
		s.log.Debug("tier load failed", "key", k, "err", err)
	}
	return false
}

// rejected accounts for a value that failed its checks (err from Verify or
// VerifyParts) and deletes it where it is ours.
func (s *Set) rejected(m *member, k keys.ObjectKey, name string, err error) {
	m.st.corrupt.Add(1)
	// The name carries the format version and our layout's fingerprint: a
	// broken value there is ours to delete. An intact value of another key
	// or layout is a fingerprint collision's (or forged): deleting it would
	// have two hosts destroy each other's cache; our next write of the
	// chunk replaces it.
	if errors.Is(err, ErrForeign) {
		s.log.Warn("tier value rejected (kept: not ours)", "key", k, "err", err)
		return
	}
	s.log.Warn("tier value rejected and deleted", "key", k, "err", err)
	dctx, cancel := context.WithTimeout(s.ctx, s.opts.LoadTimeout)
	if derr := m.b.Delete(dctx, name); derr != nil {
		s.log.Debug("delete rejected tier value", "key", k, "err", derr)
	}
	cancel()
}

// loadInto loads k from ri straight into a reserved L1 slot: the slot is
// reserved first (write-locked: nobody reads it), the value's header and
// payload are read into a buffer and the slot, verified there, and only
// then published; any failure aborts the reservation, so nothing half
// read or unverified is ever visible. The reservation is given back only
// once GetInto has returned: a read into the slot never outlives it (ctx
// ending stops the read at its next piece). A value of another length
// than our layout's is never read (it may be any size): it is rejected as
// damage and deleted. Unlike Verify's foreign values it cannot be told
// from damage without reading it; a layout fingerprint collision between
// two hosts (1 in 2^32) then costs them each other's copy of a chunk,
// never wrong bytes.
func (s *Set) loadInto(ctx context.Context, m *member, ri ReaderInto, k keys.ObjectKey, name string, lay layout.Layout) bool {
	res, dst, unview, present := s.reserve(ctx, m, k, lay, lay.Bytes)
	if dst == nil {
		return present
	}
	head := make([]byte, headerLen(name, lay))
	// The checksum is taken piece by piece as the payload arrives (the
	// head is complete before its first piece), not in a second pass.
	// Only pieces that are dst's own next bytes count; anything else (a
	// backend that reports other memory, or skips) falls back to checking
	// the whole slot.
	var sum uint32
	var summed int64
	inOrder := true
	err := ri.GetInto(ctx, name, head, dst, func(piece []byte) {
		if !inOrder || len(piece) == 0 || summed+int64(len(piece)) > int64(len(dst)) || &piece[0] != &dst[summed] {
			inOrder = false
			return
		}
		if summed == 0 {
			sum = HeadSum(head)
		}
		sum = PayloadSum(sum, piece)
		summed += int64(len(piece))
	})
	if err == nil {
		if !inOrder || summed != int64(len(dst)) || len(dst) == 0 {
			err = VerifyParts(head, dst, name, lay)
		} else {
			err = VerifySummed(head, summed, sum, name, lay)
		}
		if err != nil {
			unview()
			s.pool.AbortWrite(res)
			s.rejected(m, k, name, err)
			return false
		}
	}
	unview()
	if err != nil {
		s.pool.AbortWrite(res)
		if errors.Is(err, ErrSizeMismatch) {
			s.rejected(m, k, name, s.mismatched(ctx, m, name, lay, err))
			return false
		}
		s.fetched(ctx, m, k, err)
		return false
	}
	m.st.hits.Add(1)
	if ctx.Err() != nil {
		s.pool.AbortWrite(res)
		m.st.timeouts.Add(1)
		return false
	}
	if !s.finishLoad(res) {
		return false
	}
	m.st.loads.Add(1)
	return true
}

// finishLoad publishes a loaded value in L1 and tells Options.Loaded.
func (s *Set) finishLoad(res []l1.Reservation) bool {
	if !s.pool.FinishWrite(res) {
		return false
	}
	if s.opts.Loaded != nil {
		ks := make([]keys.ObjectKey, len(res))
		for i, r := range res {
			ks[i] = r.Key
		}
		s.opts.Loaded(ks)
	}
	return true
}

var _ Pool = (*l1.Pool)(nil)
