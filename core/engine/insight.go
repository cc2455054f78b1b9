package engine

import (
	"kvdock/core/keys"
	"kvdock/core/kvevents"
	"kvdock/core/l1"
	"kvdock/core/misses"
	"kvdock/core/whatif"
)

// insight is the pool's observer: what happens to objects feeds the what-if
// curve (the estimator's Stored, Cleared and Tick), the ghost that
// remembers why keys were lost, which the miss classifier reads, and, when
// the KV event stream is on, the announced set routers see (kv, nil when
// off: the data path's whole cost is that check).
type insight struct {
	*whatif.Estimator
	ghost *misses.Ghost
	kv    *kvevents.Tracker
}

// Stored tells the estimator and the event stream of a new object.
func (o insight) Stored(k *keys.ObjectKey, bytes int64) {
	o.Estimator.Stored(k, bytes)
	if o.kv != nil {
		o.kv.Stored(k)
	}
}

// Cleared tells the estimator and the event stream of a Clear.
func (o insight) Cleared() {
	o.Estimator.Cleared()
	if o.kv != nil {
		o.kv.Cleared()
	}
}

// Lost notes in the ghost why k went. An aborted write was never readable:
// a lookup of its key missed because it was never stored, so it is not noted.
func (o insight) Lost(k *keys.ObjectKey, _ int64, why l1.Loss) {
	if o.kv != nil {
		o.kv.Lost(k)
	}
	var r misses.Reason
	switch why {
	case l1.LossEvicted:
		r = misses.Evicted
	case l1.LossExpired:
		r = misses.Expired
	case l1.LossCleared:
		r = misses.Cleared
	case l1.LossRefused:
		r = misses.Refused
	default:
		return
	}
	o.ghost.Note(o.ghost.DigestKey(k), r)
}
