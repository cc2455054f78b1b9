package l1

import (
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
	ghosts      []ghost       // the chunks the prefix policy evicted (ghost.go)
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
	t.recs[i] = record{id: id, off: off, length: length, prev: nilRec, next: nilRec, bprev: nilRec, bnext: nilRec, state: stateReady, ord: nextuse.Stored(t.clk.Tick()),
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

// Touch moves the present keys to the MRU end.
func (p *Pool) Touch(ks []keys.ObjectKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.t.clk.Begin() // one tick for the request (nextuse)
	defer p.t.clk.End()
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
