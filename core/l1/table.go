package l1

import (
	"fmt"
	"math"

	"kvdock/core/keys"
)

// The object table is laid out for a small Go heap at millions of objects:
// a map from a 40-byte identity (chunk hash, interned model+salt, rank) to an
// index into a slice of fixed-size records; the LRU list is intrusive
// (indices in the records); only locked objects sit in an extra set.

const (
	stateFree  uint8 = iota // slot on the free list
	stateWrite              // write-locked: reserved, being written, not readable
	stateReady              // published; readable; read-locked while readers > 0
)

const nilRec = -1

// ident is an ObjectKey with the model and salt strings interned.
type ident struct {
	chunk keys.Hash
	name  uint32 // index into table.names
	rank  uint32
}

type record struct {
	id         ident
	off        int64
	length     int64 // requested size; the allocation is rounded up to Align
	deadline   int64 // unix ns: expiry of the write lock or of the read locks
	prev, next int32 // LRU neighbours (prev towards MRU); next links free slots
	readers    uint32
	state      uint8
}

type nameKey struct{ model, salt string }

type table struct {
	index    map[ident]int32
	recs     []record
	freeRec  int32
	mru, lru int32
	locked   map[int32]struct{}
	names    map[nameKey]uint32
	nameList []nameKey
	nameRefs []uint32
	nameFree []uint32

	writeLocked, readLocked int
}

func (t *table) init() {
	*t = table{
		index:   make(map[ident]int32),
		freeRec: nilRec,
		mru:     nilRec,
		lru:     nilRec,
		locked:  make(map[int32]struct{}),
		names:   make(map[nameKey]uint32),
	}
}

func (t *table) len() int { return len(t.index) }

// find returns the record index of k, or nilRec.
func (t *table) find(k keys.ObjectKey) int32 {
	n, ok := t.names[nameKey{k.Model, k.Salt}]
	if !ok {
		return nilRec
	}
	i, ok := t.index[ident{k.Chunk, n, k.KVRank}]
	if !ok {
		return nilRec
	}
	return i
}

// add creates a write-locked record at the MRU end.
func (t *table) add(k keys.ObjectKey, off, length, deadline int64) int32 {
	nk := nameKey{k.Model, k.Salt}
	n, ok := t.names[nk]
	if !ok {
		if l := len(t.nameFree); l > 0 {
			n = t.nameFree[l-1]
			t.nameFree = t.nameFree[:l-1]
			t.nameList[n] = nk
		} else {
			n = uint32(len(t.nameList))
			t.nameList = append(t.nameList, nk)
			t.nameRefs = append(t.nameRefs, 0)
		}
		t.names[nk] = n
	}
	t.nameRefs[n]++
	var i int32
	if t.freeRec != nilRec {
		i = t.freeRec
		t.freeRec = t.recs[i].next
	} else {
		t.recs = append(t.recs, record{})
		i = int32(len(t.recs) - 1)
	}
	id := ident{k.Chunk, n, k.KVRank}
	t.recs[i] = record{id: id, off: off, length: length, deadline: deadline, prev: nilRec, next: nilRec, state: stateWrite}
	t.index[id] = i
	t.pushMRU(i)
	t.locked[i] = struct{}{}
	t.writeLocked++
	return i
}

// remove drops record i from every structure; the caller frees its space.
func (t *table) remove(i int32) {
	r := &t.recs[i]
	switch {
	case r.state == stateWrite:
		t.writeLocked--
		delete(t.locked, i)
	case r.readers > 0:
		t.readLocked--
		delete(t.locked, i)
	}
	delete(t.index, r.id)
	t.unlink(i)
	n := r.id.name
	if t.nameRefs[n]--; t.nameRefs[n] == 0 {
		delete(t.names, t.nameList[n])
		t.nameList[n] = nameKey{}
		t.nameFree = append(t.nameFree, n)
	}
	*r = record{state: stateFree, prev: nilRec, next: t.freeRec}
	t.freeRec = i
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
}

func (t *table) touch(i int32) {
	if t.mru != i {
		t.unlink(i)
		t.pushMRU(i)
	}
}

// drop removes record i and frees its space.
func (p *Pool) drop(i int32) {
	r := p.t.recs[i]
	p.t.remove(i)
	p.alloc.Release(r.off, r.length)
}

// expire applies the TTLs to record i at time now: an expired write lock
// drops the object (it reports true: the object is gone), expired read locks
// reset the reader count.
func (p *Pool) expire(i int32, now int64) bool {
	r := &p.t.recs[i]
	if r.deadline > now {
		return false
	}
	switch {
	case r.state == stateWrite:
		p.drop(i)
		p.st.ExpiredWriteLocks++
		return true
	case r.readers > 0:
		r.readers = 0
		p.t.readLocked--
		delete(p.t.locked, i)
		p.st.ExpiredReadLocks++
	}
	return false
}

// sweep expires every locked object whose TTL has passed.
func (p *Pool) sweep(now int64) {
	for i := range p.t.locked {
		p.expire(i, now)
	}
}

// evictOne drops the least recently used unlocked object; false when every
// object is locked.
func (p *Pool) evictOne(now int64) bool {
	for i := p.t.lru; i != nilRec; {
		prev := p.t.recs[i].prev
		if r := &p.t.recs[i]; r.state == stateReady && (r.readers == 0 || r.deadline <= now) {
			p.drop(i)
			p.st.Evictions++
			return true
		}
		i = prev
	}
	return false
}

// lookup finds k and applies its TTLs; nilRec when absent or expired.
func (p *Pool) lookup(k keys.ObjectKey, now int64) int32 {
	i := p.t.find(k)
	if i == nilRec || p.expire(i, now) {
		return nilRec
	}
	return i
}

// ReserveWrite reserves, write-locked, every key of ks that is absent (mode
// "new"; present keys are skipped), each of size bytes. The new keys are
// reserved all together or not at all: when they do not fit, the policy's
// unlocked objects are evicted on demand (LRU first); if they still do not
// fit the result is ErrNoSpace and nothing is reserved. Reservations are in
// key order; duplicate keys are reserved once.
func (p *Pool) ReserveWrite(ks []keys.ObjectKey, size int64) ([]Reservation, error) {
	if size <= 0 {
		return nil, fmt.Errorf("l1: object size %d bytes, want > 0", size)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	var fresh []int // indices into ks
	for i, k := range ks {
		if p.lookup(k, now) != nilRec || dupBefore(ks, fresh, i) {
			p.st.WriteExisting++
			continue
		}
		fresh = append(fresh, i)
	}
	if len(fresh) == 0 {
		return nil, nil
	}
	unit := p.alloc.Round(size)
	if unit > p.alloc.Size()/int64(len(fresh)) {
		p.st.AllocFailures++
		return nil, fmt.Errorf("%w: %d objects of %d bytes exceed the pool of %d bytes", ErrNoSpace, len(fresh), size, p.alloc.Size())
	}
	offs := make([]int64, len(fresh))
	if p.alloc.Free() < unit*int64(len(fresh)) || !p.allocAll(offs, size) {
		p.sweep(now) // expired locks give space back before anything is evicted
		if !p.allocAll(offs, size) && !p.evictAndAlloc(offs, size, now) {
			p.st.AllocFailures++
			return nil, fmt.Errorf("%w: %d objects of %d bytes, %d bytes free", ErrNoSpace, len(fresh), size, p.alloc.Free())
		}
	}
	deadline := now + int64(p.writeTTL)
	res := make([]Reservation, len(fresh))
	for j, i := range fresh {
		p.t.add(ks[i], offs[j], size, deadline)
		res[j] = Reservation{Index: i, Key: ks[i], Offset: offs[j], Length: size}
	}
	p.st.WriteReservations += uint64(len(fresh))
	return res, nil
}

// evictAndAlloc evicts unlocked objects in LRU order until allocAll
// succeeds. It evicts nothing when the policy is noop or when free space
// plus every unlocked object could not hold the batch, so a batch that
// cannot fit does not empty the cache on its way to failing.
func (p *Pool) evictAndAlloc(offs []int64, size int64, now int64) bool {
	if p.policy != PolicyLRU {
		return false
	}
	var locked int64
	for i := range p.t.locked {
		locked += p.alloc.Round(p.t.recs[i].length)
	}
	need := p.alloc.Round(size) * int64(len(offs))
	used := p.alloc.Size() - p.alloc.Free()
	if p.alloc.Free()+used-locked < need {
		return false
	}
	for p.alloc.Free() < need {
		if !p.evictOne(now) {
			return false
		}
	}
	for !p.allocAll(offs, size) {
		if !p.evictOne(now) {
			return false
		}
	}
	return true
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

// dupBefore reports whether ks[i] equals a key already chosen in fresh.
func dupBefore(ks []keys.ObjectKey, fresh []int, i int) bool {
	for _, j := range fresh {
		if ks[j] == ks[i] {
			return true
		}
	}
	return false
}

// FinishWrite publishes write-locked keys: they become ready and readable.
// Keys in any other state, or whose write lock expired, are ignored.
func (p *Pool) FinishWrite(ks []keys.ObjectKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	for _, k := range ks {
		if i := p.lookup(k, now); i != nilRec && p.t.recs[i].state == stateWrite {
			p.t.recs[i].state = stateReady
			p.t.writeLocked--
			delete(p.t.locked, i)
		}
	}
}

// AbortWrite drops write-locked keys and frees their space without ever
// publishing them.
func (p *Pool) AbortWrite(ks []keys.ObjectKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	for _, k := range ks {
		if i := p.lookup(k, now); i != nilRec && p.t.recs[i].state == stateWrite {
			p.drop(i)
		}
	}
}

// ReserveReadPrefix takes count read locks on each leading readable key of
// ks (count > 1 for MLA, where several workers read one object), stopping at
// the first key that is absent or write-locked. It returns how many keys it
// locked. Locked keys move to the MRU end and their read TTL restarts.
func (p *Pool) ReserveReadPrefix(ks []keys.ObjectKey, count int) int {
	if count <= 0 {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	for n, k := range ks {
		i := p.lookup(k, now)
		if i == nilRec || p.t.recs[i].state != stateReady {
			p.st.ReadMisses++
			return n
		}
		r := &p.t.recs[i]
		if r.readers == 0 {
			p.t.readLocked++
			p.t.locked[i] = struct{}{}
		}
		r.readers = uint32(min(uint64(r.readers)+uint64(count), math.MaxUint32))
		r.deadline = now + int64(p.readTTL)
		p.t.touch(i)
		p.st.ReadHits++
	}
	return len(ks)
}

// FinishRead releases count read locks on each key (never below zero).
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
		r := &p.t.recs[i]
		if r.state != stateReady || r.readers == 0 {
			continue
		}
		r.readers -= uint32(min(uint64(count), uint64(r.readers)))
		if r.readers == 0 {
			p.t.readLocked--
			delete(p.t.locked, i)
		}
	}
}

// Locate returns where a read-locked object lives; ok is false for objects
// that are absent, write-locked or not read-locked.
func (p *Pool) Locate(k keys.ObjectKey) (off, length int64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := p.lookup(k, p.now().UnixNano())
	if i == nilRec {
		return 0, 0, false
	}
	r := &p.t.recs[i]
	if r.state != stateReady || r.readers == 0 {
		return 0, 0, false
	}
	return r.off, r.length, true
}

// Touch moves the present keys to the MRU end.
func (p *Pool) Touch(ks []keys.ObjectKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	for _, k := range ks {
		if i := p.lookup(k, now); i != nilRec {
			p.t.touch(i)
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
		if i := p.lookup(k, now); i != nilRec && p.t.recs[i].state == stateReady && p.t.recs[i].readers == 0 {
			p.drop(i)
			n++
		}
	}
	return n
}

// Clear drops every object, locked or not, and returns how many there were.
func (p *Pool) Clear() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sweep(p.now().UnixNano()) // expired reservations are already absent
	n := p.t.len()
	p.alloc.Reset()
	p.t.init() // fresh maps: a cleared pool gives its table memory back
	return n
}
