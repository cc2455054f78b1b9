package l1

import (
	"fmt"

	"kvdock/core/keys"
)

// Benchmark traffic is kept apart. `kvdock bench` run against a live
// server stores under models named keys.BenchModelPrefix+…; the pool keeps
// their objects on a list of their own (LRU order among them) and holds
// them to three rules, so that a benchmark cannot cost the real workers a
// hit:
//
//   - a benchmark batch fits in the room below the eviction watermark that
//     other models' objects leave (its own bounded share); it makes room by
//     evicting benchmark objects only, and is refused with
//     ErrBenchRoom (an ErrNoSpace) when that is not enough;
//   - any other batch that needs room evicts benchmark objects first;
//   - the eviction loop, at the watermark, evicts benchmark objects first.
//
// A peer that names its model so only confines itself.

// ErrBenchRoom means a benchmark batch does not fit in the room below the
// eviction watermark that other models' objects leave. It wraps ErrNoSpace.
var ErrBenchRoom = fmt.Errorf("%w for benchmark traffic", ErrNoSpace)

func (t *table) pushBenchMRU(i int32) {
	r := &t.recs[i]
	r.bprev, r.bnext = nilRec, t.bmru
	if t.bmru != nilRec {
		t.recs[t.bmru].bprev = i
	}
	t.bmru = i
	if t.blru == nilRec {
		t.blru = i
	}
}

func (t *table) unlinkBench(i int32) {
	r := &t.recs[i]
	if r.bprev != nilRec {
		t.recs[r.bprev].bnext = r.bnext
	} else {
		t.bmru = r.bnext
	}
	if r.bnext != nilRec {
		t.recs[r.bnext].bprev = r.bprev
	} else {
		t.blru = r.bprev
	}
	r.bprev, r.bnext = nilRec, nilRec
}

// isBenchBatch reports whether ks is a benchmark model's batch (one
// request's keys share their model).
func isBenchBatch(ks []keys.ObjectKey) bool {
	return len(ks) > 0 && keys.IsBenchModel(ks[0].Model)
}

// benchCeiling is the most bytes the pool may use with benchmark objects
// in it: the eviction watermark, which the eviction loop acts at.
func (p *Pool) benchCeiling() int64 {
	return int64(p.watermark * float64(p.alloc.Size()))
}

// evictBenchOne evicts the least recently used evictable benchmark object;
// false when there is none.
func (p *Pool) evictBenchOne(now int64) bool {
	for i := p.t.blru; i != nilRec; i = p.t.recs[i].bprev {
		if p.evictable(i, now) {
			p.evict(i)
			return true
		}
	}
	return false
}

// benchRoom makes room for a benchmark batch of need bytes (len(offs)
// objects of size) below the ceiling, evicting benchmark objects only, and
// allocates it. It evicts nothing when the batch could not fit even with
// every evictable benchmark object gone.
func (p *Pool) benchRoom(offs []int64, size, need, now int64) error {
	used := p.alloc.Size() - p.alloc.Free()
	others := used - p.t.benchBytes
	var evictable int64
	for i := p.t.blru; i != nilRec; i = p.t.recs[i].bprev {
		if p.evictable(i, now) {
			evictable += p.rounded(i)
		}
	}
	ceiling := p.benchCeiling()
	if used-evictable+need > ceiling {
		return fmt.Errorf("%w: %d bytes; other models use %d of the %d bytes below the eviction watermark (%.0f%% of %d) and benchmark objects %d more (%d of them in use), and a benchmark never evicts another model's chunks",
			ErrBenchRoom, need, others, ceiling, p.watermark*100, p.alloc.Size(), p.t.benchBytes, p.t.benchBytes-evictable)
	}
	for p.alloc.Size()-p.alloc.Free()+need > ceiling && p.evictBenchOne(now) {
	}
	for !p.allocAll(offs, size) {
		if !p.evictBenchOne(now) {
			return fmt.Errorf("%w: %d bytes do not fit the pool's free extents without evicting another model's chunks", ErrBenchRoom, need)
		}
	}
	return nil
}

// evictBenchAndAlloc evicts benchmark objects, least recently used first,
// until allocAll succeeds (true) or none is left.
func (p *Pool) evictBenchAndAlloc(offs []int64, size, now int64) bool {
	for p.t.blru != nilRec {
		if !p.evictBenchOne(now) {
			return false
		}
		if p.allocAll(offs, size) {
			return true
		}
	}
	return false
}

// evictBenchBelowWatermark is the eviction loop's first step: benchmark
// objects go until the pool is below the watermark; it returns how many.
func (p *Pool) evictBenchBelowWatermark(now int64) int {
	n := 0
	for float64(p.alloc.Size()-p.alloc.Free()) >= p.watermark*float64(p.alloc.Size()) && p.evictBenchOne(now) {
		n++
	}
	return n
}
