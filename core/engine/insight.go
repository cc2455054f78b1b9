package engine

import (
	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/misses"
	"kvdock/core/whatif"
)

// insight is the pool's observer: what happens to objects feeds the what-if
// curve (the estimator's Stored, Cleared and Tick) and the ghost that
// remembers why keys were lost, which the miss classifier reads.
type insight struct {
	*whatif.Estimator
	ghost *misses.Ghost
}

// Lost notes in the ghost why k went. An aborted write was never readable:
// a lookup of its key missed because it was never stored, so it is not noted.
func (o insight) Lost(k *keys.ObjectKey, _ int64, why l1.Loss) {
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
