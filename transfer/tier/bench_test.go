package tier_test

import (
	"context"
	"testing"

	"kvdock/core/keys"
	"kvdock/core/layout"
	"kvdock/transfer/tier"
	"kvdock/transfer/tier/memtier"
)

// BenchmarkPrefetch loads 64 chunks of 1 MiB from an in-memory tier into L1
// (header check, reservation, copy, lock) per op; SetBytes makes -bench
// report the rate beside the memcpy reference below.
func BenchmarkPrefetch(b *testing.B) {
	lay, err := layout.New(16, 256, 64, "float16", false) // 1 MiB
	if err != nil {
		b.Fatal(err)
	}
	const chunks = 64
	p := openPoolB(b, 2*chunks*lay.Bytes)
	mt := memtier.New()
	var ks []keys.ObjectKey
	for i := range chunks {
		k := testKey(i)
		v, _ := tier.Encode(tier.Key(k, lay), lay, payload(int(lay.Bytes), i))
		mt.Set(tier.Key(k, lay), v)
		ks = append(ks, k)
	}
	s := tier.NewSet([]tier.Backend{mt}, p, fakeLayouts{lay}, tier.Options{})
	defer s.Close()
	b.SetBytes(chunks * lay.Bytes)
	for b.Loop() {
		if n := s.Prefetch(context.Background(), "m", 1, ks, 1, 1); n != chunks {
			b.Fatalf("prefetched %d", n)
		}
		p.FinishRead(ks, 1)
		p.Clear()
	}
}

// BenchmarkMemcpyReference copies the same bytes once, the reference.
func BenchmarkMemcpyReference(b *testing.B) {
	src := make([]byte, 64<<20)
	dst := make([]byte, 64<<20)
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		copy(dst, src)
	}
}
