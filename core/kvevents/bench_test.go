package kvevents

import (
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"kvdock/core/keys"
)

// BenchmarkTrackerStoreCommitEvict is the data path's cost per chunk: the
// observer's Stored, the commit hook and the observer's Lost of a 16-chunk
// store of 256-token chunks, with the stream on ("stream"), the poll log
// alone (the default settings: "log") or both. The data path only queues
// its calls (ops.go); applying them (Sync) and the publisher's flush (the
// encoding) run every 8 stores (fewer ops than start an applier of their
// own) outside the timer, on this goroutine, and apply_ns/chunk is what
// applying cost.
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
			tr.Registered("m", 1, one)
			c := benchCommit(chunks, size)
			var apply time.Duration
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				for k := range c.Keys {
					tr.Stored(&c.Keys[k])
				}
				tr.Commit(c)
				for k := range c.Keys {
					tr.Lost(&c.Keys[k])
				}
				if i%8 == 7 {
					b.StopTimer()
					start := time.Now()
					tr.Sync()
					apply += time.Since(start)
					tr.Flush()
					b.StartTimer()
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chunks), "ns/chunk")
			b.ReportMetric(float64(apply.Nanoseconds())/float64(b.N*chunks), "apply_ns/chunk")
		})
	}
}

// BenchmarkTrackerFlush is the publisher's cost per batch: the encoding of
// one 16-chunk store's BlockStored and its BlockRemoved.
func BenchmarkTrackerFlush(b *testing.B) {
	const chunks, size = 16, 256
	tr := New(Options{BlockSize: size})
	tr.Registered("m", 1, one)
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
	c := Commit{Model: "m", WorldSize: 1, Tokens: make([]uint32, chunks*size)}
	for i := range chunks {
		var h keys.Hash
		h[0], h[31] = byte(i), byte(i)
		c.Hashes = append(c.Hashes, h)
		c.Keys = append(c.Keys, keys.ObjectKey{Chunk: h, Model: "m"})
	}
	return c
}

// storeCommit is a store like BenchmarkKVEventsLagAndThroughput's (8 chunks
// of 256 tokens), with token ids spread over a vocabulary's range (most
// take 3 or 5 bytes on the wire, as a model's do), its chunks fresh for
// each n.
func storeCommit(n int) Commit {
	const chunks, size = 8, 256
	c := benchCommit(chunks, size)
	for i := range c.Hashes {
		c.Hashes[i][24], c.Hashes[i][25], c.Hashes[i][26] = byte(n), byte(n>>8), byte(n>>16) // in the wire hash
		c.Keys[i].Chunk = c.Hashes[i]
	}
	for i := range c.Tokens {
		c.Tokens[i] = uint32((n*len(c.Tokens) + i) * 7919 % 151936)
	}
	return c
}

// storeEvictPrevious is the data path of one store through tr: the
// observer's Stored of cur's objects, the commit, and the observer's Lost
// of prev's (the pool evicting the store before, as a full pool does).
func storeEvictPrevious(tr *Tracker, cur, prev *Commit) {
	for k := range cur.Keys {
		tr.Stored(&cur.Keys[k])
	}
	tr.Commit(*cur)
	for k := range prev.Keys {
		tr.Lost(&prev.Keys[k])
	}
}

// BenchmarkStorePublish is the stream's whole cost per store in this
// process, the way kvdock runs it: the data path (Stored, Commit, the
// previous store's Lost) with the poll log, and a running Publisher (PUB
// bound, no subscriber: libzmq drops each message in the sending thread)
// that merges, encodes, buffers and sends the batches, on its own
// goroutine (so ns/op is wall time: on two cores the publisher runs beside
// the loop). Stores follow each other back to back; the publisher's
// trailing flush is waited for inside the timer. Beside ns/op and
// allocs/op (every goroutine's) it reports, over the same number of
// stores in the same run, two references: the data path with the stream
// off (the poll log alone, kvdock's default) as off_ns/store,
// off_allocs/store and off_B/store, and the encoding alone of each
// store's two events (BlockStored, BlockRemoved, into a reused buffer) as
// encode_ns/store; on_off is ns/op over off_ns/store. Back to back, one
// flush carries hundreds of stores (MiBs, past the scratch Flush keeps), so
// B/op counts each batch's buffer besides its exact copy; at a server's
// pace a flush carries a few stores and reuses the scratch.
func BenchmarkStorePublish(b *testing.B) {
	const pool = 64 // distinct stores cycled through
	cs := make([]Commit, pool)
	for i := range cs {
		cs[i] = storeCommit(i)
	}
	run := func(tr *Tracker, n int) {
		for i := range n {
			storeEvictPrevious(tr, &cs[i%pool], &cs[(i+pool-1)%pool])
		}
	}
	newTracker := func(stream bool) *Tracker {
		tr := New(Options{BlockSize: 256, NoStream: !stream, Log: NewLog(DefaultLogSize, 256, 1)})
		tr.Registered("m", 1, one)
		return tr
	}
	tr := newTracker(true)
	p, err := Start(tr, PublisherOptions{Endpoint: "tcp://127.0.0.1:47150", Pod: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	drained := func() {
		deadline := time.Now().Add(10 * time.Second)
		for tr.Stats().Queued > 0 {
			if time.Now().After(deadline) {
				b.Fatal("the publisher did not drain its queue")
			}
			time.Sleep(100 * time.Microsecond) // polling a condition, bounded by the deadline
		}
	}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		storeEvictPrevious(tr, &cs[n%pool], &cs[(n+pool-1)%pool])
		n++
	}
	b.StartTimer()
	drained()
	b.StopTimer()
	on := b.Elapsed()

	off0 := newTracker(false)
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	start := time.Now()
	run(off0, n)
	off0.Sync() // what an applier does beside the data path counts too
	off := time.Since(start)
	runtime.ReadMemStats(&m1)
	evs := make([][]Event, pool)
	for i := range cs {
		h := WireHash(cs[i].Hashes[0])
		evs[i] = []Event{{Stored: true, Medium: MediumCPU, Hashes: []uint64{h}, Tokens: [][]uint32{cs[i].Tokens}},
			{Medium: MediumCPU, Hashes: []uint64{h}}}
		for _, c := range cs[i].Hashes[1:] {
			evs[i][0].Hashes = append(evs[i][0].Hashes, WireHash(c))
		}
		evs[i][1].Hashes = evs[i][0].Hashes
	}
	var buf []byte
	start = time.Now()
	for i := range n {
		buf = encodeBatch(buf[:0], 1, evs[i%pool], 256, false, 0)
	}
	enc := time.Since(start)
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(n) }
	b.ReportMetric(per(off), "off_ns/store")
	b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/float64(n), "off_allocs/store")
	b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/float64(n), "off_B/store")
	b.ReportMetric(per(enc), "encode_ns/store")
	b.ReportMetric(per(on)/per(off), "on_off")
}

// BenchmarkPublisherIdle is what a running Publisher (PUB and replay
// ROUTER bound, no subscriber) costs while nothing is stored: the
// process's CPU time and context switches (every thread) per second idle,
// against a second idle in the same run before it starts (off_cpu_ms/s,
// off_switches/s). Each op is one second idle: run it with -benchtime 3x.
func BenchmarkPublisherIdle(b *testing.B) {
	usage := func() (time.Duration, int64) {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Nvcsw + ru.Nivcsw
	}
	idle := func() (time.Duration, int64) {
		c0, s0 := usage()
		time.Sleep(time.Second)
		c1, s1 := usage()
		return c1 - c0, s1 - s0
	}
	offCPU, offSwitches := idle()
	p, err := Start(New(Options{BlockSize: 256}), PublisherOptions{Endpoint: "tcp://127.0.0.1:47152",
		ReplayEndpoint: "tcp://127.0.0.1:47153", Pod: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	var cpu time.Duration
	var switches int64
	for b.Loop() {
		c, s := idle()
		cpu, switches = cpu+c, switches+s
	}
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu_ms/s")
	b.ReportMetric(float64(switches)/float64(b.N), "switches/s")
	b.ReportMetric(float64(offCPU.Microseconds())/1000, "off_cpu_ms/s")
	b.ReportMetric(float64(offSwitches), "off_switches/s")
}

// BenchmarkRestart64k is the KV event side of a restart with a large pool
// and the poll log on (kvdock's default): 16,384 prompts of 4 chunks of 256
// tokens committed, the stopping process's DescribeTo into a file, as a
// stop writes it (describe_ms, the file's write included), and the new
// process's Reannounce of all 65,536 chunks (reannounce_ms), which runs
// while the new process serves.
func BenchmarkRestart64k(b *testing.B) {
	const prompts, chunks, size = 16384, 4, 256
	h, err := keys.NewHasher(size, keys.AlgorithmBLAKE3)
	if err != nil {
		b.Fatal(err)
	}
	newTracker := func() *Tracker {
		tr := New(Options{BlockSize: size, NoStream: true, Log: NewLog(DefaultLogSize, size, 1)})
		tr.Registered("m", 1, one)
		return tr
	}
	old := newTracker()
	var published []keys.ObjectKey
	toks := make([]uint32, chunks*size)
	for p := range prompts {
		for i := range toks {
			toks[i] = uint32(p*len(toks) + i) // distinct prompts
		}
		c := Commit{Model: "m", WorldSize: 1, Hashes: h.Hashes(toks), Tokens: toks}
		for _, ch := range c.Hashes {
			k := keys.ObjectKey{Chunk: ch, Model: "m"}
			old.Stored(&k)
			c.Keys = append(c.Keys, k)
		}
		old.Commit(c)
		published = append(published, c.Keys...)
	}
	none := func([]keys.ObjectKey) uint64 { return 0 }
	var describe, reannounce time.Duration
	path := filepath.Join(b.TempDir(), "description")
	for b.Loop() {
		// Into a file, as a stop writes it (DescribeTo's pieces), then
		// read back whole, as the adopting process reads it.
		start := time.Now()
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		left, err := old.DescribeTo(f, 1, MaxDescribeBytes, nil)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		describe += time.Since(start)
		if left != 0 || err != nil {
			b.Fatalf("%d left out: %v", left, err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			b.Fatal(err)
		}
		tr := newTracker()
		for i := range published {
			tr.Stored(&published[i])
		}
		start = time.Now()
		r, err := tr.Reannounce(data, 1, published, none)
		reannounce += time.Since(start)
		if err != nil || r.Chunks != prompts*chunks {
			b.Fatalf("reannounced %d chunks: %v", r.Chunks, err)
		}
	}
	b.ReportMetric(float64(describe.Milliseconds())/float64(b.N), "describe_ms")
	b.ReportMetric(float64(reannounce.Milliseconds())/float64(b.N), "reannounce_ms")
}
