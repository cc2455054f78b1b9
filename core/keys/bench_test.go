package keys

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/zeebo/blake3"
)

// chainMessages returns the exact byte strings the chain hashes for tokens:
// previous digest || chunk tokens, one per full chunk.
func chainMessages(h *Hasher, tokens []uint32) [][]byte {
	cs := h.ChunkSize()
	hs := h.Hashes(tokens)
	msgs := make([][]byte, len(hs))
	for i := range hs {
		prev := NoneHash()
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

// pairedRatio runs op and one raw BLAKE3 pass over msgs (one Sum256 per
// chain message, the floor for a chained hash of those bytes) alternately k
// times and returns time(op)/time(raw). Pairing the two keeps the ratio
// steady on a shared machine, where separate runs drift apart.
func pairedRatio(k int, op func(int), msgs [][]byte) float64 {
	k = min(max(k, 20), 200)
	var tOp, tRaw time.Duration
	var sink Hash
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

// BenchmarkHashes32k hashes a 32k-token prompt (128 chunks of 256).
func BenchmarkHashes32k(b *testing.B) {
	h := mustHasher(b, 256)
	tokens := seqTokens(32768, 1)
	msgs := chainMessages(h, tokens)
	b.SetBytes(int64(len(msgs) * len(msgs[0])))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		_ = h.Hashes(tokens)
	}
	b.StopTimer()
	b.ReportMetric(pairedRatio(b.N, func(int) { _ = h.Hashes(tokens) }, msgs), "x-raw-blake3")
}

// BenchmarkObjectKeys derives the scheduler keys of 128 chunks for 8 ranks.
func BenchmarkObjectKeys(b *testing.B) {
	hs := mustHasher(b, 256).Hashes(seqTokens(32768, 2))
	b.ReportAllocs()
	for b.Loop() {
		_ = ObjectKeys(hs, "meta-llama/Llama-3.1-8B", 8, nil, "tenant")
	}
	b.ReportMetric(float64(b.Elapsed())/float64(b.N)/float64(len(hs)*8), "ns/key")
}
