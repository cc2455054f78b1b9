// Reads: a prefix reserved read-locked, the holds a worker takes on its
// locks, and their release.

package l1

import (
	"math"

	"kvdock/core/keys"
)

// ReserveReadPrefix takes count read locks for the server's own readers
// (LookupOwner) on each leading readable key of ks (count > 1 for MLA, where
// several workers read one object), stopping at the first key that is
// absent, write-locked or doomed, or whose lock would pass a lock cap. It
// returns how many keys it locked. Locked keys move to the MRU end and their
// read TTL restarts.
func (p *Pool) ReserveReadPrefix(ks []keys.ObjectKey, count int) int {
	n, _ := p.reserveReadPrefix(LookupOwner(), ks, count, true)
	return n
}

// PinRead is ReserveReadPrefix for the server's own copies out of the pool
// (the tiers' write-behind): the locks are the same, but the pin is not a
// use. It ticks no request clock, restamps no order and counts no read
// hit: a chunk written behind just after its store would otherwise look
// reused at once, a gap of a few requests, to the prefix policy.
func (p *Pool) PinRead(ks []keys.ObjectKey, count int) int {
	n, _ := p.reserveReadPrefix(LookupOwner(), ks, count, false)
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
	return p.reserveReadPrefix(RequestOwner(peer, request), ks, count, true)
}

// reserveReadPrefix locks ks's leading readable keys; use says the lock is
// a worker's use of them (PinRead's is not).
func (p *Pool) reserveReadPrefix(owner Owner, ks []keys.ObjectKey, count int, use bool) (int, bool) {
	if count <= 0 {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if use {
		p.t.clk.Begin() // one tick for the request (nextuse)
		defer p.t.clk.End()
	}
	now := p.now().UnixNano()
	reclaimed := false
	for n, k := range ks {
		i := p.lookup(k, now)
		if i == nilRec || p.t.recs[i].state != stateReady || p.t.recs[i].doomed {
			if use {
				p.st.ReadMisses++
			}
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
		if use {
			p.t.touch(i)
			p.st.ReadHits++
		}
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

// Rehold takes one more hold on each object refs still hold, all or none:
// the returned refs keep the objects in place while their bytes are copied
// out, even if the holds refs stand for end meanwhile (another reader's
// commit, an unregister, a drop). False, and none, when any of refs no
// longer holds its object. The new holds end with ReleaseRead, or at the
// objects' lock deadline like every hold (Held tells).
func (p *Pool) Rehold(refs []ReadRef) ([]ReadRef, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	for _, ref := range refs {
		if i := p.heldBy(ref, now); i == nilRec || p.t.recs[i].holds == math.MaxUint32 {
			return nil, false
		}
	}
	out := make([]ReadRef, len(refs))
	for j, ref := range refs {
		p.t.recs[ref.rec].holds++
		out[j] = ref
	}
	return out, true
}

// HeldAll is Held for every ref of refs.
func (p *Pool) HeldAll(refs []ReadRef) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	for _, ref := range refs {
		if p.heldBy(ref, now) == nilRec {
			return false
		}
	}
	return true
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
