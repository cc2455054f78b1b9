package l1

import "kvdock/core/keys"

// Admission (TinyLFU): how often each chunk is asked for, estimated by a
// count-min sketch of 4-bit counters, so that a store that must evict
// admits a new chunk only while it is asked for at least as often as the
// leaf it would push out (docs/BENCHMARKS.md). A lookup counts the chunks it
// hits, a store the chunks it is asked to store (the ones that missed), so
// a prompt counts each of its chunks once.
//
// The sketch has freqRows rows of freqWidth counters per record slot,
// rounded up to a power of two (8 bytes a record slot, bounded by the
// table whatever a peer asks: a store's batch fits the pool); a row that
// wide keeps most estimates exact (one counter per slot was over by a
// collision often enough to matter: the what-if, which counts exactly, was
// 7 points off on long-context chat). Every counter is halved once the
// counts added reach freqAge times the record slots (so rounded), so an
// estimate is a recent rate.

const (
	freqRows  = 4
	freqWidth = 4
	freqAge   = 10
)

// sketch is the count-min sketch; its zero value is empty and counts
// nothing until sized.
type sketch struct {
	words []uint64 // freqRows rows of width 4-bit counters, 16 a word
	mask  uint64   // width - 1
	added uint64   // counts added since the last halving
}

// size makes the sketch n counters a row: past its width it
// doubles, each new counter starting at the one it was folded into (a
// count-min estimate stays an upper bound).
func (s *sketch) size(n int) {
	w := s.mask + 1
	if s.words == nil {
		w = 32
	}
	if uint64(n) <= w && s.words != nil {
		return
	}
	for w < max(uint64(n), 64) {
		w *= 2
	}
	old, om := s.words, s.mask
	s.words, s.mask = make([]uint64, freqRows*w/16), w-1
	if old == nil {
		return
	}
	for r := range uint64(freqRows) {
		for c := range w {
			o := r*(om+1) + c&om
			v := (old[o/16] >> (o % 16 * 4)) & 15
			d := r*w + c
			s.words[d/16] |= v << (d % 16 * 4)
		}
	}
}

// slot returns the word and the shift of row r's counter of chunk h.
func (s *sketch) slot(h *keys.Hash, r int) (int, uint) {
	var a, b uint64
	for i := range 8 {
		a = a<<8 | uint64(h[i])
		b = b<<8 | uint64(h[8+i])
	}
	c := (a + uint64(r)*(b|1)) & s.mask
	c += uint64(r) * (s.mask + 1)
	return int(c / 16), uint(c%16) * 4
}

// add counts one request for chunk h.
func (s *sketch) add(h *keys.Hash) {
	if s.words == nil {
		return
	}
	for r := range freqRows {
		w, sh := s.slot(h, r)
		if (s.words[w]>>sh)&15 < 15 {
			s.words[w] += 1 << sh
		}
	}
	if s.added++; s.added >= freqAge*(s.mask+1)/freqWidth {
		for i := range s.words {
			s.words[i] = (s.words[i] >> 1) & 0x7777777777777777
		}
		s.added /= 2
	}
}

// estimate is chunk h's count: the least of its counters.
func (s *sketch) estimate(h *keys.Hash) uint64 {
	if s.words == nil {
		return 0
	}
	e := uint64(15)
	for r := range freqRows {
		w, sh := s.slot(h, r)
		e = min(e, (s.words[w]>>sh)&15)
	}
	return e
}

// countAsked counts the chunks of ks, keys in prompt order (a chunk's
// ranks and groups one after another), once each.
func (s *sketch) countAsked(ks []keys.ObjectKey) {
	for j := range ks {
		if j == 0 || ks[j].Chunk != ks[j-1].Chunk {
			s.add(&ks[j].Chunk)
		}
	}
}

// asked counts the chunks of ks[:n] for the prefix policy's admission
// and returns n; p.mu is held.
func (p *Pool) asked(ks []keys.ObjectKey, n int) int {
	if p.policy == PolicyPrefix && n > 0 {
		p.t.freq.size(freqWidth * (len(p.t.recs) + n))
		p.t.freq.countAsked(ks[:n])
	}
	return n
}

// admitLeading makes room, for the prefix policy, for the chunks of fresh
// (indices into ks, in prompt order) one chunk after another, evicting the
// policy's victims while each new chunk is asked for at least as often as
// the victim it would push out, or the victim is late (nextuse: a
// conversation that ended, a question never asked again, whose count says
// what it was, not what it will be). It returns how many of fresh are
// admitted: with the first chunk that is not, the rest of the prompt's
// tail is refused, since a chunk past a missing one could not be reached.
// p.mu is held and the store's prompt pinned.
func (p *Pool) admitLeading(ks []keys.ObjectKey, fresh []int, unit int64) int {
	s := &p.t.freq
	for j := 0; j < len(fresh); {
		h := &ks[fresh[j]].Chunk
		e := j + 1
		for e < len(fresh) && ks[fresh[e]].Chunk == *h {
			e++
		}
		for p.alloc.Free() < unit*int64(e) {
			v := p.t.victim()
			if v == nilRec {
				return len(fresh) // the store's own path fails or fits
			}
			late := p.t.recs[v].ord.LateAt() < p.t.clk.Now
			if !late && s.estimate(h) < s.estimate(&p.t.recs[v].id.chunk) {
				p.st.AdmissionRefusals += uint64(len(fresh) - j)
				return j
			}
			if p.evictLeaf() == 0 {
				return len(fresh)
			}
		}
		j = e
	}
	return len(fresh)
}
