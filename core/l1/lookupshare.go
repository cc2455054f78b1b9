package l1

import (
	"cmp"
	"slices"
)

// The lookups' cap (lookupCap) is shared fairly between the peers that
// hold lookup locks. A peer alone may use all of it (a scheduler that looks
// ten prompts up ahead needs 62.5 % of the pool), so nothing is refused
// while the cap has room. When a peer's lookup would pass the lookups' cap
// or the total cap while that peer holds less than its share (the cap over
// the peers holding lookup locks, itself included), the read-lock eras of
// the peers past their share are released, the least recently refreshed
// first, until the asking peer has room for its lookup or is at its share,
// and no peer is taken below its own share. So a peer that keeps 69 % of
// the pool looked up cannot starve another scheduler; it keeps its share.
//
// Only eras no worker holds are released (a hold is a copy under way): the
// next PREPARE_RETRIEVE for one of them misses, as after its read TTL. An
// era another peer's lookup also counts on (shared) goes only after the
// over-share peer's own eras, so a scheduler that found its chunks already
// locked by another peer does not lose them first.

// reclaimLookups makes room for need more bytes of lookup locks for o,
// within o's share, from the peers past theirs; p.mu is held. It does
// nothing when a sweep of expired locks makes room, or when o's peer is at
// its share already.
func (p *Pool) reclaimLookups(o Owner, need int64, now int64) {
	p.sweep(now)
	if p.capFits(o, min(need, p.alloc.Size())) {
		return
	}
	active := int64(len(p.lookupPeers))
	if _, ok := p.lookupPeers[o.Peer]; !ok {
		active++
	}
	share := p.lookupCap() / active
	// Never past o's share, nor past what its own cap leaves it.
	need = min(need, share-p.lookupPeers[o.Peer], p.ownerCap-p.ownerBytes(o))
	if need <= 0 {
		return
	}
	type era struct {
		rec      int32
		deadline int64
		shared   bool
	}
	var eras []era
	for i := range p.t.locked {
		r := &p.t.recs[i]
		if r.state != stateReady || r.holds > 0 || r.readers == 0 {
			continue
		}
		if ow := p.ownerSlots[r.owner].owner; ow.Kind == OwnerLookup && ow.Peer != o.Peer && p.lookupPeers[ow.Peer] > share {
			eras = append(eras, era{i, r.deadline, r.shared})
		}
	}
	slices.SortFunc(eras, func(a, b era) int {
		if a.shared != b.shared {
			if a.shared {
				return 1
			}
			return -1
		}
		return cmp.Or(cmp.Compare(a.deadline, b.deadline), cmp.Compare(a.rec, b.rec))
	})
	freed := int64(0)
	for _, e := range eras {
		if freed >= need {
			break
		}
		r := &p.t.recs[e.rec]
		peer := p.ownerSlots[r.owner].owner.Peer
		unit := p.rounded(e.rec)
		if p.lookupPeers[peer]-unit < share {
			continue // that peer is at its share
		}
		r.readers = 0
		p.endIfUnlocked(e.rec)
		freed += unit
		p.st.LookupReclaims++
	}
	if freed > 0 {
		p.log.Debug("l1 lookup locks released for a peer under its share", "bytes", freed, "share", share, "peers", active)
	}
}
