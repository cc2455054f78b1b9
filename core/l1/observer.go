package l1

import "kvdock/core/keys"

// Observer is told what happens to the pool's objects, as groupcache's LRU
// tells OnEvicted: the engine wires it to what learns from the traffic (the
// what-if pool size curve, the record of why keys missed), so the pool
// imports none of them. The pool calls it with its mutex held: a method must
// return quickly, never block and never call back into the pool, and k is
// valid only during the call. bytes is the object's allocation, its size
// rounded up to the pool's alignment.
//
// Every object Stored is later reported Lost once, or ends with a Cleared.
type Observer interface {
	// Stored: the pool took in a new object under k, write-locked until
	// its commit.
	Stored(k *keys.ObjectKey, bytes int64)
	// Lost: the object under k left the pool, or its store was refused.
	Lost(k *keys.ObjectKey, bytes int64, why Loss)
	// Cleared: a Clear dropped every object. The most recently used of
	// them (up to Options.ObserveMax) follow as Lost with LossCleared,
	// oldest first.
	Cleared()
	// Tick: the eviction loop ran, with these settings (not under noop).
	Tick(watermark, ratio float64)
}

// Loss says why an object left the pool or never entered it.
type Loss uint8

// The losses.
const (
	// LossEvicted: the eviction policy dropped it to make room.
	LossEvicted Loss = iota + 1
	// LossExpired: its write lock's TTL passed before a commit, or the
	// transfer gave the store up (ExpireWrite).
	LossExpired
	// LossCleared: a Clear or a Delete dropped it.
	LossCleared
	// LossRefused: its store was refused, for space or by a lock cap.
	LossRefused
	// LossAborted: its write was aborted, overtaken or abandoned before a
	// commit; it was never readable.
	LossAborted
)

var lossNames = [...]string{"", "evicted", "expired", "cleared", "refused", "aborted"}

func (l Loss) String() string {
	if int(l) < len(lossNames) && l > 0 {
		return lossNames[l]
	}
	return "unknown"
}

// DefaultObserveMax bounds the objects one Clear or one refused batch
// reports one by one.
const DefaultObserveMax = 1 << 16

// objectKey is record i's key, built in p.key (no allocation): valid until
// the next call, under p.mu.
func (p *Pool) objectKey(i int32) *keys.ObjectKey {
	id := &p.t.recs[i].id
	nk := p.t.nameList[id.name]
	p.key = keys.ObjectKey{Chunk: id.chunk, Model: nk.model, Salt: nk.salt, KVRank: id.rank, Group: id.group, Layout: nk.layout}
	return &p.key
}

// lost tells the observer that record i is about to go for why.
func (p *Pool) lost(i int32, why Loss) {
	if p.obs != nil {
		p.obs.Lost(p.objectKey(i), p.rounded(i), why)
	}
}

// refused tells the observer that the stores of ks at indices idx (all of
// ks when idx is nil), of bytes each, were refused, at most ObserveMax.
func (p *Pool) refused(ks []keys.ObjectKey, idx []int, bytes int64) {
	if p.obs == nil {
		return
	}
	if idx == nil {
		for i := range ks[:min(len(ks), p.observeMax)] {
			p.obs.Lost(&ks[i], bytes, LossRefused)
		}
		return
	}
	for _, i := range idx[:min(len(idx), p.observeMax)] {
		p.obs.Lost(&ks[i], bytes, LossRefused)
	}
}

// cleared tells the observer of a Clear: the bulk event, then the most
// recently used records up to ObserveMax, oldest first so that an observer
// keeping a bounded record keeps the newest.
func (p *Pool) cleared() {
	if p.obs == nil {
		return
	}
	p.obs.Cleared()
	i, n := p.t.mru, 1
	if i == nilRec {
		return
	}
	for n < p.observeMax && p.t.recs[i].next != nilRec {
		i = p.t.recs[i].next
		n++
	}
	for ; i != nilRec; i = p.t.recs[i].prev {
		if !p.t.recs[i].doomed { // a doomed record was reported when it was doomed
			p.lost(i, LossCleared)
		}
	}
}
