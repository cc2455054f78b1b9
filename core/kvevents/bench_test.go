package kvevents

import (
	"testing"

	"kvdock/core/keys"
)

// BenchmarkTrackerStoreCommitEvict is the data path's cost per chunk: the
// observer's Stored, the commit hook and the observer's Lost of a 16-chunk
// store of 256-token chunks, with the stream on ("stream"), the poll log
// alone (the default settings: "log") or both. The publisher's flush (the
// encoding, on its own goroutine) runs every 64 stores outside the timer.
func BenchmarkTrackerStoreCommitEvict(b *testing.B) {
	for _, bc := range []struct {
		name           string
		stream, logged bool
	}{{"stream", true, false}, {"log", false, true}, {"stream+log", true, true}} {
		b.Run(bc.name, func(b *testing.B) {
			const chunks, size = 16, 256
			opt := Options{BlockSize: size, NoStream: !bc.stream}
			if bc.logged {
				opt.Log = NewLog(DefaultLogSize, size, 1)
			}
			tr := New(opt)
			c := benchCommit(chunks, size)
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
		})
	}
}

// BenchmarkTrackerFlush is the publisher's cost per batch: the encoding of
// one 16-chunk store's BlockStored and its BlockRemoved.
func BenchmarkTrackerFlush(b *testing.B) {
	const chunks, size = 16, 256
	tr := New(Options{BlockSize: size})
	c := benchCommit(chunks, size)
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

// benchCommit is one prompt's store of chunks chunks of size tokens.
func benchCommit(chunks, size int) Commit {
	c := Commit{Model: "m", Objects: 1, Tokens: make([]uint32, chunks*size)}
	for i := range chunks {
		var h keys.Hash
		h[0], h[31] = byte(i), byte(i)
		c.Hashes = append(c.Hashes, h)
		c.Keys = append(c.Keys, keys.ObjectKey{Chunk: h, Model: "m"})
	}
	return c
}
