package kvevents

import (
	"testing"

	"kvdock/core/keys"
)

// BenchmarkTrackerStoreCommitEvict is the data path's cost with the stream
// on, per chunk: the observer's Stored, the commit hook and the observer's
// Lost of a 16-chunk store of 256-token chunks. The publisher's flush (the
// encoding, on its own goroutine) runs every 64 stores outside the timer.
func BenchmarkTrackerStoreCommitEvict(b *testing.B) {
	const chunks, size = 16, 256
	tr := New(Options{BlockSize: size})
	c := Commit{Model: "m", Objects: 1, Tokens: make([]uint32, chunks*size)}
	for i := range chunks {
		var h keys.Hash
		h[0], h[31] = byte(i), byte(i)
		c.Hashes = append(c.Hashes, h)
		c.Keys = append(c.Keys, keys.ObjectKey{Chunk: h, Model: "m"})
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for k := range c.Keys {
			tr.Stored(&c.Keys[k])
		}
		tr.Commit(c)
		for k := range c.Keys {
			tr.Lost(&c.Keys[k])
		}
		if i%64 == 63 {
			b.StopTimer()
			tr.Flush()
			b.StartTimer()
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chunks), "ns/chunk")
}

// BenchmarkTrackerFlush is the publisher's cost per batch: the encoding of
// one 16-chunk store's BlockStored and its BlockRemoved.
func BenchmarkTrackerFlush(b *testing.B) {
	const chunks, size = 16, 256
	tr := New(Options{BlockSize: size})
	c := Commit{Model: "m", Objects: 1, Tokens: make([]uint32, chunks*size)}
	for i := range chunks {
		var h keys.Hash
		h[0], h[31] = byte(i), byte(i)
		c.Hashes = append(c.Hashes, h)
		c.Keys = append(c.Keys, keys.ObjectKey{Chunk: h, Model: "m"})
	}
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for k := range c.Keys {
			tr.Stored(&c.Keys[k])
		}
		tr.Commit(c)
		for k := range c.Keys {
			tr.Lost(&c.Keys[k])
		}
		b.StartTimer()
		tr.Flush()
	}
}
