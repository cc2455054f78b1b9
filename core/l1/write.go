// Writes: a reservation (space found or made by eviction, write-locked),
// then its finish (published), abort, or abandon (the owner went away).

package l1

import (
	"fmt"
	"slices"

	"kvdock/core/keys"
	"kvdock/core/l1/nextuse"
)

// ReserveWrite reserves for owner, write-locked, every key of ks that is
// absent (mode "new"; present keys are skipped, and so are keys of cleared
// objects still locked by a transfer), each of size bytes. The new keys are
// reserved all together or not at all, admission aside (below): when they do not fit, the policy's
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
//
// Under the prefix policy a store that must evict is admitted one chunk
// after another while the policy's victim may go for it (nextuse.Admits):
// at the first chunk that may not, it and the rest of the prompt's tail
// are refused (a chunk past a missing one could not be reached) and the
// result holds the reservations of the leading chunks only, no error
// (Stats.AdmissionRefusals). A store that fits in free space is never
// refused.
func (p *Pool) ReserveWrite(owner Owner, ks []keys.ObjectKey, size int64) ([]Reservation, error) {
	return p.reserveWrite(owner, nil, ks, size, true)
}

// ReserveLoad is ReserveWrite for one object a lookup is about to read
// (a tier's load into L1): admission never refuses it.
func (p *Pool) ReserveLoad(owner Owner, k keys.ObjectKey, size int64) ([]Reservation, error) {
	return p.reserveWrite(owner, nil, []keys.ObjectKey{k}, size, false)
}

// ReserveWriteAfter is ReserveWrite for keys that continue a prompt: prev
// are the keys of the chunk before ks's first (its ranks and groups, as
// ks's are laid out), whose records become the parents of ks's first
// chunk. A prev not resident leaves that chunk without a parent: not
// usable, since no LOOKUP can reach it, until prev is stored again.
func (p *Pool) ReserveWriteAfter(owner Owner, prev, ks []keys.ObjectKey, size int64) ([]Reservation, error) {
	return p.reserveWrite(owner, prev, ks, size, true)
}

func (p *Pool) reserveWrite(owner Owner, prev, ks []keys.ObjectKey, size int64, admit bool) ([]Reservation, error) {
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
	p.t.clk.Begin() // one tick for the request (nextuse)
	defer p.t.clk.End()
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
		if admit && p.policy == PolicyPrefix {
			n := p.admitLeading(prev, ks, fresh, unit)
			fresh, offs = fresh[:n], offs[:n]
		}
		ok := len(fresh) == 0 || p.allocAll(offs, size) || p.evictBenchAndAlloc(offs, size, now) || p.evictAndAlloc(offs, size, now)
		p.pinPrompt(prev, ks, false)
		if !ok {
			p.st.AllocFailures++
			p.refused(ks, fresh, unit)
			return nil, fmt.Errorf("%w: %d objects of %d bytes, %d bytes free", ErrNoSpace, len(fresh), size, p.alloc.Free())
		}
	}
	if len(fresh) == 0 { // all refused (admitLeading)
		p.chainAfter(prev, ks)
		return nil, nil
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

// admitLeading makes room, for the prefix policy, for the chunks of fresh
// (indices into ks, in prompt order) one chunk (its ranks and groups)
// after another, evicting the policy's victims while each may go for
// them (nextuse.Admits): the new chunks would be due back a gap from now,
// the gap of the resident chunk before the first of them (the prompt just
// looked up), or the mean for a new prompt, which may not evict a hot
// chunk. It returns how many of fresh are admitted: at the first chunk
// that is not, the rest of the prompt's tail is refused. p.mu is held and
// the store's prompt pinned.
func (p *Pool) admitLeading(prev, ks []keys.ObjectKey, fresh []int, unit int64) int {
	var gap uint64
	var before *keys.ObjectKey
	switch {
	case fresh[0] > 0:
		before = &ks[fresh[0]-1]
	case len(prev) > 0:
		before = &prev[0]
	}
	if before != nil {
		if i := p.t.find(*before); i != nilRec {
			gap = p.t.recs[i].ord.Gap
		}
	}
	newPrompt := gap == 0
	if newPrompt {
		gap = p.t.clk.Prior(p.t.len())
	}
	due := p.t.clk.Now + gap
	if p.t.blru != nilRec {
		return len(fresh) // benchmark objects go first (evictBenchAndAlloc)
	}
	for j := 0; j < len(fresh); {
		e := j + 1
		for e < len(fresh) && ks[fresh[e]].Chunk == ks[fresh[j]].Chunk {
			e++
		}
		for p.alloc.Free() < unit*int64(e) {
			v := p.t.victim()
			if v == nilRec {
				return len(fresh) // the store's own path fits it or fails
			}
			if !nextuse.Admits(&p.t.recs[v].ord, p.t.clk.Now, due, newPrompt) {
				p.st.AdmissionRefusals += uint64(len(fresh) - j)
				return j
			}
			if p.evictLeaf() == 0 {
				return len(fresh)
			}
		}
		j = e
	}
	return len(fresh)
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
