package l1

import (
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"kvdock/core/keys"
)

// heapPerObject fills an anonymous pool with n ready objects and returns the
// Go heap growth per object.
func heapPerObject(tb testing.TB, n int) float64 {
	tb.Helper()
	const align = 64
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	p, err := Open(Options{Size: int64(n) * align, Align: align, Policy: PolicyNoop})
	if err != nil {
		tb.Fatal(err)
	}
	defer p.Close()
	batch := make([]keys.ObjectKey, 16)
	models := []string{"meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-7B"}
	for i := 0; i < n; i += len(batch) {
		for j := range batch {
			var h keys.Hash
			binary.LittleEndian.PutUint64(h[:], uint64(i+j))
			batch[j] = keys.ObjectKey{Chunk: h, Model: models[(i+j)%2], KVRank: keys.KVRank(2, (i+j)%2)}
		}
		res, err := p.ReserveWrite(InstanceOwner(1), batch, align)
		if err != nil {
			tb.Fatal(err)
		}
		p.FinishWrite(res)
	}
	if s := p.Stats(); s.Objects != n {
		tb.Fatalf("%d objects stored, want %d", s.Objects, n)
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	per := float64(int64(ms.HeapAlloc)-int64(before)) / float64(n)
	runtime.KeepAlive(p)
	return per
}

// TestHeapPerObject holds the table to its budget: ≤ 256 B of Go heap per
// cached object at one million objects.
func TestHeapPerObject(t *testing.T) {
	per := heapPerObject(t, 1_000_000)
	t.Logf("Go heap per object at 1M objects: %.1f B", per)
	if per > 256 {
		t.Fatalf("Go heap per object %.1f B, budget 256 B", per)
	}
}

func BenchmarkHeapPerObject(b *testing.B) {
	var per float64
	for range b.N {
		per = heapPerObject(b, 1_000_000)
	}
	b.ReportMetric(per, "heapB/object")
}

// BenchmarkReserveFinish16 reserves and publishes 16 new keys per op in a
// full LRU pool (so each op also evicts 16 objects), and reports the cost
// relative to inserting and deleting the same 16 keys in a plain Go map, the
// reference measured in the same run.
func BenchmarkReserveFinish16(b *testing.B) {
	const objects, size = 4096, 256 << 10
	p, err := Open(Options{Size: objects * size, Align: 4096})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ks := make([]keys.ObjectKey, 16)
	next := uint64(0)
	fill := func() {
		for j := range ks {
			binary.LittleEndian.PutUint64(ks[j].Chunk[:], next)
			ks[j].Model, ks[j].KVRank = "m", 1
			next++
		}
	}
	for range objects / 16 {
		fill()
		res, err := p.ReserveWrite(InstanceOwner(1), ks, size)
		if err != nil {
			b.Fatal(err)
		}
		p.FinishWrite(res)
	}
	ref := map[keys.ObjectKey]int64{}
	start := time.Now()
	const refRounds = 20000
	for i := range refRounds {
		fill()
		for _, k := range ks {
			ref[k] = int64(i)
		}
		for _, k := range ks {
			delete(ref, k)
		}
	}
	refNs := float64(time.Since(start).Nanoseconds()) / refRounds

	b.ResetTimer()
	for b.Loop() {
		fill()
		res, err := p.ReserveWrite(InstanceOwner(1), ks, size)
		if err != nil {
			b.Fatal(err)
		}
		p.FinishWrite(res)
	}
	b.StopTimer()
	if s := p.Stats(); s.Evictions == 0 {
		b.Fatal("the pool never evicted; the benchmark is not at steady state")
	}
	opNs := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(opNs/16, "ns/key")
	b.ReportMetric(opNs/refNs, "x-map-insert-delete")
}

// BenchmarkPoolChurnFragmentation stores objects of mixed sizes (several
// layouts sharing one pool) through ReserveWrite with on-demand LRU
// eviction, random deletes and the watermark loop. Right after each loop
// iteration in the second half (when the loop has just made room) it samples
// the usable fraction of the free space for the largest size, and reports
// the mean.
func BenchmarkPoolChurnFragmentation(b *testing.B) {
	sizes := []int64{1792 << 10, 2 << 20, 3 << 20, 576 << 10, 2560 << 10}
	var frac float64
	var samples int
	for i := range b.N {
		r := rand.New(rand.NewPCG(uint64(i), 3))
		p, err := Open(Options{Size: 1 << 30, Align: 4096})
		if err != nil {
			b.Fatal(err)
		}
		ks := make([]keys.ObjectKey, 4)
		const steps = 50000
		for step := range steps {
			for j := range ks {
				binary.LittleEndian.PutUint64(ks[j].Chunk[:], uint64(step*4+j))
			}
			res, err := p.ReserveWrite(InstanceOwner(1), ks, sizes[r.IntN(len(sizes))])
			if err != nil {
				b.Fatal(err)
			}
			p.FinishWrite(res)
			if r.IntN(4) == 0 { // random deletes make the churn non-FIFO
				var h keys.ObjectKey
				binary.LittleEndian.PutUint64(h.Chunk[:], uint64(r.IntN(step*4+4)))
				p.Delete([]keys.ObjectKey{h})
			}
			if step%100 == 99 {
				p.Maintain()
				if step > steps/2 {
					p.mu.Lock()
					if free := p.alloc.Free(); free > 0 {
						frac += float64(p.alloc.Usable(3<<20)) / float64(free)
						samples++
					}
					p.mu.Unlock()
				}
			}
		}
		p.Close()
	}
	b.ReportMetric(frac/float64(samples), "usable-free-frac")
}
