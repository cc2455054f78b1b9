package l1

// Transfers carried across a restart. A worker whose PREPARE_STORE or
// PREPARE_RETRIEVE the previous process answered sends its COMMIT to the
// next one; the restart record carries the pending transfer, and the
// successor's transfer module claims its reservations or read holds here,
// once, before it serves anything, so the commit publishes (or releases)
// exactly what the worker was given.

// ClaimWrites hands the adopted live write reservations at offs (KeptObject
// Live) to owner, in order, charging their bytes to it. It claims all or
// none: false when any offset holds no such reservation (never adopted,
// expired, or claimed already); the unclaimed ones end at their deadline.
func (p *Pool) ClaimWrites(owner Owner, offs []int64) ([]Reservation, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	at := p.lockedAt(offs)
	recs := make([]int32, len(offs))
	for j, off := range offs {
		i, ok := at[off]
		if !ok {
			return nil, false
		}
		r := &p.t.recs[i]
		if !r.carried || r.state != stateWrite || r.doomed || r.detached || r.lock == 0 || r.deadline <= now {
			return nil, false
		}
		if j > 0 && recs[j-1] == i {
			return nil, false // one reservation named twice
		}
		recs[j] = i
	}
	res := make([]Reservation, len(offs))
	for j, i := range recs {
		r := &p.t.recs[i]
		r.carried = false
		p.recharge(i, owner)
		res[j] = Reservation{Index: j, Key: p.keyOf(i), Offset: r.off, Length: r.length, rec: i, lock: r.lock}
	}
	return res, true
}

// ClaimHolds returns the ReadRefs of workers' read holds carried on the
// published objects at offs (KeptObject Holds), for the worker's
// COMMIT_RETRIEVE to release; false, and none, when any offset holds no
// such object. A ref beyond the holds recorded is stale at its release.
func (p *Pool) ClaimHolds(offs []int64) ([]ReadRef, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	at := p.lockedAt(offs)
	refs := make([]ReadRef, len(offs))
	for j, off := range offs {
		i, ok := at[off]
		if !ok {
			return nil, false
		}
		r := &p.t.recs[i]
		if r.state != stateReady || r.holds == 0 || r.lock == 0 || r.deadline <= now {
			return nil, false
		}
		refs[j] = ReadRef{Offset: r.off, Length: r.length, rec: i, lock: r.lock}
	}
	return refs, true
}

// lockedAt maps the offsets of offs to the claimable records adopted
// there (see claimable); p.mu is held.
func (p *Pool) lockedAt(offs []int64) map[int64]int32 {
	at := make(map[int64]int32, len(offs))
	for _, off := range offs {
		if i, ok := p.claimable[off]; ok && int(i) < len(p.t.recs) && p.t.recs[i].off == off {
			at[off] = i
		}
	}
	return at
}

// EndClaims ends the claims: a carried reservation nobody claimed is then
// abandoned as any reservation whose holder went away (doomed, out of the
// key index, its bytes kept until its deadline: a worker may still write
// into them), so a new store of its key is served at once; unclaimed
// holds end at their deadline. The index of claimable records is freed.
func (p *Pool) EndClaims() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for off, i := range p.claimable {
		if int(i) >= len(p.t.recs) {
			continue
		}
		r := &p.t.recs[i]
		if r.off != off || !r.carried {
			continue
		}
		r.carried = false
		if r.state == stateWrite && !r.doomed {
			p.t.detach(i)
			r.doomed = true
			p.t.doomed++
			p.t.doomedBytes += p.rounded(i)
		}
	}
	p.claimable = nil
}
