package segment

import (
	"testing"
	"time"
)

// BenchmarkPrivateVsAnonymousCopy compares the memory behind a pickle-mode
// pool before private segments (anonymous) and now (a private segment):
// the copies into the pool (store) and out of it (retrieve) are the part
// of a pickle transfer the memory can change. Both 256 MiB mappings have
// every page touched first, as the prefault does; each iteration copies a
// 4 MiB chunk into and out of both in turn, so the two see the same load,
// and reports the private segment's rate over the anonymous one's
// (private/anon_*, 1 = the same) beside the private rates.
func BenchmarkPrivateVsAnonymousCopy(b *testing.B) {
	const size, chunk = 256 << 20, 4 << 20
	open := func(o Options) []byte {
		s, err := Open(o)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close() })
		mem := s.Bytes()
		for i := 0; i < len(mem); i += 4096 {
			mem[i] = 1
		}
		return mem
	}
	anon := open(Options{Size: size})
	o := Options{Size: size, Private: PrivateName(b.Name(), 1), Dir: shmDir(b)}
	private := open(o)
	buf := make([]byte, chunk)
	for i := range buf {
		buf[i] = byte(i)
	}
	timed := func(f func()) time.Duration {
		t0 := time.Now()
		f()
		return time.Since(t0)
	}
	// in[0], out[0]: anonymous; in[1], out[1]: private.
	var in, out [2]time.Duration
	mems := [2][]byte{anon, private}
	off, n := 0, 0
	b.SetBytes(4 * chunk)
	for b.Loop() {
		// Each goes first every other time: the first copy after a
		// change of direction finds the caches in another state.
		first := n % 2
		for _, k := range []int{first, 1 - first} {
			in[k] += timed(func() { copy(mems[k][off:off+chunk], buf) })
		}
		for _, k := range []int{first, 1 - first} {
			out[k] += timed(func() { copy(buf, mems[k][off:off+chunk]) })
		}
		off = (off + chunk) % size
		n++
	}
	anonIn, privIn, anonOut, privOut := in[0], in[1], out[0], out[1]
	gbps := func(d time.Duration) float64 { return float64(b.N) * chunk / d.Seconds() / 1e9 }
	b.ReportMetric(anonIn.Seconds()/privIn.Seconds(), "private/anon_store")
	b.ReportMetric(anonOut.Seconds()/privOut.Seconds(), "private/anon_retrieve")
	b.ReportMetric(gbps(privIn), "private_store_GB/s")
	b.ReportMetric(gbps(privOut), "private_retrieve_GB/s")
}
