package segment

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkPrivateVsAnonymousCopy compares the memory behind a pickle-mode
// pool before private segments (anonymous) and now (a private segment):
// the copies into the pool (store) and out of it (retrieve) are the part
// of a pickle transfer the memory can change. The 256 MiB mappings, every
// page touched first as the prefault does, are a private segment, the
// anonymous mapping the pool had, and one in transparent huge pages (what
// that mapping gets on a host with THP "always"). Each iteration copies a
// 4 MiB chunk into and out of each in turn, the order rotating, so all see
// the same load; it reports the private segment's rate over the others'
// (private/anon_*, private/anon_thp_*; 1 = the same).
func BenchmarkPrivateVsAnonymousCopy(b *testing.B) {
	const size, chunk = 256 << 20, 4 << 20
	touch := func(mem []byte) []byte {
		for i := 0; i < len(mem); i += 4096 {
			mem[i] = 1
		}
		return mem
	}
	open := func(o Options) []byte {
		s, err := Open(o)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close() })
		return touch(s.Bytes())
	}
	private := open(Options{Size: size, Private: PrivateName(b.Name(), 1), Dir: shmDir(b)})
	anon := open(Options{Size: size})
	thp, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = unix.Munmap(thp) })
	if err := unix.Madvise(thp, unix.MADV_HUGEPAGE); err != nil {
		b.Skipf("no transparent huge pages here: %v", err)
	}
	touch(thp)
	mems := [3][]byte{private, anon, thp}
	buf := make([]byte, chunk)
	for i := range buf {
		buf[i] = byte(i)
	}
	var in, out [3]time.Duration
	off, n := 0, 0
	b.SetBytes(2 * int64(len(mems)) * chunk)
	for b.Loop() {
		// Each goes first in turn: the first copy after a change of
		// direction finds the caches in another state.
		for j := range mems {
			k := (n + j) % len(mems)
			t0 := time.Now()
			copy(mems[k][off:off+chunk], buf)
			in[k] += time.Since(t0)
		}
		for j := range mems {
			k := (n + j) % len(mems)
			t0 := time.Now()
			copy(buf, mems[k][off:off+chunk])
			out[k] += time.Since(t0)
		}
		off = (off + chunk) % size
		n++
	}
	b.ReportMetric(in[1].Seconds()/in[0].Seconds(), "private/anon_store")
	b.ReportMetric(out[1].Seconds()/out[0].Seconds(), "private/anon_retrieve")
	b.ReportMetric(in[2].Seconds()/in[0].Seconds(), "private/anon_thp_store")
	b.ReportMetric(out[2].Seconds()/out[0].Seconds(), "private/anon_thp_retrieve")
}
