package misses

import (
	"math/bits"

	"kvdock/core/keys"
)

// Pool is what the Classifier asks of the L1 pool (*l1.Pool answers it).
type Pool interface {
	// Unreadable returns which of the first 64 keys of ks are not
	// readable now: bit j for ks[j].
	Unreadable(ks []keys.ObjectKey) uint64
	// StoredElsewhere reports whether k's chunk is readable under another
	// world size of k's model and salt.
	StoredElsewhere(k *keys.ObjectKey) bool
}

// Classifier says why chunks missed, from what the pool answers of them and
// the ghost's record of the keys the pool lost or refused. It is safe for
// concurrent use and allocates nothing.
type Classifier struct {
	pool  Pool
	ghost *Ghost
}

// NewClassifier returns a classifier over pool and the ghost its losses are
// noted in.
func NewClassifier(pool Pool, ghost *Ghost) *Classifier {
	return &Classifier{pool: pool, ghost: ghost}
}

// ClassifyMisses adds to c the reason each chunk of ks missed: ks holds per
// keys a chunk, chunk-major, as a LOOKUP asks them (a trailing partial chunk
// is ignored). A chunk whose keys are all readable missed for the lookup's
// own reason, stored: AfterMiss (an earlier chunk missed) or Refused (a lock
// cap stopped the lookup); otherwise its first unreadable key is judged: the
// ghost's reason if it has one, OtherLayout if the chunk is readable for
// another world size of the same model and salt, else NeverStored.
func (cl *Classifier) ClassifyMisses(ks []keys.ObjectKey, per int, stored Reason, c *Counts) {
	if per <= 0 {
		return
	}
	chunks := len(ks) / per
	ks = ks[:chunks*per]
	judged, last := 0, -1
	for from := 0; from < len(ks); from += 64 {
		for m := cl.pool.Unreadable(ks[from:]); m != 0; m &= m - 1 {
			i := from + bits.TrailingZeros64(m)
			if ch := i / per; ch != last { // the chunk's first unreadable key
				last = ch
				c[cl.why(&ks[i])]++
				judged++
			}
		}
	}
	c[stored] += uint64(chunks - judged)
}

// why judges one key that is not readable.
func (cl *Classifier) why(k *keys.ObjectKey) Reason {
	if r, ok := cl.ghost.Find(cl.ghost.DigestKey(k)); ok {
		return r
	}
	if cl.pool.StoredElsewhere(k) {
		return OtherLayout
	}
	return NeverStored
}
