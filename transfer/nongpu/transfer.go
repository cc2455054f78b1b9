package nongpu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/layout"
	"kvdock/core/protocol"
	"kvdock/core/workers"
	"kvdock/transfer/torchpickle"
)

// emptyShm is the SHM answer when nothing was reserved: the worker reads
// empty slots as "all cached" and skips its commit.
func emptyShm() protocol.PrepareStoreResponse {
	return protocol.PrepareStoreResponse{Shm: true, Slots: []protocol.Slot{}, ChunkIndices: []int{}}
}

// PrepareStore handles PREPARE_STORE (spec 4.6). SHM: reserve the keys not
// cached yet and hand out their slots, keeping the reservation pending until
// COMMIT_STORE. PICKLE: an empty context; nothing is touched.
func (m *Module) PrepareStore(k protocol.Key, id int64) (protocol.PrepareStoreResponse, error) {
	inst, err := m.lookupInstance(id)
	if err != nil {
		return protocol.PrepareStoreResponse{}, fmt.Errorf("prepare store: %w", err)
	}
	m.maybeSweep()
	if m.modeOf(inst) == workers.ModePickle {
		return protocol.PrepareStoreResponse{}, nil
	}
	ks, pk, err := m.resolve(inst, k)
	if err != nil {
		return protocol.PrepareStoreResponse{}, fmt.Errorf("prepare store for instance %d: %w", id, err)
	}
	// A repeated prepare for the same transfer releases the first reservation
	// before reserving again (upstream overwrote it and leaked the locks).
	m.abortPendingWrite(pk)

	created := m.now()
	res, err := m.pool.ReserveWrite(l1.InstanceOwner(id), ks, inst.lay.Bytes)
	if errors.Is(err, l1.ErrNoSpace) || errors.Is(err, l1.ErrLockCap) {
		m.noSpace(inst, len(ks), err)
		return emptyShm(), nil
	}
	if err != nil {
		return protocol.PrepareStoreResponse{}, fmt.Errorf("prepare store for instance %d: reserve %d chunks: %w", id, len(ks), err)
	}
	if len(res) == 0 {
		return emptyShm(), nil
	}
	resp := protocol.PrepareStoreResponse{Shm: true, Slots: make([]protocol.Slot, len(res)), ChunkIndices: make([]int, len(res))}
	for i, r := range res {
		resp.Slots[i] = protocol.Slot{Offset: r.Offset, Length: r.Length, Shape: inst.lay.Shape, Dtype: inst.lay.Dtype}
		resp.ChunkIndices[i] = r.Index
	}

	m.mu.Lock()
	if m.closed || m.instances[id] != inst {
		m.mu.Unlock()
		m.pool.AbortWrite(res)
		return protocol.PrepareStoreResponse{}, fmt.Errorf("prepare store: instance %d unregistered meanwhile", id)
	}
	prev := m.writes[pk]
	m.writes[pk] = &pending{inst: inst, res: res, bytes: int64(len(res)) * inst.lay.Bytes, created: created}
	m.mu.Unlock()
	if prev != nil {
		m.pool.AbortWrite(prev.res)
	}
	return resp, nil
}

// CommitStore handles COMMIT_STORE (spec 4.6). Empty data publishes the
// pending SHM reservation (false when there is none, or when the pool no
// longer holds all of it: a clear or its TTL overtook it, and nothing of it
// is published); for an instance in PICKLE mode that proves SHM works, and it
// is switched back. Non-empty data is a pickled tensor list, stored by copy.
// An SHM instance sending it has fallen back to pickle and is switched to
// PICKLE so its retrieves get data, but only once the key resolved for that
// instance and the pickle decoded to one tensor per chunk, each matching its
// layout: a commit that fails either check changes nothing (mode, pending
// reservations, counters); it is an error (no reply) when the key or the
// pickle is invalid, false otherwise.
func (m *Module) CommitStore(k protocol.Key, id int64, data []byte) (bool, error) {
	inst, err := m.lookupInstance(id)
	if err != nil {
		return false, fmt.Errorf("commit store: %w", err)
	}
	m.maybeSweep()
	if len(data) == 0 {
		_, pk, err := m.keyRequest(inst, k)
		if err != nil {
			return false, fmt.Errorf("commit store for instance %d: %w", id, err)
		}
		p := m.takePending(m.writes, pk)
		if p == nil {
			if m.modeOf(inst) == workers.ModePickle {
				// Upstream's pickle strategy fails to unpickle b"" and sends no reply.
				return false, fmt.Errorf("commit store for instance %d: empty data in pickle mode and nothing pending", id)
			}
			return false, nil
		}
		if m.expireIfDue(p, true) {
			return false, nil
		}
		if !m.pool.FinishWrite(p.res) {
			m.mu.Lock()
			inst.storeFailures++
			m.mu.Unlock()
			return false, nil
		}
		m.mu.Lock()
		inst.stores++
		inst.bytesIn += p.bytes
		m.mu.Unlock()
		m.notePublished(p.res, inst.lay)
		m.noteSHMWorks(inst)
		return true, nil
	}

	ks, pk, err := m.resolve(inst, k)
	if err != nil {
		return false, fmt.Errorf("commit store for instance %d: %w", id, err)
	}
	ts, err := torchpickle.Decode(data, torchpickle.Limits{})
	if err != nil {
		return false, fmt.Errorf("commit store for instance %d: decode pickled chunks: %w", id, err)
	}
	if m.modeOf(inst) == workers.ModeSHM {
		if why := provesPickle(ts, len(ks), inst.lay); why != "" {
			// Not the commit of a worker that fell back (or someone else's
			// bytes under this instance id): store nothing, keep the mode and
			// the instance's pending SHM write. False, as upstream answers a
			// commit that did not store everything.
			m.errorEvent("COMMIT_STORE/unproven", id, fmt.Sprintf(
				"instance %d (SHM) sent pickled chunks that do not match it (%s): nothing stored, mode unchanged", id, why))
			return false, nil
		}
		m.noteFallback(inst)
		// An SHM prepare before this pickle commit reserved the same objects:
		// release them so the pickled data can be stored.
		m.abortPendingWrite(pk)
	}
	ok, err := m.commitPickle(inst, ks, ts)
	if err != nil {
		return false, fmt.Errorf("commit store for instance %d: %w", id, err)
	}
	return ok, nil
}

// provesPickle says why a decoded pickle commit does not prove that an SHM
// instance's worker fell back to pickle ("" when it does): it must carry one
// tensor per chunk of the key, each of the instance's registered layout.
func provesPickle(ts []torchpickle.Tensor, chunks int, lay layout.Layout) string {
	if chunks == 0 {
		return "the key covers no chunk"
	}
	if len(ts) != chunks {
		return fmt.Sprintf("%d tensors for %d chunks", len(ts), chunks)
	}
	for i, t := range ts {
		if !matches(t, lay) {
			return fmt.Sprintf("chunk %d is %v %s (%d bytes), registered layout is %s (%d bytes)",
				i, t.Shape, t.Dtype, len(t.Data), lay, lay.Bytes)
		}
	}
	return ""
}

// noteFallback switches an SHM instance whose pickle commit proved the
// fallback to PICKLE.
func (m *Module) noteFallback(inst *instance) {
	m.mu.Lock()
	if inst.mode != workers.ModeSHM {
		m.mu.Unlock()
		return
	}
	inst.mode = workers.ModePickle
	inst.reason = "worker fell back: could not attach " + m.info.ShmName
	m.stats.Fallbacks++
	reason := inst.reason
	m.mu.Unlock()
	m.event(workers.EventFallback, slog.LevelWarn, inst.id, fmt.Sprintf("instance %d (%s): %s; using pickle", inst.id, inst.p.ModelName, reason))
}

// noteSHMWorks switches an instance in PICKLE mode back to SHM: it just
// committed an SHM reservation made before it was switched, so its worker
// writes into the segment after all.
func (m *Module) noteSHMWorks(inst *instance) {
	m.mu.Lock()
	if inst.mode != workers.ModePickle || !m.info.Shared() {
		m.mu.Unlock()
		return
	}
	inst.mode = workers.ModeSHM
	inst.reason = "worker committed an SHM write: back to shared segment " + m.info.ShmName
	reason := inst.reason
	m.mu.Unlock()
	m.event(workers.EventSHMBack, slog.LevelInfo, inst.id, fmt.Sprintf("instance %d (%s): %s", inst.id, inst.p.ModelName, reason))
}

func matches(t torchpickle.Tensor, lay layout.Layout) bool {
	if t.Dtype != lay.Dtype || len(t.Shape) != len(lay.Shape) || int64(len(t.Data)) != lay.Bytes {
		return false
	}
	for i, d := range lay.Shape {
		if t.Shape[i] != d {
			return false
		}
	}
	return true
}

// commitPickle stores the decoded chunks: tensor i goes to key i when key i is
// not cached yet. The answer is upstream's written == reserved, except that a
// tensor not matching the registered layout is never stored and makes it false.
func (m *Module) commitPickle(inst *instance, ks []keys.ObjectKey, ts []torchpickle.Tensor) (bool, error) {
	valid := make([]bool, len(ks))
	rejected := 0
	for i := range ks {
		if i >= len(ts) {
			continue
		}
		if matches(ts[i], inst.lay) {
			valid[i] = true
			continue
		}
		rejected++
		if rejected == 1 {
			m.errorEvent("COMMIT_STORE/layout", inst.id, fmt.Sprintf(
				"instance %d sent chunk %d as %v %s (%d bytes); registered layout is %s (%d bytes): not stored",
				inst.id, i, ts[i].Shape, ts[i].Dtype, len(ts[i].Data), inst.lay, inst.lay.Bytes))
		}
	}

	res, err := m.pool.ReserveWrite(l1.InstanceOwner(inst.id), ks, inst.lay.Bytes)
	if errors.Is(err, l1.ErrNoSpace) || errors.Is(err, l1.ErrLockCap) {
		m.noSpace(inst, len(ks), err)
		res, err = nil, nil
	}
	if err != nil {
		m.mu.Lock()
		inst.storeFailures++
		m.mu.Unlock()
		return false, fmt.Errorf("reserve %d chunks: %w", len(ks), err)
	}
	var written, unwritten []l1.Reservation
	var bytesIn int64
	for _, r := range res {
		if !valid[r.Index] {
			unwritten = append(unwritten, r)
			continue
		}
		dst, release := m.pool.View(r.Offset, r.Length)
		if dst == nil { // the pool is closing
			release()
			unwritten = append(unwritten, r)
			continue
		}
		copy(dst, ts[r.Index].Data)
		release()
		written = append(written, r)
		bytesIn += r.Length
	}
	if len(unwritten) > 0 {
		m.pool.AbortWrite(unwritten)
	}
	if len(written) > 0 && !m.pool.FinishWrite(written) {
		written, bytesIn = nil, 0 // a clear overtook the batch: nothing published
	}
	m.notePublished(written, inst.lay)
	ok := len(written) == len(res) && rejected == 0
	m.mu.Lock()
	if rejected > 0 {
		m.stats.Rejected += int64(rejected)
	}
	if ok {
		inst.stores++
	} else {
		inst.storeFailures++
	}
	inst.bytesIn += bytesIn
	m.mu.Unlock()
	return ok, nil
}

// noSpace counts a reservation the pool refused (no space, or a lock cap)
// and tells the operator once per run of refusals, with the pool's reason
// (the wire answer stays upstream's "nothing reserved").
func (m *Module) noSpace(inst *instance, n int, err error) {
	m.mu.Lock()
	m.stats.NoSpace++
	inst.storeFailures++
	m.mu.Unlock()
	kind := "no_space" // a cap refusal is not hidden behind a no-space line of the same second
	if errors.Is(err, l1.ErrLockCap) {
		kind = "lock_cap"
	}
	m.rateLimited(kind, func() {
		m.event(workers.EventNoSpace, slog.LevelWarn, inst.id, fmt.Sprintf(
			"instance %d: store of %d chunks not cached: %v", inst.id, n, err))
	})
}

// locateAll holds every key's read lock and finds its slot. The keys must be
// read-locked (by LOOKUP); all held ones are returned so a partial hit can
// release them.
func (m *Module) locateAll(ks []keys.ObjectKey, lay layout.Layout) (slots []protocol.Slot, found []l1.ReadRef, ok bool) {
	slots = make([]protocol.Slot, 0, len(ks))
	ok = true
	for _, k := range ks {
		ref, hit := m.pool.HoldRead(k)
		if !hit {
			ok = false
			continue
		}
		found = append(found, ref)
		if ref.Length != lay.Bytes {
			// Stored under another layout: unusable for this worker.
			ok = false
			continue
		}
		slots = append(slots, protocol.Slot{Offset: ref.Offset, Length: ref.Length, Shape: lay.Shape, Dtype: lay.Dtype})
	}
	return slots, found, ok
}

// pickleStoreBytes is what a pickle PREPARE_STORE of k may bring in its
// commit: one chunk of the instance's layout per chunk of the key's range
// (false: not a pickle instance, nothing to gate).
func (m *Module) pickleStoreBytes(k protocol.Key, id int64) (int64, bool) {
	inst, err := m.lookupInstance(id)
	if err != nil || m.modeOf(inst) != workers.ModePickle {
		return 0, false
	}
	chunks := int64(1)
	if n := int64(k.End - k.Start); n > 0 {
		chunks = (n + int64(m.chunkSize) - 1) / int64(m.chunkSize)
	}
	return chunks * inst.lay.Bytes, true
}

// PrepareRetrieve handles PREPARE_RETRIEVE (spec 4.7). Every key must be
// read-locked by a preceding LOOKUP, else the answer is a miss and the found
// keys' locks are released. SHM answers slots and keeps the locks until
// COMMIT_RETRIEVE; PICKLE answers the pickled chunks and releases at once.
func (m *Module) PrepareRetrieve(k protocol.Key, id int64) (protocol.PrepareRetrieveResponse, error) {
	var data []byte
	r, err := m.prepareRetrieve(k, id, func(ts []torchpickle.Tensor) error {
		var buf []byte
		if size := torchpickle.EncodedSize(ts); size > 0 {
			buf = make([]byte, 0, size)
		}
		var err error
		data, err = torchpickle.AppendEncode(buf, ts)
		return err
	})
	if err == nil && r.Success && r.Slots == nil {
		r.Data = data
	}
	return r, err
}

// prepareRetrieveReply is PrepareRetrieve as the request handler answers it:
// a pickle reply is encoded once, into an exactly sized buffer from alloc
// (the wire server's reply buffer, outside the Go heap: msgpack header, the
// pickle straight after it), and sent by the server without another copy;
// SHM and misses answer the response.
func (m *Module) prepareRetrieveReply(k protocol.Key, id int64, alloc func(n int) ([]byte, error)) (any, error) {
	var out protocol.Raw
	r, err := m.prepareRetrieve(k, id, func(ts []torchpickle.Tensor) error {
		n := torchpickle.EncodedSize(ts)
		if n < 0 {
			_, err := torchpickle.AppendEncode(nil, ts) // for its error
			return err
		}
		buf, err := alloc(protocol.PickleReplySize(n))
		if err != nil {
			return fmt.Errorf("reply buffer: %w", err)
		}
		b, err := protocol.AppendPickleRetrieveReply(buf, n,
			func(dst []byte) ([]byte, error) { return torchpickle.AppendEncode(dst, ts) })
		out = b
		return err
	})
	if err != nil {
		return nil, err
	}
	if out != nil {
		return out, nil
	}
	return r, nil
}

// prepareRetrieve does the work of PREPARE_RETRIEVE; for a pickle instance it
// calls encode with tensors that view the pool, under the read locks, and
// answers Success with neither Data nor Slots.
func (m *Module) prepareRetrieve(k protocol.Key, id int64, encode func([]torchpickle.Tensor) error) (protocol.PrepareRetrieveResponse, error) {
	inst, err := m.lookupInstance(id)
	if err != nil {
		return protocol.PrepareRetrieveResponse{}, fmt.Errorf("prepare retrieve: %w", err)
	}
	m.maybeSweep()
	ks, pk, err := m.resolve(inst, k)
	if err != nil {
		return protocol.PrepareRetrieveResponse{}, fmt.Errorf("prepare retrieve for instance %d: %w", id, err)
	}
	created := m.now()
	// A repeated prepare of the same transfer gives the first one's holds
	// back, so that this one can hold the same locks again.
	if prev := m.takePending(m.reads, pk); prev != nil {
		m.pool.ReturnRead(prev.refs)
	}
	slots, found, ok := m.locateAll(ks, inst.lay)
	if !ok {
		if len(found) > 0 {
			m.pool.ReleaseRead(found)
		}
		m.mu.Lock()
		inst.retrieves++
		m.mu.Unlock()
		return protocol.PrepareRetrieveResponse{Success: false}, nil
	}
	total := int64(len(ks)) * inst.lay.Bytes

	if m.modeOf(inst) == workers.ModeSHM {
		m.mu.Lock()
		if m.closed || m.instances[id] != inst {
			m.mu.Unlock()
			m.pool.ReleaseRead(found)
			return protocol.PrepareRetrieveResponse{}, fmt.Errorf("prepare retrieve: instance %d unregistered meanwhile", id)
		}
		prev := m.reads[pk]
		m.reads[pk] = &pending{inst: inst, refs: found, bytes: total, created: created}
		inst.retrieves++
		inst.hitChunks += int64(len(ks))
		inst.bytesOut += total
		m.mu.Unlock()
		if prev != nil {
			// A concurrent prepare of the same transfer: its holds are not
			// coming back.
			m.pool.ReleaseRead(prev.refs)
		}
		return protocol.PrepareRetrieveResponse{Success: true, Slots: slots}, nil
	}

	// The tensors view the pool directly: the read locks keep the objects in
	// place and the views keep the mapping until the one copy into the reply
	// buffer is done.
	ts := make([]torchpickle.Tensor, len(slots))
	releases := make([]func(), 0, len(slots))
	for i, s := range slots {
		b, release := m.pool.View(s.Offset, s.Length)
		releases = append(releases, release)
		if b == nil {
			err = errors.New("the pool is closing")
			break
		}
		ts[i] = torchpickle.Tensor{Dtype: s.Dtype, Shape: s.Shape, Data: b}
	}
	if err == nil {
		err = encode(ts)
	}
	for _, release := range releases {
		release()
	}
	m.pool.ReleaseRead(found)
	if err != nil {
		return protocol.PrepareRetrieveResponse{}, fmt.Errorf("prepare retrieve for instance %d: encode %d chunks: %w", id, len(ts), err)
	}
	m.mu.Lock()
	inst.retrieves++
	inst.hitChunks += int64(len(ks))
	inst.bytesOut += total
	m.mu.Unlock()
	return protocol.PrepareRetrieveResponse{Success: true}, nil
}

// CommitRetrieve handles COMMIT_RETRIEVE: the pending SHM read (if any)
// releases one lock per key. Always true.
func (m *Module) CommitRetrieve(k protocol.Key, id int64) (bool, error) {
	inst, err := m.lookupInstance(id)
	if err != nil {
		return false, fmt.Errorf("commit retrieve: %w", err)
	}
	m.maybeSweep()
	_, pk, err := m.keyRequest(inst, k)
	if err != nil {
		return false, fmt.Errorf("commit retrieve for instance %d: %w", id, err)
	}
	if p := m.takePending(m.reads, pk); p != nil && !m.expireIfDue(p, false) {
		m.pool.ReleaseRead(p.refs)
	}
	return true, nil
}

// takePending removes and returns one entry of the given pending map.
func (m *Module) takePending(table map[pendingKey]*pending, pk pendingKey) *pending {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := table[pk]
	if p != nil {
		delete(table, pk)
	}
	return p
}

func (m *Module) abortPendingWrite(pk pendingKey) {
	if p := m.takePending(m.writes, pk); p != nil && !m.expireIfDue(p, true) {
		m.pool.AbortWrite(p.res)
	}
}

// ttlOf is the pool's lock TTL for a pending write or read; m.mu is held.
func (m *Module) ttlOf(write bool) time.Duration {
	if write {
		return m.writeTTL
	}
	return m.readTTL
}

// expireIfDue handles an entry already removed from its map: when it is past
// its life it is expired (and reported true); otherwise the caller uses it.
// Pending entries live for half the pool's lock TTL: a worker that has not
// committed by then is gone.
func (m *Module) expireIfDue(p *pending, write bool) bool {
	now := m.now()
	m.mu.Lock()
	ttl := m.ttlOf(write)
	due := now.Sub(p.created) >= ttl/2
	if due {
		m.stats.Expired++
	}
	m.mu.Unlock()
	if !due {
		return false
	}
	m.expire(p, write, now)
	return true
}

// expire aborts or releases an entry past its life (stale locks are ignored
// by the pool) and tells the operator.
func (m *Module) expire(p *pending, write bool, now time.Time) {
	if write {
		m.pool.AbortWrite(p.res)
	} else {
		m.pool.ReleaseRead(p.refs)
	}
	what := "read"
	if write {
		what = "write"
	}
	m.rateLimited("expired", func() {
		m.event(workers.EventExpired, slog.LevelWarn, p.inst.id, fmt.Sprintf(
			"instance %d: pending %s of %d chunks expired after %s without a commit", p.inst.id, what, p.chunks(), now.Sub(p.created).Round(time.Second)))
	})
}

// maybeSweep expires old pending entries, at most once a second.
func (m *Module) maybeSweep() {
	now := m.now()
	m.mu.Lock()
	if now.Sub(m.lastSweep) < time.Second {
		m.mu.Unlock()
		return
	}
	m.mu.Unlock()
	m.Sweep()
}

// Sweep expires the pending writes and reads older than half their TTL. The
// handlers call it at most once a second; Run calls it on a ticker so that
// idle workers' entries go too.
func (m *Module) Sweep() {
	now := m.now()
	m.mu.Lock()
	m.lastSweep = now
	wttl, rttl := m.writeTTL, m.readTTL
	var writes, reads []*pending
	for k, p := range m.writes {
		if now.Sub(p.created) >= wttl/2 {
			writes = append(writes, p)
			delete(m.writes, k)
		}
	}
	for k, p := range m.reads {
		if now.Sub(p.created) >= rttl/2 {
			reads = append(reads, p)
			delete(m.reads, k)
		}
	}
	m.stats.Expired += int64(len(writes) + len(reads))
	m.mu.Unlock()
	for _, p := range writes {
		m.expire(p, true, now)
	}
	for _, p := range reads {
		m.expire(p, false, now)
	}
}

// Run sweeps expired pending entries every second until ctx is done.
func (m *Module) Run(ctx context.Context) {
	t := time.NewTicker(time.Second)
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

// rateLimited runs report at most once a second per kind.
func (m *Module) rateLimited(kind string, report func()) {
	now := m.now()
	m.mu.Lock()
	last, seen := m.errLast[kind]
	if seen && now.Sub(last) < time.Second {
		m.mu.Unlock()
		return
	}
	m.errLast[kind] = now
	m.mu.Unlock()
	report()
}

// errorEvent reports a request error to the operator, rate-limited per kind.
func (m *Module) errorEvent(kind string, id int64, msg string) {
	m.rateLimited(kind, func() { m.event(workers.EventError, slog.LevelError, id, msg) })
}

// notePublished hands the keys of published reservations to Deps.Published.
func (m *Module) notePublished(rs []l1.Reservation, lay layout.Layout) {
	if m.published == nil || len(rs) == 0 {
		return
	}
	ks := make([]keys.ObjectKey, len(rs))
	for i, r := range rs {
		ks[i] = r.Key
	}
	m.published(ks, lay)
}
