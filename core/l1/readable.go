package l1

import (
	"kvdock/core/keys"
	"kvdock/core/misses"
)

// Why a lookup missed: the pool notes in its ghost (package misses) every
// key it drops by eviction, write-lock expiry, clear or delete, and every
// key whose store it refuses; ClassifyMisses reads the ghost and the table.
// The table also keeps, per interned (model, salt) name, the set of world
// sizes it holds objects for, so a missed key can be looked for under the
// other world sizes of the same model (their keys differ in the rank, and
// their layouts may differ: such chunks can never be shared).

// maxLayoutProbes bounds the table probes one missed chunk costs when the
// other world sizes of its model are searched.
const maxLayoutProbes = 256

// wsSet is a set of world sizes 0..255.
type wsSet [4]uint64

func (s *wsSet) add(ws uint32)          { s[ws>>6&3] |= 1 << (ws & 63) }
func (s *wsSet) has(ws uint32) bool     { return s[ws>>6&3]&(1<<(ws&63)) != 0 }
func rankWorldSize(rank uint32) uint32  { return rank >> 24 & 0xff }
func (p *Pool) ghostKey(i int32) uint64 { return p.ghostDigest(&p.t.recs[i].id) }

func (p *Pool) ghostDigest(id *ident) uint64 {
	nk := p.t.nameList[id.name]
	return p.ghost.Digest(&id.chunk, nk.model, nk.salt, id.rank, id.group)
}

// note records in the ghost why record i is about to go.
func (p *Pool) note(i int32, r misses.Reason) { p.ghost.Note(p.ghostKey(i), r) }

// noteKeys records that the stores of ks were refused, at most the ghost's
// capacity of them (more would only overwrite each other).
func (p *Pool) noteKeys(ks []keys.ObjectKey, r misses.Reason) {
	for _, k := range ks[:min(len(ks), p.ghost.Entries())] {
		p.ghost.Note(p.ghost.Digest(&k.Chunk, k.Model, k.Salt, k.KVRank, k.Group), r)
	}
}

// noteRefused records the keys of ks at indices idx as refused.
func (p *Pool) noteRefused(ks []keys.ObjectKey, idx []int) {
	for _, i := range idx[:min(len(idx), p.ghost.Entries())] {
		k := &ks[i]
		p.ghost.Note(p.ghost.Digest(&k.Chunk, k.Model, k.Salt, k.KVRank, k.Group), misses.Refused)
	}
}

// noteCleared records as cleared the most recently used records, up to the
// ghost's capacity, oldest first so that the newest survive in the ghost.
func (p *Pool) noteCleared() {
	i, n := p.t.mru, 1
	if i == nilRec {
		return
	}
	for n < p.ghost.Entries() && p.t.recs[i].next != nilRec {
		i = p.t.recs[i].next
		n++
	}
	for ; i != nilRec; i = p.t.recs[i].prev {
		if !p.t.recs[i].doomed { // a doomed record was noted by its own clear
			p.note(i, misses.Cleared)
		}
	}
}

// Ghost returns the capacity in keys and the memory of the pool's record
// of lost keys.
func (p *Pool) Ghost() (entries int, bytes int64) { return p.ghost.Entries(), p.ghost.Bytes() }

// readable returns record i's index when k is present, published and not
// doomed, else nilRec.
func (p *Pool) readable(k keys.ObjectKey, now int64) int32 {
	i := p.lookup(k, now)
	if i == nilRec || p.t.recs[i].state != stateReady || p.t.recs[i].doomed {
		return nilRec
	}
	return i
}

// ClassifyMisses adds to c the reason each chunk of ks missed: ks holds
// per keys a chunk, chunk-major, as a LOOKUP asks them. A chunk whose keys
// are all readable missed for the lookup's own reason, stored: AfterMiss
// (an earlier chunk missed) or Refused (a lock cap stopped the lookup);
// otherwise its first unreadable key is judged: the ghost's reason if it
// has one, OtherLayout if the chunk is readable for another world size of
// the same model and salt, else NeverStored.
func (p *Pool) ClassifyMisses(ks []keys.ObjectKey, per int, stored misses.Reason, c *misses.Counts) {
	if per <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now().UnixNano()
	for from := 0; from+per <= len(ks); from += per {
		r := stored
		for j := from; j < from+per; j++ {
			if p.readable(ks[j], now) == nilRec {
				r = p.whyMissing(&ks[j], now)
				break
			}
		}
		c[r]++
	}
}

// whyMissing judges one key that is not readable.
func (p *Pool) whyMissing(k *keys.ObjectKey, now int64) misses.Reason {
	if r, ok := p.ghost.Find(p.ghost.Digest(&k.Chunk, k.Model, k.Salt, k.KVRank, k.Group)); ok {
		return r
	}
	if p.storedElsewhere(k, now) {
		return misses.OtherLayout
	}
	return misses.NeverStored
}

// storedElsewhere reports whether k's chunk is readable under another world
// size of k's model and salt (any of its ranks, within maxLayoutProbes).
func (p *Pool) storedElsewhere(k *keys.ObjectKey, now int64) bool {
	n, ok := p.t.names[nameKey{k.Model, k.Salt}]
	if !ok {
		return false
	}
	own := rankWorldSize(k.KVRank)
	set := &p.t.nameWS[n]
	probes := 0
	for ws := uint32(1); ws < 256; ws++ {
		if ws == own || !set.has(ws) {
			continue
		}
		for w := range ws {
			if probes++; probes > maxLayoutProbes {
				return false
			}
			i, ok := p.t.index[ident{k.Chunk, n, keys.KVRank(int(ws), int(w)), k.Group}]
			if ok && !p.expire(i, now) && p.t.recs[i].state == stateReady && !p.t.recs[i].doomed {
				return true
			}
		}
	}
	return false
}

// ExpireWrite is Abandon for reservations whose worker never committed in
// time (the transfer module gives a pending store up before the pool's write
// TTL would): the bytes stay until that TTL, since the worker may still be
// copying, and the keys are noted as expired, not as never stored.
func (p *Pool) ExpireWrite(rs []Reservation) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.abandonLocked(rs, nil, p.now().UnixNano(), true)
}
