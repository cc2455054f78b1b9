package whatif

import "sync/atomic"

// filter lets Stored, under prompt sampling, tell without the mutex that
// an object is not in the sample: a key enters the sample only through a
// lookup (insert), which sets a bit for its spatial hash here. A clear bit
// means absent; a set one may be stale (the key left) or shared, and only
// costs the mutex. Bits are at least 32 a slot and the filter is rebuilt
// from the live keys once the bits set reach twice the slots (amortised
// O(1) an insert), so a key out of the sample finds its bit set at most
// about once in 16 (TestPromptSamplingFilterPassesSampledKeys: 4 %).
type filter struct {
	bits []atomic.Uint64
	mask uint64 // bits-1: the bit of a hash is its low bits
	set  int    // bits set since the build, under the estimator's mutex
}

// newFilter returns a filter sized for a stack of slots slots, holding the
// spatial hashes of st's live keys (nil: none).
func newFilter(slots int, st *stack) *filter {
	words := 1
	for words*64 < 32*slots {
		words *= 2
	}
	f := &filter{bits: make([]atomic.Uint64, words), mask: uint64(words*64 - 1)}
	if st != nil {
		for _, sp := range st.spat {
			if sp != 0 {
				f.add(sp)
			}
		}
	}
	return f
}

// add sets sp's bit; the caller holds the estimator's mutex.
func (f *filter) add(sp uint64) {
	i := sp & f.mask
	w, b := &f.bits[i>>6], uint64(1)<<(i&63)
	if w.Load()&b == 0 {
		w.Or(b)
		f.set++
	}
}

// has is false when no key of spatial hash sp entered the sample since
// the filter was built; safe without the mutex.
func (f *filter) has(sp uint64) bool {
	i := sp & f.mask
	return f.bits[i>>6].Load()&(uint64(1)<<(i&63)) != 0
}

// memory is the filter's footprint in bytes.
func (f *filter) memory() int64 { return int64(len(f.bits)) * 8 }
