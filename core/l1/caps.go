// Caps and charging: what each owner's locks hold against the per-owner and
// total caps, and the refusals when a lock would pass them.

package l1

import (
	"fmt"
)

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
