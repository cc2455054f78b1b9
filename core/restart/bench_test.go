package restart_test

import (
	"encoding/binary"
	"testing"
	"time"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/restart"
)

// keptPool returns a pool of n committed 4 KiB objects in prompts of four
// linked chunks, and its options (a segment under a directory of the test).
func keptPool(b *testing.B, n int) (*l1.Pool, l1.Options) {
	b.Helper()
	opts := l1.Options{Size: int64(n+64) * 4096 * 2, Align: 4096, OwnerLockShare: 1, TotalLockShare: 1,
		Plan: l1.Decision{Segment: l1.SegmentPrefix + "gapbench"}, ShmDir: b.TempDir(), WriteTTL: time.Minute, ReadTTL: time.Minute}
	p, err := l1.Open(opts)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < n; i += 4 {
		ks := make([]keys.ObjectKey, 0, 4)
		for j := i; j < min(i+4, n); j++ {
			var h keys.Hash
			binary.LittleEndian.PutUint64(h[:], uint64(j)+1)
			ks = append(ks, keys.ObjectKey{Chunk: h, Model: "meta-llama/Llama-3.1-8B", KVRank: keys.KVRank(1, 0), Salt: "tenant"})
		}
		res, err := p.ReserveWrite(l1.InstanceOwner(1), ks, 4096)
		if err != nil || len(res) != len(ks) {
			b.Fatalf("reserve %d: %v (%d)", i, err, len(res))
		}
		p.FinishWrite(res)
	}
	return p, opts
}

// BenchmarkRestartRecord64k times each step of a restart at 65,536
// objects: the pool's export, Encode, Decode and l1.Adopt (the segment
// itself is kept in place, as a restart does).
func BenchmarkRestartRecord64k(b *testing.B) {
	const n = 1 << 16
	p, opts := keptPool(b, n)
	var k l1.Kept
	if err := p.Keep(func(kept l1.Kept) error { k = kept; return nil }); err != nil {
		b.Fatal(err)
	}
	rec := restart.Record{Build: "bench", Endpoint: "127.0.0.1:1", StoppedAt: time.Now(), WrittenAt: time.Now(), Pool: k}
	data, err := restart.Encode(rec)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("Encode", func(b *testing.B) {
		for b.Loop() {
			if _, err := restart.Encode(rec); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(data)), "bytes")
	})
	b.Run("WriteTake", func(b *testing.B) {
		dir := b.TempDir()
		for b.Loop() {
			if err := restart.Write(dir, "state", rec); err != nil {
				b.Fatal(err)
			}
			if _, err := restart.Take(dir, "state"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("AdoptKeep", func(b *testing.B) {
		// Keep's export of the table after an adoption, with the adoption.
		r, _ := restart.Decode(data)
		for b.Loop() {
			q, _, err := l1.Adopt(opts, r.Pool)
			if err != nil {
				b.Fatal(err)
			}
			if err := q.Keep(func(k l1.Kept) error {
				if len(k.Objects) != n {
					b.Fatalf("kept %d objects", len(k.Objects))
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Decode", func(b *testing.B) {
		for b.Loop() {
			if r, err := restart.Decode(data); err != nil || len(r.Pool.Objects) != n {
				b.Fatalf("decode: %v, %d objects", err, len(r.Pool.Objects))
			}
		}
	})
	b.Run("Adopt", func(b *testing.B) {
		r, _ := restart.Decode(data)
		for b.Loop() {
			q, ad, err := l1.Adopt(opts, r.Pool)
			if err != nil || ad.Objects != n {
				b.Fatalf("adopt: %v, %d objects", err, ad.Objects)
			}
			if err := q.Keep(func(l1.Kept) error { return nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
}
