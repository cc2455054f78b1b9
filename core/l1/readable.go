package l1

import (
	"kvdock/core/keys"
)

// What the pool answers about readability, for whoever says why a lookup
// missed (package misses): which keys are readable now, and whether a chunk
// is stored under another world size or layout of its model. The table
// keeps, per interned (model, salt, layout) name, the set of world sizes it
// holds objects for, and per (model, salt) its names (one per layout), so a
// missed key can be looked for under the other world sizes and layouts of
// the same model (their keys differ in the rank or the layout ID: such
// chunks can never be shared).

// maxLayoutProbes bounds the table probes one StoredElsewhere costs.
const maxLayoutProbes = 256

// wsSet is a set of world sizes 0..255.
type wsSet [4]uint64

func (s *wsSet) add(ws uint32)         { s[ws>>6&3] |= 1 << (ws & 63) }
func (s *wsSet) has(ws uint32) bool    { return s[ws>>6&3]&(1<<(ws&63)) != 0 }
func rankWorldSize(rank uint32) uint32 { return rank >> 24 & 0xff }

// readable returns record i's index when k is present, published and not
// doomed, else nilRec.
func (p *Pool) readable(k keys.ObjectKey, now int64) int32 {
	i := p.lookup(k, now)
	if i == nilRec || p.t.recs[i].state != stateReady || p.t.recs[i].doomed {
		return nilRec
	}
	return i
}

// Unreadable returns which of the first 64 keys of ks are not readable now
// (absent, being written, or cleared while locked): bit j for ks[j]. Keys
// past the 64th are not looked at.
func (p *Pool) Unreadable(ks []keys.ObjectKey) uint64 {
	ks = ks[:min(len(ks), 64)]
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	var m uint64
	for j := range ks {
		if p.readable(ks[j], now) == nilRec {
			m |= 1 << j
		}
	}
	return m
}

// StoredElsewhere reports whether k's chunk is readable under another world
// size or layout of k's model and salt (any of its ranks, within
// maxLayoutProbes).
func (p *Pool) StoredElsewhere(k *keys.ObjectKey) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	own := rankWorldSize(k.KVRank)
	probes := 0
	for _, n := range p.t.layoutNames[modelSalt{k.Model, k.Salt}] {
		set := &p.t.nameWS[n]
		ownLayout := p.t.nameList[n].layout == k.Layout
		for ws := uint32(1); ws < 256; ws++ {
			if (ownLayout && ws == own) || !set.has(ws) {
				continue
			}
			for w := range ws {
				if probes++; probes > maxLayoutProbes {
					return false
				}
				i := p.t.index.find(p.t.recs, &ident{k.Chunk, n, keys.KVRank(int(ws), int(w)), k.Group})
				if i != nilRec && !p.expire(i, now) && p.t.recs[i].state == stateReady && !p.t.recs[i].doomed {
					return true
				}
			}
		}
	}
	return false
}

// ExpireWrite is Abandon for reservations whose worker never committed in
// time (the transfer module gives a pending store up before the pool's write
// TTL would): the bytes stay until that TTL, since the worker may still be
// copying, and the keys are lost as expired (LossExpired), not aborted.
func (p *Pool) ExpireWrite(rs []Reservation) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.abandonLocked(rs, nil, p.now().UnixNano(), true)
}
