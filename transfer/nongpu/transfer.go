package nongpu

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"kvdock/core/keys"
	"kvdock/core/kvevents"
	"kvdock/core/l1"
	"kvdock/core/layout"
	"kvdock/core/protocol"
	"kvdock/core/workers"
	"kvdock/transfer/torchpickle"
)

// emptyShm is the SHM answer when nothing was reserved: the worker reads
// empty slots as "all cached" and skips its commit.
func emptyShm(inst *instance) protocol.PrepareStoreResponse {
	r := protocol.PrepareStoreResponse{Shm: true, Slots: []protocol.Slot{}, ChunkIndices: []int{}}
	if len(inst.groups) > 1 {
		r.GroupIDs = []int{}
	}
	return r
}

// reserveGroups reserves the objects of ks not cached yet, in every KV group
// of inst (group-major), each of its group's size, and builds the SHM
// answer: a slot per reservation, its chunk index within its group, and for
// a hybrid model the group of each slot. All groups are reserved or none.
func (m *Module) reserveGroups(inst *instance, prev, ks []keys.ObjectKey) (protocol.PrepareStoreResponse, []l1.Reservation, error) {
	resp := protocol.PrepareStoreResponse{Shm: true, Slots: []protocol.Slot{}, ChunkIndices: []int{}}
	if len(inst.groups) > 1 {
		resp.GroupIDs = []int{}
	}
	var all []l1.Reservation
	for g, lay := range inst.groups {
		gks, gprev := ks, prev
		if g > 0 {
			gks, gprev = keys.InGroup(ks, uint32(g)), keys.InGroup(prev, uint32(g))
		}
		res, err := m.reserve(inst, gprev, gks, lay.Bytes)
		if err != nil {
			m.pool.AbortWrite(all)
			return protocol.PrepareStoreResponse{}, nil, err
		}
		for _, r := range res {
			resp.Slots = append(resp.Slots, protocol.Slot{Offset: r.Offset, Length: r.Length, Shape: lay.Shape, Dtype: lay.Dtype})
			resp.ChunkIndices = append(resp.ChunkIndices, r.Index)
			if resp.GroupIDs != nil {
				resp.GroupIDs = append(resp.GroupIDs, g)
			}
		}
		all = append(all, res...)
	}
	return resp, all, nil
}

func reservedBytes(rs []l1.Reservation) int64 {
	var n int64
	for _, r := range rs {
		n += r.Length
	}
	return n
}

// groupOf returns the layout of KV group g of inst.
func groupOf(inst *instance, g uint32) layout.Layout {
	if uint64(g) < uint64(len(inst.groups)) {
		return inst.groups[g]
	}
	return inst.lay
}

// PrepareStore handles PREPARE_STORE (spec 4.6). SHM: reserve the keys not
// cached yet and hand out their slots, keeping the reservation pending until
// COMMIT_STORE. PICKLE: an empty context; nothing is touched.
func (m *Module) PrepareStore(k protocol.Key, id int64) (protocol.PrepareStoreResponse, error) {
	return m.prepareStore(k, id, nil)
}

// prepareStore is PrepareStore for the ZMQ peer peer (nil: unknown), which
// alone may commit the reservation (see pending.peer).
func (m *Module) prepareStore(k protocol.Key, id int64, peer []byte) (protocol.PrepareStoreResponse, error) {
	inst, err := m.lookupInstance(id)
	if err != nil {
		return protocol.PrepareStoreResponse{}, fmt.Errorf("prepare store: %w", err)
	}
	m.maybeSweep()
	if m.modeOf(inst) == workers.ModePickle {
		return protocol.PrepareStoreResponse{}, nil
	}
	ks, prev, pk, err := m.resolveStore(inst, k)
	if err != nil {
		return protocol.PrepareStoreResponse{}, fmt.Errorf("prepare store for instance %d: %w", id, err)
	}
	// A prepare of a transfer already pending (the pending key ignores
	// request_id, as upstream's does) gets no slots: the first one's slots
	// may be being written, and the next COMMIT_STORE of the key publishes
	// them, so handing out others would let that commit publish slots still
	// being written. Upstream answers no slots here too (the keys are
	// write-locked), but loses the first reservation.
	if m.repeatedWrite(pk) {
		return emptyShm(inst), nil
	}

	created := m.now()
	resp, res, err := m.reserveGroups(inst, prev, ks)
	if errors.Is(err, l1.ErrNoSpace) || errors.Is(err, l1.ErrLockCap) {
		m.noSpace(inst, len(ks)*len(inst.groups), err)
		return emptyShm(inst), nil
	}
	if err != nil {
		return protocol.PrepareStoreResponse{}, fmt.Errorf("prepare store for instance %d: reserve %d chunks: %w", id, len(ks), err)
	}
	if len(res) == 0 {
		return emptyShm(inst), nil
	}

	m.mu.Lock()
	if m.closed || m.instances[id] != inst {
		m.mu.Unlock()
		m.pool.AbortWrite(res)
		return protocol.PrepareStoreResponse{}, fmt.Errorf("prepare store: instance %d went away meanwhile: %w", id, ErrNotRegistered)
	}
	if m.writes[pk] != nil {
		// A concurrent prepare of the same transfer won: as above.
		m.mu.Unlock()
		m.pool.AbortWrite(res)
		return emptyShm(inst), nil
	}
	p := &pending{inst: inst, peer: string(peer), res: res, bytes: reservedBytes(res), created: created, carry: m.carryKeyLocked(pk, k)}
	if m.committed != nil {
		p.chain = chainOf(prev, ks)
	}
	m.writes[pk] = p
	m.mu.Unlock()
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
	return m.commitStore(k, id, data, nil)
}

// commitStore is CommitStore from the ZMQ peer peer (nil: unknown): an SHM
// commit publishes a reservation only when peer prepared it.
func (m *Module) commitStore(k protocol.Key, id int64, data []byte, peer []byte) (bool, error) {
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
		p, foreign := m.takeOwn(m.writes, pk, peer)
		if p == nil && !foreign {
			p = m.takeCarriedWrite(pk, k)
		}
		if foreign {
			m.foreignCommit("COMMIT_STORE", id, peer)
			return false, nil
		}
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
		inst.shmProven = true
		m.mu.Unlock()
		// The event stream first: a tier told its write landed takes the
		// chunk's tokens and parent from what the commit told it.
		m.noteCommittedSHM(inst, k, p)
		m.notePublished(p.res, inst)
		m.noteSHMWorks(inst)
		return true, nil
	}
	if len(inst.groups) > 1 {
		return m.commitGroups(inst, k, data, peer)
	}

	ks, prev, pk, err := m.resolveStore(inst, k)
	if err != nil {
		return false, fmt.Errorf("commit store for instance %d: %w", id, err)
	}
	ts, err := torchpickle.Decode(data, torchpickle.Limits{})
	if err != nil {
		return false, fmt.Errorf("commit store for instance %d: decode pickled chunks: %w", id, err)
	}
	if m.modeOf(inst) == workers.ModeSHM {
		if why := provesPickle(ts, len(ks), inst.lay, false); why != "" {
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
		m.abandonPendingWrite(pk, peer)
	}
	ok, err := m.commitPickle(inst, k, prev, ks, ts, inst.lay, false)
	if err != nil {
		return false, fmt.Errorf("commit store for instance %d: %w", id, err)
	}
	return ok, nil
}

// commitGroups handles a hybrid model's COMMIT_STORE with data: one
// group-major pickle carrying every group's chunks. It must carry exactly
// the registered number of groups; each group is then stored as
// COMMIT_STORE_GROUP stores it, and the answer is true only when every
// group stored everything.
func (m *Module) commitGroups(inst *instance, k protocol.Key, data []byte, peer []byte) (bool, error) {
	ks, prev, pk, err := m.resolveStore(inst, k)
	if err != nil {
		return false, fmt.Errorf("commit store for instance %d: %w", inst.id, err)
	}
	gs, err := torchpickle.DecodeGroups(data, torchpickle.Limits{})
	if err != nil {
		return false, fmt.Errorf("commit store for instance %d: decode pickled groups: %w", inst.id, err)
	}
	if len(gs) != len(inst.groups) {
		m.errorEvent("COMMIT_STORE/groups", inst.id, fmt.Sprintf(
			"instance %d sent %d groups, registered %d: nothing stored", inst.id, len(gs), len(inst.groups)))
		m.countFailure(inst)
		return false, nil
	}
	if m.modeOf(inst) == workers.ModeSHM {
		for g, ts := range gs {
			if why := provesPickle(ts, len(ks), inst.groups[g], true); why != "" {
				m.errorEvent("COMMIT_STORE/unproven", inst.id, fmt.Sprintf(
					"instance %d (SHM) sent pickled groups that do not match it (group %d: %s): nothing stored, mode unchanged", inst.id, g, why))
				return false, nil
			}
		}
		m.noteFallback(inst)
		m.abandonPendingWrite(pk, peer)
	}
	all := true
	for g, ts := range gs {
		ok, err := m.commitPickle(inst, k, keys.InGroup(prev, uint32(g)), keys.InGroup(ks, uint32(g)), ts, inst.groups[g], true)
		if err != nil {
			return false, fmt.Errorf("commit store for instance %d, group %d: %w", inst.id, g, err)
		}
		all = all && ok
	}
	return all, nil
}

// CommitStoreGroup handles COMMIT_STORE_GROUP [key, instance_id, group_idx,
// cpu_data]: one KV group's chunks of a store, pickled as LMCache's
// single-group serializer writes them (a list holding one list of chunks),
// so that no single message of a large hybrid model passes msgpack's 4 GiB
// bin limit. The group index must name a registered group (0 for a plain
// model). Each group's objects are published by their own commit; a chunk
// is a hit for LOOKUP only once every group of it is stored, so a store
// whose groups did not all arrive is never served. The group's tensors
// must be exactly one per chunk of the key, each of the group's layout:
// otherwise the tensors that do not match are not stored and the answer
// is false. Bad input (unknown instance or group, undecodable pickle) is
// an error and changes nothing.
func (m *Module) CommitStoreGroup(k protocol.Key, id int64, group int64, data []byte) (bool, error) {
	return m.commitStoreGroup(k, id, group, data, nil)
}

// commitStoreGroup is CommitStoreGroup from the ZMQ peer peer (nil: unknown).
func (m *Module) commitStoreGroup(k protocol.Key, id int64, group int64, data []byte, peer []byte) (bool, error) {
	inst, err := m.lookupInstance(id)
	if err != nil {
		return false, fmt.Errorf("commit store group: %w", err)
	}
	m.maybeSweep()
	if group < 0 || group >= int64(len(inst.groups)) {
		return false, fmt.Errorf("commit store group for instance %d: group %d out of range: the instance registered %d group(s)", id, group, len(inst.groups))
	}
	if len(data) == 0 {
		return false, fmt.Errorf("commit store group for instance %d: no data (a group commit always carries its chunks)", id)
	}
	ks, prev, pk, err := m.resolveStore(inst, k)
	if err != nil {
		return false, fmt.Errorf("commit store group for instance %d: %w", id, err)
	}
	gs, err := torchpickle.DecodeGroups(data, torchpickle.Limits{})
	if err != nil {
		return false, fmt.Errorf("commit store group for instance %d: decode pickled group: %w", id, err)
	}
	if len(gs) != 1 {
		return false, fmt.Errorf("commit store group for instance %d: the pickle holds %d groups, want one", id, len(gs))
	}
	ts, lay := gs[0], inst.groups[group]
	if m.modeOf(inst) == workers.ModeSHM {
		if why := provesPickle(ts, len(ks), lay, true); why != "" {
			m.errorEvent("COMMIT_STORE_GROUP/unproven", id, fmt.Sprintf(
				"instance %d (SHM) sent group %d chunks that do not match it (%s): nothing stored, mode unchanged", id, group, why))
			m.countFailure(inst)
			return false, nil
		}
		m.noteFallback(inst)
		m.abandonPendingWrite(pk, peer)
	}
	ok, err := m.commitPickle(inst, k, keys.InGroup(prev, uint32(group)), keys.InGroup(ks, uint32(group)), ts, lay, true)
	if err != nil {
		return false, fmt.Errorf("commit store group for instance %d, group %d: %w", id, group, err)
	}
	return ok, nil
}

// countFailure counts a store that stored nothing.
func (m *Module) countFailure(inst *instance) {
	m.mu.Lock()
	inst.storeFailures++
	m.mu.Unlock()
}

// provesPickle says why a decoded pickle commit does not prove that an SHM
// instance's worker fell back to pickle ("" when it does): it must carry one
// tensor per chunk of the key, each of the instance's registered layout. A
// group commit of a key with no chunk carries nothing and proves nothing,
// but it is harmless (emptyOK).
func provesPickle(ts []torchpickle.Tensor, chunks int, lay layout.Layout, emptyOK bool) string {
	if chunks == 0 {
		if emptyOK && len(ts) == 0 {
			return ""
		}
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

// commitPickle stores the decoded chunks, of layout lay: tensor i goes to key
// i when key i is not cached yet. The answer is upstream's written ==
// reserved, except that a tensor not matching the layout is never stored and
// makes it false; with exact (group commits) so does a tensor count other
// than the key's chunk count.
func (m *Module) commitPickle(inst *instance, k protocol.Key, prev, ks []keys.ObjectKey, ts []torchpickle.Tensor, lay layout.Layout, exact bool) (bool, error) {
	valid := make([]bool, len(ks))
	rejected := 0
	if exact && len(ts) != len(ks) {
		rejected++
		m.errorEvent("COMMIT_STORE/count", inst.id, fmt.Sprintf(
			"instance %d sent %d chunks for a key of %d chunks: the missing ones are not stored", inst.id, len(ts), len(ks)))
	}
	for i := range ks {
		if i >= len(ts) {
			continue
		}
		if matches(ts[i], lay) {
			valid[i] = true
			continue
		}
		rejected++
		if rejected == 1 {
			m.errorEvent("COMMIT_STORE/layout", inst.id, fmt.Sprintf(
				"instance %d sent chunk %d as %v %s (%d bytes); registered layout is %s (%d bytes): not stored",
				inst.id, i, ts[i].Shape, ts[i].Dtype, len(ts[i].Data), lay, lay.Bytes))
		}
	}

	res, err := m.reserve(inst, prev, ks, lay.Bytes)
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
	if m.committed != nil {
		m.noteCommitted(k, chainOf(prev, ks), written) // before the tiers, as above
	}
	m.notePublished(written, inst)
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
// commit: one chunk of each of the instance's KV group layouts per chunk of the key's range
// (false: not a pickle instance, nothing to gate).
func (m *Module) pickleStoreBytes(k protocol.Key, id int64) (int64, bool) {
	inst, err := m.lookupInstance(id)
	if err != nil || m.modeOf(inst) != workers.ModePickle {
		return 0, false
	}
	return m.pickleBytes(inst, k), true
}

// pickleBytes is the size of the pickle of k's chunks in inst's layouts,
// exactly: its headers grow with the chunks (a few hundred bytes each),
// past any fixed slack once prompts are long and chunks small.
func (m *Module) pickleBytes(inst *instance, k protocol.Key) int64 {
	chunks := int(m.keyChunks(k))
	gs := make([]torchpickle.Shaped, len(inst.groups))
	for g, lay := range inst.groups {
		gs[g] = torchpickle.Shaped{Count: chunks, Dtype: lay.Dtype, Shape: lay.Shape}
	}
	if n := torchpickle.ShapedSize(gs, len(gs) > 1); n >= 0 {
		return int64(n)
	}
	return m.keyBytes(inst, k) // not encodable: the transfer fails on its own
}

// retrieveReplyBytes is what a PREPARE_RETRIEVE reply of k carrying the
// pickled chunks may hold (false: its reply carries no data, nothing to
// gate): a pickle instance's, and an SHM instance's not yet proven to map
// the segment (carriesData).
func (m *Module) retrieveReplyBytes(k protocol.Key, id int64) (int64, bool) {
	inst, err := m.lookupInstance(id)
	if err != nil || !m.carriesData(inst) {
		return 0, false
	}
	n := m.pickleBytes(inst, k)
	if m.modeOf(inst) == workers.ModeSHM {
		// The slots go beside the data: past a few hundred chunks their
		// list outgrows the reply's slack.
		n += m.keyChunks(k) * m.slotsBytes(inst)
	}
	return n, true
}

// slotsBytes bounds the wire size of one chunk's slots in a reply's
// context: one slot per KV group, each a map of offset, length, shape and
// dtype (and its group id for a hybrid model).
func (m *Module) slotsBytes(inst *instance) int64 {
	// fixmap, the four keys, two int64s, the shape's and dtype's headers.
	const fixed = 1 + (1 + 6) + (1 + 6) + (1 + 5) + (1 + 5) + 9 + 9 + 5 + 5
	var n int64
	for _, lay := range inst.groups {
		n += fixed + 9*int64(len(lay.Shape)) + int64(len(lay.Dtype))
		if len(inst.groups) > 1 {
			n += 9
		}
	}
	return n
}

// carriesData reports whether inst's retrieve replies carry the pickled
// chunks: a pickle instance's always; an SHM instance's beside the slots
// until the worker proved it maps the segment (an SHM store it wrote and
// committed), since a worker that could not attach it (or chose pickle)
// looks the same until then, reads only the data and would get nothing
// from slots. Counting its retrieve as a hit is then true either way.
func (m *Module) carriesData(inst *instance) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return inst.mode == workers.ModePickle || !inst.shmProven
}

// keyBytes is one chunk of each of inst's KV group layouts per chunk of the
// key's range.
func (m *Module) keyBytes(inst *instance, k protocol.Key) int64 {
	var perChunk int64 // every KV group's chunk (one for a plain model)
	for _, lay := range inst.groups {
		perChunk += lay.Bytes
	}
	return m.keyChunks(k) * perChunk
}

// keyChunks is the number of chunks of the key's range (at least one).
func (m *Module) keyChunks(k protocol.Key) int64 {
	chunks := int64(1)
	if n := int64(k.End - k.Start); n > 0 {
		chunks = (n + int64(m.chunkSize) - 1) / int64(m.chunkSize)
	}
	return chunks
}

// PrepareRetrieve handles PREPARE_RETRIEVE (spec 4.7). Every key must be
// read-locked by a preceding LOOKUP, else the answer is a miss and the found
// keys' locks are released. SHM answers slots and keeps the locks until
// COMMIT_RETRIEVE; PICKLE answers the pickled chunks and releases at once.
func (m *Module) PrepareRetrieve(k protocol.Key, id int64) (protocol.PrepareRetrieveResponse, error) {
	var data []byte
	r, err := m.prepareRetrieve(k, id, nil, func(ts []torchpickle.Tensor, groups [][]torchpickle.Tensor, _ []byte) error {
		var err error
		if groups != nil {
			data, err = torchpickle.AppendEncodeGroups(make([]byte, 0, max(torchpickle.EncodedGroupsSize(groups), 0)), groups)
			return err
		}
		var buf []byte
		if size := torchpickle.EncodedSize(ts); size > 0 {
			buf = make([]byte, 0, size)
		}
		data, err = torchpickle.AppendEncode(buf, ts)
		return err
	})
	if err == nil && r.Success {
		r.Data = data
	}
	return r, err
}

// prepareRetrieveReply is PrepareRetrieve as the request handler answers it:
// a pickle reply is encoded once, into an exactly sized buffer from alloc
// (the wire server's reply buffer, outside the Go heap: msgpack header, the
// pickle straight after it), and sent by the server without another copy;
// SHM and misses answer the response.
func (m *Module) prepareRetrieveReply(k protocol.Key, id int64, peer []byte, alloc func(n int) ([]byte, error)) (any, error) {
	var out protocol.Raw
	r, err := m.prepareRetrieve(k, id, peer, func(ts []torchpickle.Tensor, groups [][]torchpickle.Tensor, ctx []byte) error {
		size := func() int { return torchpickle.EncodedSize(ts) }
		enc := func(dst []byte) ([]byte, error) { return torchpickle.AppendEncode(dst, ts) }
		if groups != nil {
			size = func() int { return torchpickle.EncodedGroupsSize(groups) }
			enc = func(dst []byte) ([]byte, error) { return torchpickle.AppendEncodeGroups(dst, groups) }
		}
		n := size()
		if n < 0 {
			_, err := enc(nil) // for its error
			return err
		}
		buf, err := alloc(protocol.RetrieveReplySize(n, max(len(ctx), 1)))
		if err != nil {
			return fmt.Errorf("reply buffer: %w", err)
		}
		b, err := protocol.AppendRetrieveReply(buf, n, enc, ctx)
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

// retrieveEncoder encodes a retrieve's chunks (a plain model's as ts, a
// hybrid model's as groups, group-major) into the reply, whose context is
// ctx (nil: the empty map) as PrepareRetrieveResponse.AppendContext writes it.
type retrieveEncoder func(ts []torchpickle.Tensor, groups [][]torchpickle.Tensor, ctx []byte) error

// prepareRetrieve does the work of PREPARE_RETRIEVE; for a pickle instance it
// calls encode with tensors that view the pool, under the read locks, and
// answers Success with neither Data nor Slots. An SHM instance whose replies
// carry data (carriesData) gets its slots answered and encode called with
// them as the context, the holds kept until COMMIT_RETRIEVE as for any SHM
// read.
func (m *Module) prepareRetrieve(k protocol.Key, id int64, peer []byte, encode retrieveEncoder) (protocol.PrepareRetrieveResponse, error) {
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
	// A prepare of a transfer already pending reads the same held slots:
	// the holds end with the last of their COMMIT_RETRIEVEs, so no commit
	// releases slots another copy of the same key is still reading.
	if m.modeOf(inst) == workers.ModeSHM {
		if p, withData := m.repeatedRead(pk, peer); p != nil {
			// The prepare consumes its lookup's lock, as a first prepare's
			// HoldRead does: else a second LOOKUP's locks stay to their
			// TTL, charged against the lookup cap.
			for g := range inst.groups {
				gks := ks
				if g > 0 {
					gks = keys.InGroup(ks, uint32(g))
				}
				m.pool.FinishRead(gks, 1)
			}
			return m.readReply(p, withData, encode)
		}
	}
	// Every group of every chunk must be there: a chunk one of whose groups
	// was never committed is a miss, and its found groups' holds go back.
	slots := make([]protocol.Slot, 0, len(ks)*len(inst.groups))
	var found []l1.ReadRef
	var groupIDs []int
	if len(inst.groups) > 1 {
		groupIDs = make([]int, 0, cap(slots))
	}
	sizes := make([]int, 0, len(inst.groups)) // slots per group
	ok := true
	for g, lay := range inst.groups {
		gks := ks
		if g > 0 {
			gks = keys.InGroup(ks, uint32(g))
		}
		s, f, gok := m.locateAll(gks, lay)
		slots, found, ok = append(slots, s...), append(found, f...), ok && gok
		sizes = append(sizes, len(s))
		if groupIDs != nil {
			for range s {
				groupIDs = append(groupIDs, g)
			}
		}
	}
	if !ok {
		if len(found) > 0 {
			m.pool.ReleaseRead(found)
		}
		m.mu.Lock()
		inst.retrieves++
		m.mu.Unlock()
		return protocol.PrepareRetrieveResponse{Success: false}, nil
	}
	var total int64
	for _, lay := range inst.groups {
		total += int64(len(ks)) * lay.Bytes
	}

	if m.modeOf(inst) == workers.ModeSHM {
		m.mu.Lock()
		if m.closed || m.instances[id] != inst {
			m.mu.Unlock()
			m.pool.ReleaseRead(found)
			return protocol.PrepareRetrieveResponse{}, fmt.Errorf("prepare retrieve: instance %d went away meanwhile: %w", id, ErrNotRegistered)
		}
		withData := !inst.shmProven // carriesData, under the lock already held
		resp := protocol.PrepareRetrieveResponse{Success: true, Slots: slots, GroupIDs: groupIDs}
		inst.retrieves++
		inst.hitChunks += int64(len(ks))
		inst.bytesOut += total
		if prev := m.reads[pk]; prev != nil {
			// A concurrent prepare of the same transfer won: read its
			// slots; ours were never handed out.
			prev.join(peer)
			m.mu.Unlock()
			m.pool.ReleaseRead(found)
			return m.readReply(prev, withData, encode)
		}
		p := &pending{inst: inst, peer: string(peer), refs: found, bytes: total, created: created, reply: resp,
			sizes: sizes, carry: m.carryKeyLocked(pk, k)}
		p.join(peer)
		m.reads[pk] = p
		m.mu.Unlock()
		return m.readReply(p, withData, encode)
	}

	// The tensors view the pool directly: the read locks keep the objects in
	// place until the one copy into the reply buffer is done.
	err = m.encodeSlots(slots, sizes, len(inst.groups) > 1, encode, nil)
	m.pool.ReleaseRead(found)
	if err != nil {
		return protocol.PrepareRetrieveResponse{}, fmt.Errorf("prepare retrieve for instance %d: encode %d chunks: %w", id, len(slots), err)
	}
	m.mu.Lock()
	inst.retrieves++
	inst.hitChunks += int64(len(ks))
	inst.bytesOut += total
	m.mu.Unlock()
	return protocol.PrepareRetrieveResponse{Success: true}, nil
}

// readReply answers a prepare of the SHM read p: its slots, and when
// withData (carriesData) the chunks encoded beside them, under holds of
// its own: the read's holds may end while it encodes (another reader's
// commit, an unregister, a drop) and the encoded bytes must be the ones
// stored under the key, so a hold that ended (lock deadline) before the
// encoding did fails the reply rather than send what the slot may hold
// by then.
func (m *Module) readReply(p *pending, withData bool, encode retrieveEncoder) (protocol.PrepareRetrieveResponse, error) {
	resp := p.reply
	if !withData {
		return resp, nil
	}
	fail := func(err error) (protocol.PrepareRetrieveResponse, error) {
		return protocol.PrepareRetrieveResponse{}, fmt.Errorf("prepare retrieve for instance %d: encode %d chunks beside their slots: %w", p.inst.id, len(resp.Slots), err)
	}
	held, ok := m.pool.Rehold(p.refs)
	if !ok {
		return fail(errors.New("the read's holds ended before its chunks were encoded"))
	}
	defer m.pool.ReleaseRead(held)
	ctx, err := resp.AppendContext(nil)
	if err == nil {
		err = m.encodeSlots(resp.Slots, p.sizes, len(p.inst.groups) > 1, encode, ctx)
	}
	if err == nil && !m.pool.HeldAll(held) {
		err = errors.New("the read's holds expired while its chunks were encoded")
	}
	if err != nil {
		return fail(err)
	}
	return resp, nil
}

// encodeSlots calls encode with tensors that view the pool at slots (sizes:
// the slots of each KV group, split into groups when hybrid) and context
// ctx; the caller's read holds keep the objects in place, and the views
// keep the mapping until encode returned.
func (m *Module) encodeSlots(slots []protocol.Slot, sizes []int, hybrid bool, encode retrieveEncoder, ctx []byte) error {
	ts := make([]torchpickle.Tensor, len(slots))
	releases := make([]func(), 0, len(slots))
	defer func() {
		for _, release := range releases {
			release()
		}
	}()
	for i, s := range slots {
		b, release := m.pool.View(s.Offset, s.Length)
		releases = append(releases, release)
		if b == nil {
			return errors.New("the pool is closing")
		}
		ts[i] = torchpickle.Tensor{Dtype: s.Dtype, Shape: s.Shape, Data: b}
	}
	if !hybrid {
		return encode(ts, nil, ctx)
	}
	groups := make([][]torchpickle.Tensor, len(sizes))
	at := 0
	for g, n := range sizes {
		groups[g] = ts[at : at+n]
		at += n
	}
	return encode(nil, groups, ctx)
}

// CommitRetrieve handles COMMIT_RETRIEVE: the pending SHM read (if any)
// releases one lock per key. Always true.
func (m *Module) CommitRetrieve(k protocol.Key, id int64) (bool, error) {
	return m.commitRetrieve(k, id, nil)
}

// commitRetrieve is CommitRetrieve from the ZMQ peer peer (nil: unknown): it
// ends only holds that peer took.
func (m *Module) commitRetrieve(k protocol.Key, id int64, peer []byte) (bool, error) {
	inst, err := m.lookupInstance(id)
	if err != nil {
		return false, fmt.Errorf("commit retrieve: %w", err)
	}
	m.maybeSweep()
	_, pk, err := m.keyRequest(inst, k)
	if err != nil {
		return false, fmt.Errorf("commit retrieve for instance %d: %w", id, err)
	}
	p, foreign := m.endRead(pk, peer)
	if p == nil && !foreign && m.hasCarried() {
		p, foreign = m.endRead(m.carriedKey(pk, k), peer)
	}
	if foreign {
		m.foreignCommit("COMMIT_RETRIEVE", id, peer)
	}
	if p != nil && !m.expireIfDue(p, false) {
		m.pool.ReleaseRead(p.refs)
	}
	return true, nil
}

// endRead counts one COMMIT_RETRIEVE from peer of pk's pending read and
// returns the entry, taken from the map, when it was the last one its holds
// wait for; foreign when another peer took the holds (nothing is counted).
func (m *Module) endRead(pk pendingKey, peer []byte) (p *pending, foreign bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p = m.reads[pk]
	if p == nil {
		return nil, false
	}
	if !p.ownedBy(peer) {
		return nil, true
	}
	if !p.leave(peer) {
		return nil, false
	}
	delete(m.reads, pk)
	return p, false
}

// repeatedWrite reports whether pk has a pending write within its life; one
// past it is expired here.
func (m *Module) repeatedWrite(pk pendingKey) bool {
	now := m.now()
	m.mu.Lock()
	p, ok := m.writes[pk]
	due := ok && now.Sub(p.created) >= m.writeTTL/2
	if due {
		delete(m.writes, pk)
		m.stats.Expired++
	}
	m.mu.Unlock()
	if due {
		m.expire(p, true, now)
	}
	return ok && !due
}

// repeatedRead finds a prepare of pk's pending read (within its life),
// counts it as one more reader of its holds and returns it with whether
// its reply carries the data (carriesData); nil when there is none, or it
// was past its life and expired here.
func (m *Module) repeatedRead(pk pendingKey, peer []byte) (*pending, bool) {
	now := m.now()
	m.mu.Lock()
	p, ok := m.reads[pk]
	due := ok && now.Sub(p.created) >= m.readTTL/2
	withData := false
	switch {
	case due:
		delete(m.reads, pk)
		m.stats.Expired++
	case ok:
		p.join(peer)
		p.inst.retrieves++
		p.inst.hitChunks += int64(p.promptChunks())
		p.inst.bytesOut += p.bytes
		withData = !p.inst.shmProven
	}
	m.mu.Unlock()
	if due {
		m.expire(p, false, now)
	}
	if !ok || due {
		return nil, false
	}
	return p, withData
}

// takePending removes and returns one entry of the given pending map.
func (m *Module) takePending(table map[pendingKey]*pending, pk pendingKey) *pending {
	p, _ := m.takeOwn(table, pk, nil)
	return p
}

// takeOwn removes and returns pk's entry of table when peer may end it
// (pending.ownedBy); an entry of another peer stays (foreign).
func (m *Module) takeOwn(table map[pendingKey]*pending, pk pendingKey, peer []byte) (p *pending, foreign bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p = table[pk]
	if p == nil {
		return nil, false
	}
	if !p.ownedBy(peer) {
		return nil, true
	}
	delete(table, pk)
	return p, false
}

// foreignCommit counts and reports (rate-limited) a commit from a peer of a
// transfer another peer prepared: refused, the transfer left to its own.
func (m *Module) foreignCommit(kind string, id int64, peer []byte) {
	m.countAndWarn(&m.stats.ForeignCommits, "commit/foreign", id, func() string {
		return fmt.Sprintf("%s of instance %d from %s refused: another peer prepared that transfer (an old worker whose id was registered again, or a peer naming another's id); it stays for the peer that prepared it",
			kind, id, peerText(string(peer)))
	})
}

// countAndWarn counts one refused request in counter (a field of m.stats)
// and reports it as a warning, at most once a second per limiter.
func (m *Module) countAndWarn(counter *int64, limiter string, id int64, msg func() string) {
	m.mu.Lock()
	*counter++
	m.mu.Unlock()
	m.rateLimited(limiter, func() { m.event(workers.EventError, slog.LevelWarn, id, msg()) })
}

// abandonPendingWrite gives up the pending write of pk (a repeated prepare,
// or a pickle commit of the same transfer). Its slots were handed out, so
// they are abandoned, not freed: a copy into them may still be running. The
// keys are free to be reserved again at once.
func (m *Module) abandonPendingWrite(pk pendingKey, peer []byte) {
	if p, _ := m.takeOwn(m.writes, pk, peer); p != nil && !m.expireIfDue(p, true) {
		m.pool.Abandon(p.res, nil)
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

// expire abandons an entry past its life (stale locks are ignored by the
// pool; live ones keep their bytes until the pool's TTL) and tells the
// operator.
func (m *Module) expire(p *pending, write bool, now time.Time) {
	if write {
		m.pool.ExpireWrite(p.res)
	} else {
		m.pool.Abandon(nil, p.refs)
	}
	what := "read"
	if write {
		what = "write"
	}
	m.mu.Lock()
	ttl := m.ttlOf(write)
	m.mu.Unlock()
	// The pane shows the pool's lock TTLs; the event says how this figure
	// relates to them, so the two never seem to disagree.
	m.rateLimited("expired", func() {
		m.event(workers.EventExpired, slog.LevelWarn, p.inst.id, fmt.Sprintf(
			"instance %d: pending %s of %d chunks expired after %s without a commit: given up at half the %s %s TTL (l1.%s_ttl_seconds), its lock kept to the TTL",
			p.inst.id, what, p.chunks(), now.Sub(p.created).Round(time.Second), ttl, what, what))
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
// handlers call it at most once a second; the owner runs it every
// SweepEvery so that idle workers' entries go too.
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

// SweepEvery is how often the owner runs Sweep.
const SweepEvery = time.Second

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

// notePublished hands the keys of published reservations to Deps.Published,
// a batch per KV group with that group's layout (each tier value carries its
// own group's layout).
func (m *Module) notePublished(rs []l1.Reservation, inst *instance) {
	if m.published == nil || len(rs) == 0 {
		return
	}
	for g := range inst.groups {
		var ks []keys.ObjectKey
		for _, r := range rs {
			if r.Key.Group == uint32(g) {
				ks = append(ks, r.Key)
			}
		}
		if len(ks) > 0 {
			m.published(ks, groupOf(inst, uint32(g)))
		}
	}
}

// noteCommittedSHM is noteCommitted for an SHM commit of p: its chunk
// hashes are those its prepare resolved (p.chain; the commit matched p by
// every field of the key, its tokens included), or, for a write the
// previous process prepared, resolved again. Only when the KV event stream
// is on.
func (m *Module) noteCommittedSHM(inst *instance, k protocol.Key, p *pending) {
	if m.committed == nil || len(p.res) == 0 {
		return
	}
	c := p.chain
	if c == nil {
		ks, prev, _, err := m.resolveStore(inst, k)
		if err != nil {
			return // the commit resolved these keys at its prepare: not expected
		}
		c = chainOf(prev, ks)
	}
	m.noteCommitted(k, c, p.res)
}

// noteCommitted tells Deps.Committed what the KV event stream needs of a
// commit that published rs: the store's chunk hashes in prompt order and
// the parent of its first (c), its tokens and its world size (a chunk is
// whole once every rank of every group of every registered layout
// committed it, as LOOKUP counts).
func (m *Module) noteCommitted(k protocol.Key, c *storeChain, rs []l1.Reservation) {
	if m.committed == nil || len(rs) == 0 || k.Start < 0 || k.End > len(k.TokenIDs) || k.Start > k.End {
		return
	}
	e := kvevents.Commit{
		Model: k.ModelName, Salt: k.CacheSalt, WorldSize: k.WorldSize, Parent: c.parent, HasParent: c.hasParent,
		Hashes: c.hashes, Tokens: k.TokenIDs[k.Start:k.End], Keys: make([]keys.ObjectKey, len(rs)),
	}
	for i, r := range rs {
		e.Keys[i] = r.Key
	}
	m.committed(e)
}

// reserve reserves ks for inst, linked after prev when the store starts
// mid-prompt (resolveStore).
func (m *Module) reserve(inst *instance, prev, ks []keys.ObjectKey, size int64) ([]l1.Reservation, error) {
	if len(prev) == 0 {
		return m.pool.ReserveWrite(l1.InstanceOwner(inst.id), ks, size)
	}
	return m.pool.ReserveWriteAfter(l1.InstanceOwner(inst.id), prev, ks, size)
}
