// Package chainbench holds the benchmarks' yardstick for the chained key
// hash: the exact bytes the chain hashes and a paired timing against raw
// BLAKE3 over them, so a benchmark reports its cost as a multiple of the
// hashing floor instead of a machine-dependent duration.
package chainbench

import (
	"encoding/binary"
	"time"

	"github.com/zeebo/blake3"
)

// Messages returns the byte strings the chain hashes for tokens: previous
// digest (none before the first chunk) || chunk tokens as big-endian uint32,
// one per digest in hs, each chunk cs tokens long. It is generic so that the
// keys package's own tests can use it without an import cycle.
func Messages[H ~[32]byte](hs []H, none H, cs int, tokens []uint32) [][]byte {
	msgs := make([][]byte, len(hs))
	for i := range hs {
		prev := none
		if i > 0 {
			prev = hs[i-1]
		}
		m := append([]byte(nil), prev[:]...)
		for _, t := range tokens[i*cs : (i+1)*cs] {
			m = binary.BigEndian.AppendUint32(m, t)
		}
		msgs[i] = m
	}
	return msgs
}

// PairedRatio runs op and one raw BLAKE3 pass over msgs (one Sum256 per
// chain message, the floor for a chained hash of those bytes) alternately k
// times, k clamped to [20, 200], and returns time(op)/time(raw). Pairing the
// two keeps the ratio steady on a shared machine, where separate runs drift
// apart.
func PairedRatio(k int, op func(int), msgs [][]byte) float64 {
	k = min(max(k, 20), 200)
	var tOp, tRaw time.Duration
	var sink [32]byte
	for j := range k {
		t0 := time.Now()
		op(j)
		t1 := time.Now()
		for _, m := range msgs {
			sink = blake3.Sum256(m)
		}
		tRaw += time.Since(t1)
		tOp += t1.Sub(t0)
	}
	_ = sink
	return float64(tOp) / float64(tRaw)
}
