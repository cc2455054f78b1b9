package keys

import (
	"testing"

	"kvdock/core/testkit/chainbench"
)

// chainMessages returns the exact byte strings the chain hashes for tokens.
func chainMessages(h *Hasher, tokens []uint32) [][]byte {
	return chainbench.Messages(h.Hashes(tokens), NoneHash(), h.ChunkSize(), tokens)
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
	b.ReportMetric(chainbench.PairedRatio(b.N, func(int) { _ = h.Hashes(tokens) }, msgs), "x-raw-blake3")
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
