package alloc

import (
	"math/bits"
	"math/rand/v2"
	"sort"
	"testing"
)

func TestNewRejectsBadAlignment(t *testing.T) {
	for _, al := range []int64{0, -4, 3, 4095} {
		if _, err := New(1<<20, al); err == nil {
			t.Errorf("New(1MiB, %d) accepted", al)
		}
	}
	if _, err := New(100, 4096); err == nil {
		t.Error("region smaller than one unit accepted")
	}
}

func TestAllocAlignsFillsAndCoalesces(t *testing.T) {
	a, err := New(64*4096, 4096)
	if err != nil {
		t.Fatal(err)
	}
	var offs []int64
	for {
		off, ok := a.Alloc(5000) // rounds to 8192
		if !ok {
			break
		}
		if off%4096 != 0 || off+8192 > a.Size() {
			t.Fatalf("offset %d misaligned or out of range", off)
		}
		offs = append(offs, off)
	}
	if len(offs) != 32 || a.Free() != 0 {
		t.Fatalf("got %d allocations, %d free; want 32, 0", len(offs), a.Free())
	}
	// Free every other one: 16 separate holes of 8 KiB; nothing of 16 KiB fits.
	for i := 0; i < len(offs); i += 2 {
		a.Release(offs[i], 5000)
	}
	if _, ok := a.Alloc(16384); ok {
		t.Fatal("16 KiB allocated in a pool of 8 KiB holes")
	}
	if got := a.Usable(8192); got != a.Free() {
		t.Fatalf("Usable(8K) = %d, want all %d free bytes", got, a.Free())
	}
	for i := 1; i < len(offs); i += 2 {
		a.Release(offs[i], 8192)
	}
	if a.Extents() != 1 || a.Largest() != a.Size() || a.Free() != a.Size() {
		t.Fatalf("after freeing all: %d extents, largest %d, free %d; want one extent of %d",
			a.Extents(), a.Largest(), a.Free(), a.Size())
	}
	if _, ok := a.Alloc(a.Size() + 1); ok {
		t.Fatal("allocation larger than the region succeeded")
	}
	if _, ok := a.Alloc(0); ok {
		t.Fatal("zero-byte allocation succeeded")
	}
}

// TestRandomNeverOverlaps checks the invariants after every step of a random
// alloc/free sequence: live ranges are aligned, inside the region, disjoint,
// and live + free bytes cover the region exactly with no adjacent free extents.
func TestRandomNeverOverlaps(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	a, err := New(1<<20, 64)
	if err != nil {
		t.Fatal(err)
	}
	type rng struct{ off, n int64 }
	var live []rng
	for step := range 20000 {
		if len(live) > 0 && r.IntN(3) == 0 {
			k := r.IntN(len(live))
			a.Release(live[k].off, live[k].n)
			live[k] = live[len(live)-1]
			live = live[:len(live)-1]
		} else {
			n := int64(1 + r.IntN(20000))
			if off, ok := a.Alloc(n); ok {
				live = append(live, rng{off, a.Round(n)})
			}
		}
		if step%97 != 0 {
			continue
		}
		var all []rng
		var used int64
		for _, l := range live {
			if l.off%64 != 0 || l.off < 0 || l.off+l.n > a.Size() {
				t.Fatalf("step %d: bad live range %+v", step, l)
			}
			used += l.n
			all = append(all, l)
		}
		a.ForEachFree(func(off, size int64) { all = append(all, rng{off, size}) })
		if used+a.Free() != a.Size() {
			t.Fatalf("step %d: used %d + free %d != size %d", step, used, a.Free(), a.Size())
		}
		sort.Slice(all, func(i, j int) bool { return all[i].off < all[j].off })
		var pos int64
		for _, x := range all {
			if x.off != pos {
				t.Fatalf("step %d: gap or overlap at %d (next range starts %d)", step, pos, x.off)
			}
			pos = x.off + x.n
		}
		if pos != a.Size() {
			t.Fatalf("step %d: ranges end at %d, region %d", step, pos, a.Size())
		}
	}
}

// BenchmarkChurnFragmentation fills a pool with a mix of KV-chunk-like sizes,
// then churns (free a random object, allocate a random size, evicting random
// objects until it fits, as the pool does) and reports the usable fraction of
// free space for the largest size in the mix. It also reports the internal
// waste power-of-two size classes would have for the same mix, the
// alternative this allocator was chosen over.
func BenchmarkChurnFragmentation(b *testing.B) {
	const align = 4096
	sizes := []int64{ // per-chunk bytes of a few layouts (MLA and not, fp16/bf16)
		256 * 1024 * 28 * 2 / 8, // 1.75 MiB
		2 * 1024 * 1024,
		3 * 1024 * 1024,
		576 * 1024,
		5 * 1024 * 1024 / 2,
	}
	maxSize := int64(0)
	var sum, pow2 float64
	for _, s := range sizes {
		maxSize = max(maxSize, s)
		sum += float64(s)
		pow2 += float64(int64(1) << bits.Len64(uint64(s-1)))
	}
	var usableFrac float64
	for i := 0; i < b.N; i++ {
		r := rand.New(rand.NewPCG(uint64(i), 7))
		a, err := New(1<<30, align)
		if err != nil {
			b.Fatal(err)
		}
		type rng struct{ off, n int64 }
		var live []rng
		evict := func() {
			k := r.IntN(len(live))
			a.Release(live[k].off, live[k].n)
			live[k] = live[len(live)-1]
			live = live[:len(live)-1]
		}
		for range 200000 {
			// Watermark-style eviction keeps usage near 80%, as the pool's loop does.
			for len(live) > 0 && a.Free() < a.Size()/5 {
				evict()
			}
			n := sizes[r.IntN(len(sizes))]
			for {
				if off, ok := a.Alloc(n); ok {
					live = append(live, rng{off, n})
					break
				}
				if len(live) == 0 {
					b.Fatal("empty pool cannot allocate")
				}
				evict() // on-demand eviction
			}
		}
		usableFrac += float64(a.Usable(maxSize)) / float64(a.Free())
	}
	b.ReportMetric(usableFrac/float64(b.N), "usable-free-frac")
	b.ReportMetric(1-sum/pow2, "pow2-class-waste")
}

func BenchmarkAllocRelease(b *testing.B) {
	a, err := New(1<<30, 4096)
	if err != nil {
		b.Fatal(err)
	}
	offs := make([]int64, 0, 16)
	for b.Loop() {
		for range 16 {
			off, _ := a.Alloc(2 << 20)
			offs = append(offs, off)
		}
		for _, off := range offs {
			a.Release(off, 2<<20)
		}
		offs = offs[:0]
	}
}
