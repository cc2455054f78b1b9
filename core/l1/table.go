package l1

import (
	"fmt"
	"math"
	"slices"

	"kvdock/core/keys"
	"kvdock/core/l1/nextuse"
)

// The object table is laid out for a small Go heap at millions of objects:
// an open-addressing index (index.go) from an identity (chunk hash,
// interned model+salt+layout, rank, group) to an index into a slice of fixed-size
// records; the LRU list, the prefix tree and the heap of evictable leaves
// (prefix.go) are intrusive (indices in the records); only locked objects
// sit in an extra set.
//
// Clear and in-flight transfers: a cleared object that is locked stays in
// the index, doomed, rather than leaving it for a separate list. One key then
// never has two records, so the by-key calls that cannot carry a handle
// (the scheduler's FinishRead, a worker's HoldRead of a lock LOOKUP took)
// still find the record their lock is on, and its space is not reused until
// that lock ends. Doomed records are invisible to lookups, reads and new
// reservations (a store of that key gets no slot until the lock ends).
// Writes and worker reads additionally name their lock (Reservation,
// ReadRef: record index plus a lock id unique for the pool's life), so a
// commit, abort or release that arrives after its lock expired never acts
// on a lock someone else took on that key or on the recycled record.
//
// Read locks come in two kinds. LOOKUP takes anonymous ones (readers), one
// per worker that will read; the scheduler may release them by key
// (FinishRead). A worker's PREPARE_RETRIEVE turns one into a hold (HoldRead)
// that only its ReadRef releases, so no by-key release, however stale or
// excessive, can unlock an object a worker is copying.

const (
	stateFree  uint8 = iota // slot on the free list
	stateWrite              // write-locked: reserved, being written, not readable
	stateReady              // published; readable; read-locked while readers+holds > 0
)

const nilRec = -1

// smallBatch is the largest ReserveWrite batch deduplicated by a scan.
const smallBatch = 32

// ident is an ObjectKey with the model, salt and layout ID interned.
type ident struct {
	chunk keys.Hash
	name  uint32 // index into table.names
	rank  uint32
	group uint32 // KV group (object_group_id)
}

type record struct {
	id         ident
	off        int64
	length     int64  // requested size; the allocation is rounded up to Align
	deadline   int64  // unix ns: expiry of the write lock or of the read locks
	lock       uint64 // id of the current write lock or read-lock era; 0 = none
	prev, next int32  // LRU neighbours (prev towards MRU); next links free slots
	// bprev, bnext: neighbours in the benchmark's own LRU list (apart.go),
	// for records of a benchmark model only.
	bprev, bnext int32
	ord          nextuse.Order // the prefix policy's order (prefix.go)
	// The prefix tree (prefix.go): the record of the chunk before this one
	// in its prompt (nilRec: none resident), the first of its resident
	// children and its siblings; peer rings the records of the same
	// chunk (other ranks and groups).
	parent, kid, sibPrev, sibNext int32
	peer                          int32
	readers                       uint32 // anonymous read locks left by lookups for the workers
	holds                         uint32 // read locks workers took (HoldRead) and release by ReadRef
	owner                         uint32 // Pool.ownerSlots index charged for the lock
	state                         uint8
	doomed                        bool // cleared while locked: freed when the lock ends
	shared                        bool // another peer's lookup added readers to this read-lock era
	detached                      bool // abandoned reservation: out of the key index until freed
	root                          bool // starts a prompt: usable without a parent
	carried                       bool // a live write reservation adopted for ClaimWrites
	pinned                        bool // a store of its prompt is evicting (pinPrompt)
}

// nameKey is what objects of one name share: the layout ID lives here, not
// in each record, so keeping layouts apart costs nothing per object.
type nameKey struct {
	model, salt string
	layout      uint64
}

// modelSalt is a name without its layout.
type modelSalt struct{ model, salt string }

type table struct {
	index    keyIndex
	recs     []record
	freeRec  int32
	mru, lru int32
	locked   map[int32]struct{}
	names    map[nameKey]uint32
	nameList []nameKey
	nameRefs []uint32
	nameFree []uint32
	nameWS   []wsSet // world sizes each name holds objects for (see readable.go)
	// layoutNames lists the names of each (model, salt), one per layout
	// (readable.go).
	layoutNames map[modelSalt][]uint32
	// nameBench marks the names of benchmark models (apart.go); bmru, blru
	// end the benchmark records' LRU list, benchBytes is their rounded sizes.
	nameBench  []bool
	bmru, blru int32
	benchBytes int64

	writeLocked, readLocked int
	// lookupBytes is what lookups hold read-locked, all requests together
	// (capped at lookupCap).
	lookupBytes int64
	doomed      int
	detached    int // records out of the index (see detach)
	doomedBytes int64
	bytes       int64         // rounded sizes of every record
	usableBytes int64         // rounded sizes of the usable records (prefix.go)
	clk         nextuse.Clock // the prefix policy's clock: one tick per use
	heaps       nextuse.Heaps // the evictable leaves, by due and late time
}

func (t *table) init() {
	*t = table{
		freeRec: nilRec,
		mru:     nilRec,
		lru:     nilRec,
		bmru:    nilRec,
		blru:    nilRec,
		locked:  make(map[int32]struct{}),
		names:   make(map[nameKey]uint32),

		layoutNames: make(map[modelSalt][]uint32),
	}
}

// len is the number of records holding bytes, detached ones included.
func (t *table) len() int { return t.index.n + t.detached }

// find returns the record index of k, or nilRec.
func (t *table) find(k keys.ObjectKey) int32 {
	n, ok := t.names[nameKey{k.Model, k.Salt, k.Layout}]
	if !ok {
		return nilRec
	}
	return t.index.find(t.recs, &ident{k.Chunk, n, k.KVRank, k.Group})
}

// add creates a record at the MRU end; the caller locks it.
func (t *table) add(k keys.ObjectKey, off, length, rounded int64) int32 {
	nk := nameKey{k.Model, k.Salt, k.Layout}
	n, ok := t.names[nk]
	if !ok {
		if l := len(t.nameFree); l > 0 {
			n = t.nameFree[l-1]
			t.nameFree = t.nameFree[:l-1]
			t.nameList[n] = nk
			t.nameBench[n] = keys.IsBenchModel(k.Model)
		} else {
			n = uint32(len(t.nameList))
			t.nameList = append(t.nameList, nk)
			t.nameRefs = append(t.nameRefs, 0)
			t.nameWS = append(t.nameWS, wsSet{})
			t.nameBench = append(t.nameBench, keys.IsBenchModel(k.Model))
		}
		t.names[nk] = n
		ms := modelSalt{nk.model, nk.salt}
		t.layoutNames[ms] = append(t.layoutNames[ms], n)
	}
	t.nameRefs[n]++
	t.nameWS[n].add(rankWorldSize(k.KVRank))
	var i int32
	if t.freeRec != nilRec {
		i = t.freeRec
		t.freeRec = t.recs[i].next
	} else {
		t.recs = append(t.recs, record{})
		i = int32(len(t.recs) - 1)
	}
	id := ident{k.Chunk, n, k.KVRank, k.Group}
	t.recs[i] = record{id: id, off: off, length: length, prev: nilRec, next: nilRec, bprev: nilRec, bnext: nilRec, state: stateReady, ord: nextuse.New(t.clk.Tick()),
		parent: nilRec, kid: nilRec, sibPrev: nilRec, sibNext: nilRec, peer: i}
	t.index.insert(t.recs, i)
	t.pushMRU(i)
	t.bytes += rounded
	if t.nameBench[n] {
		t.benchBytes += rounded
	}
	return i
}

// remove drops unlocked record i from every structure; the caller frees
// its space.
func (t *table) remove(i int32, rounded int64) {
	r := &t.recs[i]
	if r.doomed {
		t.doomed--
		t.doomedBytes -= rounded
	}
	t.bytes -= rounded
	if t.nameBench[r.id.name] {
		t.benchBytes -= rounded
	}
	if r.detached {
		t.detached--
	} else {
		t.index.remove(t.recs, i)
	}
	t.unlink(i)
	n := r.id.name
	if t.nameRefs[n]--; t.nameRefs[n] == 0 {
		nk := t.nameList[n]
		delete(t.names, nk)
		ms := modelSalt{nk.model, nk.salt}
		if ns := slices.DeleteFunc(t.layoutNames[ms], func(x uint32) bool { return x == n }); len(ns) > 0 {
			t.layoutNames[ms] = ns
		} else {
			delete(t.layoutNames, ms)
		}
		t.nameList[n] = nameKey{}
		t.nameWS[n] = wsSet{}
		t.nameFree = append(t.nameFree, n)
	}
	*r = record{state: stateFree, prev: nilRec, next: t.freeRec}
	t.freeRec = i
}

// detach takes record i out of the key index (an abandoned reservation:
// a newer record may then take its key) while it keeps its bytes.
func (t *table) detach(i int32) {
	if r := &t.recs[i]; !r.detached {
		t.index.remove(t.recs, i)
		r.detached = true
		t.detached++
	}
}

func (t *table) pushMRU(i int32) {
	r := &t.recs[i]
	r.prev, r.next = nilRec, t.mru
	if t.mru != nilRec {
		t.recs[t.mru].prev = i
	}
	t.mru = i
	if t.lru == nilRec {
		t.lru = i
	}
	if t.nameBench[r.id.name] {
		t.pushBenchMRU(i)
	}
}

func (t *table) unlink(i int32) {
	r := &t.recs[i]
	if r.prev != nilRec {
		t.recs[r.prev].next = r.next
	} else {
		t.mru = r.next
	}
	if r.next != nilRec {
		t.recs[r.next].prev = r.prev
	} else {
		t.lru = r.prev
	}
	r.prev, r.next = nilRec, nilRec
	if t.nameBench[r.id.name] {
		t.unlinkBench(i)
	}
}

func (t *table) touch(i int32) {
	t.stampNow(i)
	if t.mru != i {
		t.unlink(i)
		t.pushMRU(i)
	}
}

// readLocked reports whether r holds read locks of either kind.
func (r *record) readLocked() bool { return r.readers > 0 || r.holds > 0 }

// rounded is the allocated size of record i.
func (p *Pool) rounded(i int32) int64 { return p.alloc.Round(p.t.recs[i].length) }

// charge records that owner now holds bytes locked.
func (p *Pool) charge(o Owner, bytes int64) uint32 {
	s, ok := p.owners[o]
	if !ok {
		if l := len(p.ownerFree); l > 0 {
			s = p.ownerFree[l-1]
			p.ownerFree = p.ownerFree[:l-1]
		} else {
			s = uint32(len(p.ownerSlots))
			p.ownerSlots = append(p.ownerSlots, ownerCharge{})
		}
		p.ownerSlots[s] = ownerCharge{owner: o}
		p.owners[o] = s
	}
	p.ownerSlots[s].bytes += bytes
	p.lockedBytes += bytes
	if o.Kind == OwnerLookup {
		p.t.lookupBytes += bytes
		p.lookupPeers[o.Peer] += bytes
	}
	return s
}

// uncharge gives back bytes charged to slot s; an owner holding nothing
// leaves the table.
func (p *Pool) uncharge(s uint32, bytes int64) {
	p.lockedBytes -= bytes
	sl := &p.ownerSlots[s]
	if sl.owner.Kind == OwnerLookup {
		p.t.lookupBytes -= bytes
		if p.lookupPeers[sl.owner.Peer] -= bytes; p.lookupPeers[sl.owner.Peer] <= 0 {
			delete(p.lookupPeers, sl.owner.Peer)
		}
	}
	if sl.bytes -= bytes; sl.bytes <= 0 {
		delete(p.owners, sl.owner)
		*sl = ownerCharge{}
		p.ownerFree = append(p.ownerFree, s)
	}
}

// ownerBytes is what o holds locked now.
func (p *Pool) ownerBytes(o Owner) int64 {
	if s, ok := p.owners[o]; ok {
		return p.ownerSlots[s].bytes
	}
	return 0
}

// lookupCap is the bytes lookups may hold read-locked, all requests
// together: midway between one owner's cap and the total cap (70 % of the
// pool with the default shares). A scheduler may look several prompts up
// ahead (each request is an owner of its own, under the owner cap), while a
// peer that looks everything up under many request ids leaves the rest to
// stores.
func (p *Pool) lookupCap() int64 {
	return p.ownerCap + (p.totalCap-p.ownerCap)/2
}

// capFits reports whether o may lock bytes more under every cap now.
func (p *Pool) capFits(o Owner, bytes int64) bool {
	lookupOK := o.Kind != OwnerLookup || p.t.lookupBytes+bytes <= p.lookupCap()
	return p.ownerBytes(o)+bytes <= p.ownerCap && p.lockedBytes+bytes <= p.totalCap && lookupOK
}

// capRefusal reports whether o may not lock bytes more, and why; locks past
// their TTL are expired before a refusal is decided.
func (p *Pool) capRefusal(o Owner, bytes int64, now int64) error {
	if p.capFits(o, bytes) {
		return nil
	}
	p.sweep(now)
	var err error
	switch {
	case p.ownerBytes(o)+bytes > p.ownerCap:
		err = fmt.Errorf("%w: %s holds %d bytes locked, %d more would pass its cap of %d bytes (%.0f%% of the pool)",
			ErrLockCap, o, p.ownerBytes(o), bytes, p.ownerCap, 100*float64(p.ownerCap)/float64(p.alloc.Size()))
	case p.lockedBytes+bytes > p.totalCap:
		err = fmt.Errorf("%w: %d bytes are locked, %d more for %s would pass the total cap of %d bytes (%.0f%% of the pool)",
			ErrLockCap, p.lockedBytes, bytes, o, p.totalCap, 100*float64(p.totalCap)/float64(p.alloc.Size()))
	case o.Kind == OwnerLookup && p.t.lookupBytes+bytes > p.lookupCap():
		err = fmt.Errorf("%w: lookups hold %d bytes read-locked, %d more for %s would pass their cap of %d bytes (%.0f%% of the pool)",
			ErrLockCap, p.t.lookupBytes, bytes, o, p.lookupCap(), 100*float64(p.lookupCap())/float64(p.alloc.Size()))
	default:
		return nil
	}
	p.st.LockCapRefusals++
	return err
}

// logCap logs a lock-cap refusal at most once a second, counting the rest;
// it reports whether this one was logged.
func (p *Pool) logCap(err error, now int64) bool {
	if now-p.lastCapLog < int64(1e9) && p.lastCapLog != 0 {
		p.capSuppressed++
		return false
	}
	p.log.Warn("l1 lock cap refused work", "reason", err.Error(), "similar_suppressed", p.capSuppressed)
	p.lastCapLog, p.capSuppressed = now, 0
	return true
}

func (p *Pool) newLock() uint64 {
	p.nextLock++
	return p.nextLock
}

// lockWrite write-locks the new record i for o until deadline.
func (p *Pool) lockWrite(i int32, o Owner, deadline int64) uint64 {
	r := &p.t.recs[i]
	r.state = stateWrite
	r.lock = p.newLock()
	r.deadline = deadline
	r.owner = p.charge(o, p.rounded(i))
	p.t.locked[i] = struct{}{}
	p.t.writeLocked++
	return r.lock
}

// unlock ends record i's write lock or read-lock era (the record stays;
// a write-locked one becomes ready) and uncharges its owner.
func (p *Pool) unlock(i int32) {
	r := &p.t.recs[i]
	switch {
	case r.state == stateWrite:
		p.t.writeLocked--
		r.state = stateReady
	case r.readLocked():
		p.t.readLocked--
		r.readers, r.holds = 0, 0
	default:
		return
	}
	delete(p.t.locked, i)
	p.uncharge(r.owner, p.rounded(i))
	r.lock, r.owner, r.shared = 0, 0, false
	p.t.reheap(i)
}

// drop removes record i and frees its space.
func (p *Pool) drop(i int32) {
	p.unlock(i)
	if !p.t.recs[i].doomed { // a doomed record left the tree when doomed
		p.untree(i)
	}
	r := p.t.recs[i]
	p.t.remove(i, p.alloc.Round(r.length))
	p.alloc.Release(r.off, r.length)
}

// expire applies the TTLs to record i at time now: an expired write lock
// drops the object, expired read locks reset the reader count (and drop a
// doomed object). It reports true when the object is gone.
func (p *Pool) expire(i int32, now int64) bool {
	r := &p.t.recs[i]
	if r.deadline > now {
		return false
	}
	switch {
	case r.state == stateWrite:
		if !r.doomed {
			p.lost(i, LossExpired)
		}
		p.drop(i)
		p.st.ExpiredWriteLocks++
		return true
	case r.readLocked():
		p.st.ExpiredReadLocks++
		if r.doomed {
			p.drop(i)
			return true
		}
		p.unlock(i)
	}
	return false
}

// sweep expires every locked object whose TTL has passed.
func (p *Pool) sweep(now int64) {
	for i := range p.t.locked {
		p.expire(i, now)
	}
}

// evictable reports whether record i may be evicted at now.
func (p *Pool) evictable(i int32, now int64) bool {
	r := &p.t.recs[i]
	return r.state == stateReady && (!r.readLocked() || r.deadline <= now)
}

// evictOne evicts in policy order: the least recently used unlocked object
// (LRU), or the least recently used evictable leaf with its chunk's other
// ranks and groups (prefix). It returns how many objects went, 0 when
// nothing may be evicted.
func (p *Pool) evictOne(now int64) int {
	if p.policy == PolicyPrefix {
		return p.evictLeaf()
	}
	for i := p.t.lru; i != nilRec; i = p.t.recs[i].prev {
		if p.evictable(i, now) {
			p.evict(i)
			return 1
		}
	}
	return 0
}

// lookup finds k and applies its TTLs; nilRec when absent or expired. A
// doomed record is returned: callers decide whether it counts.
func (p *Pool) lookup(k keys.ObjectKey, now int64) int32 {
	i := p.t.find(k)
	if i == nilRec || p.expire(i, now) {
		return nilRec
	}
	return i
}

// ReserveWrite reserves for owner, write-locked, every key of ks that is
// absent (mode "new"; present keys are skipped, and so are keys of cleared
// objects still locked by a transfer), each of size bytes. The new keys are
// reserved all together or not at all: when they do not fit, the policy's
// unlocked objects are evicted on demand (LRU first); if they still do not
// fit the result is ErrNoSpace and nothing is reserved. A batch that would
// take owner or all owners past their lock cap is refused with ErrLockCap.
// Reservations are in key order; duplicate keys are reserved once.
//
// A batch of more keys than the pool could ever hold fails before any key is
// looked at, and the work under the pool mutex is linear in len(ks).
//
// ks's first chunk starts a prompt (the prefix tree's root): a store that
// starts mid-prompt is ReserveWriteAfter.
func (p *Pool) ReserveWrite(owner Owner, ks []keys.ObjectKey, size int64) ([]Reservation, error) {
	return p.reserveWrite(owner, nil, ks, size)
}

// ReserveWriteAfter is ReserveWrite for keys that continue a prompt: prev
// are the keys of the chunk before ks's first (its ranks and groups, as
// ks's are laid out), whose records become the parents of ks's first
// chunk. A prev not resident leaves that chunk without a parent: not
// usable, since no LOOKUP can reach it, until prev is stored again.
func (p *Pool) ReserveWriteAfter(owner Owner, prev, ks []keys.ObjectKey, size int64) ([]Reservation, error) {
	return p.reserveWrite(owner, prev, ks, size)
}

func (p *Pool) reserveWrite(owner Owner, prev, ks []keys.ObjectKey, size int64) ([]Reservation, error) {
	if size <= 0 {
		return nil, fmt.Errorf("l1: object size %d bytes, want > 0", size)
	}
	if len(ks) == 0 {
		return nil, nil
	}
	// Size and alignment never change after Open: the capacity check and
	// the dedupe need no lock, which keeps the mutex for the table work.
	unit := p.alloc.Round(size)
	if unit > p.alloc.Size()/int64(len(ks)) {
		p.mu.Lock()
		p.st.AllocFailures++
		p.refused(ks, nil, unit)
		p.mu.Unlock()
		return nil, fmt.Errorf("%w: %d objects of %d bytes exceed the pool of %d bytes", ErrNoSpace, len(ks), size, p.alloc.Size())
	}
	cand := make([]int, 0, len(ks)) // first occurrence of each key
	if len(ks) <= smallBatch {
		// A scan beats a map for a few keys (the usual batch).
		for i, k := range ks {
			if !slices.ContainsFunc(cand, func(j int) bool { return ks[j] == k }) {
				cand = append(cand, i)
			}
		}
	} else {
		seen := make(map[keys.ObjectKey]struct{}, len(ks))
		for i, k := range ks {
			if _, dup := seen[k]; !dup {
				seen[k] = struct{}{}
				cand = append(cand, i)
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.st.WriteExisting += uint64(len(ks) - len(cand))
	now := p.now().UnixNano()
	fresh := cand[:0] // indices into ks
	for _, i := range cand {
		if j := p.lookup(ks[i], now); j != nilRec {
			if p.t.recs[j].doomed {
				p.st.WriteDoomed++
			} else {
				p.st.WriteExisting++
			}
			continue
		}
		fresh = append(fresh, i)
	}
	if len(fresh) == 0 {
		p.chainAfter(prev, ks) // links of keys stored before, kept as they were
		return nil, nil
	}
	need := unit * int64(len(fresh))
	if !p.feasible(need, now) {
		p.st.AllocFailures++
		p.refused(ks, fresh, unit)
		return nil, fmt.Errorf("%w: %d objects of %d bytes, %d bytes free, %d locked", ErrNoSpace, len(fresh), size, p.alloc.Free(), p.lockedBytes)
	}
	// A batch that could fit but passes a cap is a lock-cap refusal, not
	// "no space": the operator sees which limit refused it.
	if err := p.capRefusal(owner, need, now); err != nil {
		p.logCap(err, now)
		p.refused(ks, fresh, unit)
		return nil, err
	}
	offs := make([]int64, len(fresh))
	if isBenchBatch(ks) {
		// Benchmark traffic: its own room, its own evictions (apart.go).
		p.sweep(now)
		if err := p.benchRoom(offs, size, need, now); err != nil {
			p.st.AllocFailures++
			p.st.BenchRefusals++
			p.refused(ks, fresh, unit)
			return nil, err
		}
	} else if p.alloc.Free() < need || !p.allocAll(offs, size) {
		p.sweep(now) // expired locks give space back before anything is evicted
		p.pinPrompt(prev, ks, true)
		ok := p.allocAll(offs, size) || p.evictBenchAndAlloc(offs, size, now) || p.evictAndAlloc(offs, size, now)
		p.pinPrompt(prev, ks, false)
		if !ok {
			p.st.AllocFailures++
			p.refused(ks, fresh, unit)
			return nil, fmt.Errorf("%w: %d objects of %d bytes, %d bytes free", ErrNoSpace, len(fresh), size, p.alloc.Free())
		}
	}
	deadline := now + int64(p.writeTTL)
	res := make([]Reservation, len(fresh))
	for j, i := range fresh {
		rec := p.t.add(ks[i], offs[j], size, unit)
		p.joinRing(rec)
		if p.obs != nil {
			p.obs.Stored(&ks[i], unit)
		}
		lock := p.lockWrite(rec, owner, deadline)
		res[j] = Reservation{Index: i, Key: ks[i], Offset: offs[j], Length: size, rec: rec, lock: lock}
	}
	p.chainAfter(prev, ks)
	p.st.WriteReservations += uint64(len(fresh))
	return res, nil
}

// feasible reports whether need bytes could be had from free space plus, with
// LRU, every unlocked object (expired locks are swept before a no).
func (p *Pool) feasible(need int64, now int64) bool {
	avail := func() int64 {
		a := p.alloc.Free()
		if p.policy != PolicyNoop {
			a += p.alloc.Size() - p.alloc.Free() - p.lockedBytes
		}
		return a
	}
	if avail() >= need {
		return true
	}
	p.sweep(now)
	return avail() >= need
}

// evictAndAlloc evicts unlocked objects in LRU order until allocAll
// succeeds, in one pass over the LRU list. It evicts nothing when the policy
// is noop or when free space plus every unlocked object could not hold the
// batch, so a batch that cannot fit does not empty the cache on its way to
// failing.
func (p *Pool) evictAndAlloc(offs []int64, size int64, now int64) bool {
	switch p.policy {
	case PolicyNoop:
		return false
	case PolicyPrefix:
		return p.evictLeavesAndAlloc(offs, size)
	}
	need := p.alloc.Round(size) * int64(len(offs))
	used := p.alloc.Size() - p.alloc.Free()
	if p.alloc.Free()+used-p.lockedBytes < need {
		return false
	}
	// A failed allocAll (fragmented free space) costs up to len(offs)
	// allocations, so after one the next try waits until another eighth of
	// the batch was freed: the retries stay linear in the pool's objects.
	step := max(p.alloc.Round(size), need/8)
	retryAt := need
	i := p.t.lru
	for {
		if free := p.alloc.Free(); free >= retryAt {
			if p.allocAll(offs, size) {
				return true
			}
			retryAt = free + step
		}
		for i != nilRec && !p.evictable(i, now) {
			i = p.t.recs[i].prev
		}
		if i == nilRec {
			return p.alloc.Free() >= need && p.allocAll(offs, size)
		}
		prev := p.t.recs[i].prev
		p.evict(i)
		i = prev
	}
}

// evictLeavesAndAlloc is evictAndAlloc for the prefix policy: leaves go,
// least recently used first, until allocAll succeeds or none is left.
func (p *Pool) evictLeavesAndAlloc(offs []int64, size int64) bool {
	need := p.alloc.Round(size) * int64(len(offs))
	used := p.alloc.Size() - p.alloc.Free()
	if p.alloc.Free()+used-p.lockedBytes < need {
		return false
	}
	step := max(p.alloc.Round(size), need/8) // as evictAndAlloc's retries
	retryAt := need
	for {
		if free := p.alloc.Free(); free >= retryAt {
			if p.allocAll(offs, size) {
				return true
			}
			retryAt = free + step
		}
		if p.evictLeaf() == 0 {
			return p.alloc.Free() >= need && p.allocAll(offs, size)
		}
	}
}

// allocAll allocates len(offs) objects of size bytes, or none.
func (p *Pool) allocAll(offs []int64, size int64) bool {
	for j := range offs {
		off, ok := p.alloc.Alloc(size)
		if !ok {
			for _, o := range offs[:j] {
				p.alloc.Release(o, size)
			}
			return false
		}
		offs[j] = off
	}
	return true
}

// holds returns the record of r when r's write lock is still the record's,
// else nilRec (expired, aborted, published, or the slot recycled).
func (p *Pool) holds(r Reservation, now int64) int32 {
	i := r.rec
	if i < 0 || int(i) >= len(p.t.recs) {
		return nilRec
	}
	rec := &p.t.recs[i]
	if rec.state != stateWrite || rec.lock != r.lock || r.lock == 0 || p.expire(i, now) {
		return nilRec
	}
	return i
}

// FinishWrite publishes a batch of reservations: they become ready and
// readable, all of them or none. It answers false, publishes nothing and
// frees every reservation of the batch it still holds when any of them was
// overtaken: aborted, expired, or cleared (a Clear dooms a reservation in
// flight; its slot may be written by a late worker but is never published).
func (p *Pool) FinishWrite(rs []Reservation) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	ok := true
	for _, r := range rs {
		if i := p.holds(r, now); i == nilRec || p.t.recs[i].doomed {
			ok = false
		}
	}
	if !ok {
		p.st.StaleFinishes++
		for _, r := range rs {
			if i := p.holds(r, now); i != nilRec {
				if !p.t.recs[i].doomed {
					p.lost(i, LossAborted)
				}
				p.drop(i)
			}
		}
		return false
	}
	for _, r := range rs {
		if i := p.holds(r, now); i != nilRec {
			p.unlock(i)
		}
	}
	return true
}

// AbortWrite drops the reservations it still holds and frees their space
// without ever publishing them; stale ones are ignored. It is for a holder
// that is done with the bytes (a load that stopped copying, slots never
// handed out); a holder that went away is Abandoned.
func (p *Pool) AbortWrite(rs []Reservation) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	for _, r := range rs {
		if i := p.holds(r, now); i != nilRec {
			if !p.t.recs[i].doomed {
				p.lost(i, LossAborted)
			}
			p.drop(i)
		} else {
			p.st.StaleFinishes++
		}
	}
}

// Abandon is how every holder that goes away without its own commit ends:
// its instance was unregistered, reaped, replaced by a new registration of
// its id or removed by the operator, or its transfer was given up. The
// reservations rs and read holds refs were handed to a worker that may still
// be copying, so their bytes are not freed: a reservation is doomed (never
// published, its FinishWrite answers false; invisible to lookups and new
// reservations) and keeps its bytes until its write TTL; a read hold stays
// in force until its read TTL, so eviction cannot reuse the bytes under the
// reader. Their charge moves to the abandoned owner, so a new worker under
// the same instance id starts with nothing charged. Stale entries are
// ignored. This is the one way a dropped owner ends its holds; AbortWrite
// and ReleaseRead are for holders that are done with the bytes.
func (p *Pool) Abandon(rs []Reservation, refs []ReadRef) {
	if len(rs) == 0 && len(refs) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.abandonLocked(rs, refs, p.now().UnixNano(), false)
}

// abandonLocked is Abandon with p.mu held; expired reports the doomed keys
// as LossExpired rather than LossAborted.
func (p *Pool) abandonLocked(rs []Reservation, refs []ReadRef, now int64, expired bool) {
	for _, r := range rs {
		i := p.holds(r, now)
		if i == nilRec {
			p.st.StaleFinishes++
			continue
		}
		if p.t.recs[i].detached {
			continue // abandoned already
		}
		if rec := &p.t.recs[i]; !rec.doomed {
			if expired {
				p.lost(i, LossExpired)
			} else {
				p.lost(i, LossAborted)
			}
			p.untree(i)
			rec.doomed = true
			p.t.doomed++
			p.t.doomedBytes += p.rounded(i)
		}
		// Nothing finds a reservation by key (commits and aborts carry the
		// handle), so the key leaves the index at once and may be stored
		// again in other bytes while these wait for their TTL.
		p.t.detach(i)
		p.recharge(i, AbandonedOwner())
		p.st.AbandonedWrites++
	}
	for _, ref := range refs {
		if p.heldBy(ref, now) == nilRec {
			p.st.StaleFinishes++
			continue
		}
		p.st.AbandonedReads++
	}
}

// recharge moves record i's lock charge to owner o.
func (p *Pool) recharge(i int32, o Owner) {
	r := &p.t.recs[i]
	if p.ownerSlots[r.owner].owner == o {
		return
	}
	n := p.rounded(i)
	p.uncharge(r.owner, n)
	r.owner = p.charge(o, n)
}

// ReserveReadPrefix takes count read locks for the server's own readers
// (LookupOwner) on each leading readable key of ks (count > 1 for MLA, where
// several workers read one object), stopping at the first key that is
// absent, write-locked or doomed, or whose lock would pass a lock cap. It
// returns how many keys it locked. Locked keys move to the MRU end and their
// read TTL restarts.
func (p *Pool) ReserveReadPrefix(ks []keys.ObjectKey, count int) int {
	n, _ := p.reserveReadPrefix(LookupOwner(), ks, count)
	return n
}

// ReserveLookup is ReserveReadPrefix for the LOOKUP of one request of
// peer (its ZMQ routing id): the read-lock eras it starts are charged to
// that request (RequestOwner), so a scheduler that looks several prompts up
// before retrieving them is capped per prompt and by the total cap, not by
// one owner's share; and a peer under its share of the lookups' cap gets
// room from peers past theirs (lookupshare.go). refused says that a lock
// cap, not a miss, stopped it.
func (p *Pool) ReserveLookup(peer, request string, ks []keys.ObjectKey, count int) (n int, refused bool) {
	return p.reserveReadPrefix(RequestOwner(peer, request), ks, count)
}

func (p *Pool) reserveReadPrefix(owner Owner, ks []keys.ObjectKey, count int) (int, bool) {
	if count <= 0 {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	reclaimed := false
	for n, k := range ks {
		i := p.lookup(k, now)
		if i == nilRec || p.t.recs[i].state != stateReady || p.t.recs[i].doomed {
			p.st.ReadMisses++
			return n, false
		}
		r := &p.t.recs[i]
		if !r.readLocked() {
			// A new read-lock era, charged to the owner that starts it.
			unit := p.rounded(i)
			if !reclaimed && owner.Kind == OwnerLookup && !p.capFits(owner, unit) {
				// Once a call: room for the rest of ks, taken from the
				// peers past their share (lookupshare.go).
				reclaimed = true
				p.reclaimLookups(owner, int64(len(ks)-n)*unit, now)
			}
			if err := p.capRefusal(owner, unit, now); err != nil {
				if p.logCap(err, now) && p.readCapRefused != nil {
					p.readCapRefused(err.Error())
				}
				return n, true
			}
			r.owner = p.charge(owner, unit)
			r.lock = p.newLock()
			p.t.readLocked++
			p.t.locked[i] = struct{}{}
		} else if owner.Kind == OwnerLookup && p.ownerSlots[r.owner].owner.Peer != owner.Peer {
			r.shared = true
		}
		r.readers = uint32(min(uint64(r.readers)+uint64(count), math.MaxUint32))
		p.t.reheap(i) // a read-locked object is no eviction candidate
		r.deadline = now + int64(p.readTTL)
		p.t.touch(i)
		p.st.ReadHits++
	}
	return len(ks), false
}

// endIfUnlocked ends record i's read-lock era once no lock of either kind
// is left (a doomed record goes with it).
func (p *Pool) endIfUnlocked(i int32) {
	r := &p.t.recs[i]
	if r.readLocked() {
		return
	}
	r.readers = 1 // so that unlock (directly or via drop) ends the era and uncharges it
	if r.doomed {
		p.drop(i)
		return
	}
	p.unlock(i)
}

// FinishRead releases count anonymous read locks on each key (never below
// zero), doomed objects included: the locks the scheduler's lookups took
// and no worker has held. Held locks (HoldRead) are not touched.
func (p *Pool) FinishRead(ks []keys.ObjectKey, count int) {
	if count <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	for _, k := range ks {
		i := p.lookup(k, now)
		if i == nilRec {
			continue
		}
		if r := &p.t.recs[i]; r.state == stateReady && r.readers > 0 {
			r.readers -= uint32(min(uint64(count), uint64(r.readers)))
			p.endIfUnlocked(i)
		}
	}
}

// HoldRead takes one of the anonymous read locks on k for a worker and
// returns where the object lives and the ReadRef that releases the hold;
// ok is false for objects that are absent, write-locked or without an
// anonymous read lock left. A doomed object is found: its lock was taken
// before the Clear, and its bytes stay in place until that lock ends.
func (p *Pool) HoldRead(k keys.ObjectKey) (ReadRef, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := p.lookup(k, p.now().UnixNano())
	if i == nilRec {
		return ReadRef{}, false
	}
	r := &p.t.recs[i]
	if r.state != stateReady || r.readers == 0 || r.holds == math.MaxUint32 {
		return ReadRef{}, false
	}
	r.readers--
	r.holds++
	return ReadRef{Offset: r.off, Length: r.length, rec: i, lock: r.lock}, true
}

// heldBy returns the record whose hold ref still is, else nilRec (the era
// ended: released, expired, or the record recycled).
func (p *Pool) heldBy(ref ReadRef, now int64) int32 {
	i := ref.rec
	if i < 0 || int(i) >= len(p.t.recs) {
		return nilRec
	}
	r := &p.t.recs[i]
	if r.state != stateReady || r.holds == 0 || ref.lock == 0 || r.lock != ref.lock || p.expire(i, now) || r.holds == 0 {
		return nilRec
	}
	return i
}

// Held reports whether ref's hold is still in force: its read-lock era has
// not ended (released, expired, dropped after a Clear, record recycled), so
// the object's bytes at ref are still the ones held. A reader that uses the
// bytes for long (a tier writer streaming them to a file) asks before it
// makes the result visible.
func (p *Pool) Held(ref ReadRef) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.heldBy(ref, p.now().UnixNano()) != nilRec
}

// ReleaseRead releases the holds of refs (the worker's read is done). A
// ref whose read-lock era ended is stale and ignored: a late release never
// takes a lock another reader holds.
func (p *Pool) ReleaseRead(refs []ReadRef) { p.endHolds(refs, false) }

// ReturnRead gives the holds of refs back as anonymous read locks, unused
// (a test's look that must not take the lock). Stale refs are ignored.
func (p *Pool) ReturnRead(refs []ReadRef) { p.endHolds(refs, true) }

// endHolds ends the holds of refs that are still in force; unused turns
// each back into a read lock, otherwise the lock ends with the hold.
func (p *Pool) endHolds(refs []ReadRef, unused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	for _, ref := range refs {
		i := p.heldBy(ref, now)
		if i == nilRec {
			p.st.StaleFinishes++
			continue
		}
		p.t.recs[i].holds--
		if unused {
			p.t.recs[i].readers++
		} else {
			p.endIfUnlocked(i)
		}
	}
}

// IsLocked reports whether k is present and locked in any way (write,
// read or held), doomed or not; for diagnostics and tests.
func (p *Pool) IsLocked(k keys.ObjectKey) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := p.lookup(k, p.now().UnixNano())
	if i == nilRec {
		return false
	}
	r := &p.t.recs[i]
	return r.state == stateWrite || r.readLocked()
}

// Touch moves the present keys to the MRU end.
func (p *Pool) Touch(ks []keys.ObjectKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	for _, k := range ks {
		if i := p.lookup(k, now); i != nilRec && !p.t.recs[i].doomed {
			p.t.refresh(i)
		}
	}
}

// Delete removes the unlocked keys of ks and returns how many it removed;
// locked keys are skipped.
func (p *Pool) Delete(ks []keys.ObjectKey) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	n := 0
	for _, k := range ks {
		if i := p.lookup(k, now); i != nilRec && p.t.recs[i].state == stateReady && !p.t.recs[i].readLocked() {
			p.lost(i, LossCleared)
			p.drop(i)
			n++
		}
	}
	return n
}

// Clear drops every unlocked object and returns how many objects were live
// (doomed ones from an earlier Clear not counted). Locked objects become
// doomed: invisible to lookups and reservations, their space kept until
// their commit, abort, release or TTL ends the lock (see the table comment).
func (p *Pool) Clear() int {
	n, _ := p.ClearCounted()
	return n
}

// ClearCounted is Clear that also returns the bytes (sizes rounded up to
// the alignment) of the objects it counted, for an operator's report.
func (p *Pool) ClearCounted() (objects int, bytes int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sweep(p.now().UnixNano()) // expired reservations are already absent
	n, b := p.t.len()-p.t.doomed, p.t.bytes-p.t.doomedBytes
	p.cleared()
	if len(p.t.locked) == 0 {
		p.alloc.Reset()
		p.t.init() // fresh maps: a cleared pool gives its table memory back
		return n, b
	}
	for i := range p.t.recs {
		r := &p.t.recs[i]
		switch {
		case r.state == stateFree || r.doomed:
		case r.state == stateWrite || r.readLocked():
			p.untree(int32(i))
			r.doomed = true
			p.t.doomed++
			p.t.doomedBytes += p.rounded(int32(i))
		default:
			p.drop(int32(i))
		}
	}
	return n, b
}
