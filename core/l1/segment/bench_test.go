package segment

import (
	"slices"
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

// BenchmarkMmapDuringPrefault measures what a prefault costs the rest of
// the process: while 512 MiB of shared memory is populated (in the
// background, as after Open), the benchmark goroutine maps and unmaps
// 1 MiB of anonymous memory over and over, as a thread's stack or the Go
// heap growing does. It reports the longest and the 99th-percentile mmap,
// and the populate's time, for the prefault (populate, a fault a page:
// prefault_*) and for what it did before (MADV_POPULATE_WRITE over 64 MiB
// a call, which holds the memory map lock while it runs: madvise64m_*),
// each over pages just dropped (fresh, as at a first start: MADV_REMOVE)
// and over resident pages (as after an adoption: MADV_DONTNEED drops the
// mapping only), and the mmap alone (alone_*).
func BenchmarkMmapDuringPrefault(b *testing.B) {
	const size = 512 << 20
	s, err := Open(Options{Size: size, Private: PrivateName(b.Name(), 1), Dir: shmDir(b)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	mem := s.Bytes()
	mmaps := func(stop <-chan struct{}) []time.Duration {
		var out []time.Duration
		for {
			select {
			case <-stop:
				return out
			default:
			}
			t := time.Now()
			m, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
			if err != nil {
				b.Fatal(err)
			}
			_ = unix.Munmap(m)
			out = append(out, time.Since(t))
			if stop == nil && len(out) == 2000 {
				return out
			}
		}
	}
	madvise64m := func(mem []byte) {
		for off := 0; off < len(mem); off += 64 << 20 {
			if err := unix.Madvise(mem[off:min(off+64<<20, len(mem))], unix.MADV_POPULATE_WRITE); err != nil {
				b.Skipf("MADV_POPULATE_WRITE: %v", err)
			}
		}
	}
	type run struct {
		ds   []time.Duration
		took time.Duration
	}
	during := func(drop int, fill func([]byte)) run {
		if err := unix.Madvise(mem, drop); err != nil {
			b.Skipf("madvise %d: %v", drop, err)
		}
		stop := make(chan struct{})
		var took time.Duration
		go func() {
			t := time.Now()
			fill(mem)
			took = time.Since(t)
			close(stop)
		}()
		ds := mmaps(stop)
		<-stop
		return run{ds, took}
	}
	prefault := func(mem []byte) { populate(mem, prefaultStep, func(int) bool { return true }) }
	runs := map[string]*run{}
	add := func(name string, r run) {
		if runs[name] == nil {
			runs[name] = &run{}
		}
		runs[name].ds = append(runs[name].ds, r.ds...)
		runs[name].took += r.took
	}
	n := 0
	for b.Loop() {
		n++
		for _, d := range []struct {
			name string
			drop int
		}{{"fresh", unix.MADV_REMOVE}, {"resident", unix.MADV_DONTNEED}} {
			add("prefault_"+d.name, during(d.drop, prefault))
			add("madvise64m_"+d.name, during(d.drop, madvise64m))
		}
		add("alone", run{ds: mmaps(nil)})
	}
	for name, r := range runs {
		slices.Sort(r.ds)
		b.ReportMetric(float64(r.ds[len(r.ds)-1].Microseconds())/1000, name+"_max_ms")
		b.ReportMetric(float64(r.ds[len(r.ds)*99/100].Microseconds())/1000, name+"_p99_ms")
		if r.took > 0 {
			b.ReportMetric(float64(r.took.Milliseconds())/float64(n), name+"_populate_ms")
		}
	}
}
