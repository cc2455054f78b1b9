package series

import (
	"math"
	"slices"
	"testing"
	"time"
)

func TestRingWrapsAround(t *testing.T) {
	r := NewRing(3)
	if got := r.Tail(nil, 10); len(got) != 0 {
		t.Fatalf("empty ring tail = %v", got)
	}
	for v := 1.0; v <= 5; v++ {
		r.Push(v)
	}
	if r.Len() != 3 || r.Cap() != 3 {
		t.Fatalf("len %d cap %d, want 3 3", r.Len(), r.Cap())
	}
	if got := r.Tail(nil, 10); !slices.Equal(got, []float64{3, 4, 5}) {
		t.Fatalf("tail after wrap = %v, want [3 4 5] (oldest first)", got)
	}
	if got := r.Tail(nil, 2); !slices.Equal(got, []float64{4, 5}) {
		t.Fatalf("tail 2 = %v, want [4 5]", got)
	}
	if r.At(0) != 5 || r.At(2) != 3 {
		t.Fatalf("At(0)=%v At(2)=%v, want 5 and 3", r.At(0), r.At(2))
	}
	if s := r.Sum(2); s != 9 {
		t.Fatalf("sum of newest 2 = %v, want 9", s)
	}
	// Many laps keep the order.
	for v := 6.0; v <= 100; v++ {
		r.Push(v)
	}
	if got := r.Tail(nil, 3); !slices.Equal(got, []float64{98, 99, 100}) {
		t.Fatalf("tail after laps = %v", got)
	}
}

func TestHistoryFoldsTenSecondsIntoOneCoarsePoint(t *testing.T) {
	h := NewHistory()
	for i := range 25 {
		h.Push(float64(i))
	}
	if h.Fine.Len() != 25 {
		t.Fatalf("fine len %d, want 25", h.Fine.Len())
	}
	// 0..9 → 4.5, 10..19 → 14.5; 20..24 still pending.
	if got := h.Coarse.Tail(nil, 10); !slices.Equal(got, []float64{4.5, 14.5}) {
		t.Fatalf("coarse = %v, want [4.5 14.5]", got)
	}
	// Fine keeps ten minutes, coarse two hours.
	for range FineLen + CoarseLen*coarseEvery {
		h.Push(1)
	}
	if h.Fine.Len() != FineLen || h.Coarse.Len() != CoarseLen {
		t.Fatalf("fine %d coarse %d, want %d %d", h.Fine.Len(), h.Coarse.Len(), FineLen, CoarseLen)
	}
}

func TestHistoryTotalIntegratesRate(t *testing.T) {
	h := NewHistory()
	// 2 h of 3/s, then 5 s of 10/s (pending, not folded yet).
	for range 7200 {
		h.Push(3)
	}
	for range 5 {
		h.Push(10)
	}
	// Last hour: 5 s × 10 + 3595 s × 3; the coarse part is whole tens, so
	// 359 coarse points (3590 s) follow the 5 pending seconds.
	want := 5*10 + 3590*3.0
	if got := h.Total(time.Hour); got != want {
		t.Fatalf("total over the last hour = %v, want %v", got, want)
	}
	if got := h.Total(3 * time.Second); got != 30 {
		t.Fatalf("total over 3 s = %v, want 30", got)
	}
}

func TestCounterRate(t *testing.T) {
	var c Counter
	if r := c.Rate(100, time.Second); r != 0 {
		t.Fatalf("first reading gave %v, want 0 (no baseline)", r)
	}
	if r := c.Rate(150, time.Second); r != 50 {
		t.Fatalf("rate = %v, want 50/s", r)
	}
	if r := c.Rate(250, 2*time.Second); r != 50 {
		t.Fatalf("rate over 2 s = %v, want 50/s", r)
	}
	if r := c.Rate(250, 500*time.Millisecond); r != 0 {
		t.Fatalf("unchanged counter gave %v", r)
	}
	// A reset (pool rebuild): the new counter counts from zero.
	if r := c.Rate(30, time.Second); r != 30 {
		t.Fatalf("after reset rate = %v, want 30/s", r)
	}
	if r := c.Rate(40, 0); r != 0 {
		t.Fatalf("zero elapsed gave %v", r)
	}
	if r := c.Rate(60, 4*time.Second); r != 5 {
		t.Fatalf("rate after a zero-elapsed reading = %v, want 5/s", r)
	}
}

func TestLatencyQuantiles(t *testing.T) {
	var l Latency
	q := NewQuantiles()
	q.Sample(&l, time.Second, true) // baseline
	// 98 fast requests (~100 µs), 2 slow ones (~50 ms).
	for range 98 {
		l.Observe(100 * time.Microsecond)
	}
	l.Observe(50 * time.Millisecond)
	l.Observe(50 * time.Millisecond)
	q.Sample(&l, time.Second, false)
	if r := q.Rate.Fine.At(0); r != 100 {
		t.Fatalf("rate %v, want 100/s", r)
	}
	within := func(got, want float64) bool { return got >= want && got <= want*1.2 }
	if p := q.P50.Fine.At(0); !within(p, 100e-6) {
		t.Fatalf("p50 = %v s, want ~100 µs", p)
	}
	if p := q.P99.Fine.At(0); !within(p, 50e-3) {
		t.Fatalf("p99 = %v s, want ~50 ms", p)
	}
	// A quiet second reports 0, not the previous second's figures.
	q.Sample(&l, time.Second, false)
	if q.P50.Fine.At(0) != 0 || q.Rate.Fine.At(0) != 0 {
		t.Fatalf("quiet second: p50 %v rate %v, want 0", q.P50.Fine.At(0), q.Rate.Fine.At(0))
	}
	// The coarse point covers the ten seconds together: 100 requests of
	// which 2 slow → p99 is the slow bucket, p50 the fast one.
	for range coarseEvery - 3 {
		q.Sample(&l, time.Second, false)
	}
	if q.P99.Coarse.Len() != 1 {
		t.Fatalf("coarse points %d, want 1", q.P99.Coarse.Len())
	}
	if p := q.P99.Coarse.At(0); !within(p, 50e-3) {
		t.Fatalf("coarse p99 = %v, want ~50 ms", p)
	}
	if p := q.P50.Coarse.At(0); !within(p, 100e-6) {
		t.Fatalf("coarse p50 = %v, want ~100 µs", p)
	}
	// The next ten seconds start empty.
	for range coarseEvery {
		q.Sample(&l, time.Second, false)
	}
	if p := q.P99.Coarse.At(0); p != 0 {
		t.Fatalf("empty ten seconds gave p99 %v", p)
	}
}

func TestLatencyBucketsClamp(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, 0, time.Nanosecond, time.Hour, math.MaxInt64} {
		if b := latBucket(d); b < 0 || b >= latBuckets {
			t.Fatalf("bucket(%v) = %d out of range", d, b)
		}
	}
	if latBucket(time.Hour) != latBuckets-1 {
		t.Fatal("an hour is not in the last bucket")
	}
	// Each duration is within its bucket's bound and above the one before.
	for _, d := range []time.Duration{3 * time.Microsecond, 777 * time.Microsecond, 12 * time.Millisecond, 3 * time.Second} {
		i := latBucket(d)
		if s := d.Seconds(); s > latBound(i)*(1+1e-9) || s <= latBound(i-1) {
			t.Fatalf("%v in bucket %d (%v..%v]", d, i, latBound(i-1), latBound(i))
		}
	}
}

// TestSampleAllocatesNothing is the bound the benchmarks show: a sampler
// that runs every second for months must not grow the heap.
func TestSampleAllocatesNothing(t *testing.T) {
	h := NewHistory()
	var c Counter
	var l Latency
	q := NewQuantiles()
	v := 0.0
	if n := testing.AllocsPerRun(1000, func() {
		v += 7
		h.Push(c.Rate(v, time.Second))
		l.Observe(time.Millisecond)
		q.Sample(&l, time.Second, false)
	}); n != 0 {
		t.Fatalf("%v allocations per sample, want 0", n)
	}
}

func BenchmarkHistoryPush(b *testing.B) {
	h := NewHistory()
	var c Counter
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		h.Push(c.Rate(float64(i), time.Second))
	}
}

func BenchmarkQuantilesSample(b *testing.B) {
	var l Latency
	q := NewQuantiles()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		l.Observe(time.Millisecond)
		q.Sample(&l, time.Second, false)
	}
}

func TestRatio(t *testing.T) {
	got := Ratio([]float64{9, 1, 0, 3}, []float64{0, 4, 6})
	if len(got) != 3 || !math.IsNaN(got[0]) || got[1] != 0 || got[2] != 0.5 {
		t.Fatalf("Ratio = %v, want [NaN 0 0.5] (aligned on the newest)", got)
	}
	if r, ok := SumRatio([]float64{1, 2, 3}, []float64{10, 4, 4}, 2); !ok || r != 5.0/8 {
		t.Fatalf("SumRatio = %v %v, want 0.625", r, ok)
	}
	if _, ok := SumRatio([]float64{1}, []float64{0}, 5); ok {
		t.Fatal("SumRatio over no lookups reported a ratio")
	}
}

func TestWindowMean(t *testing.T) {
	w := Window{Fine: []float64{100, 1, 2, 3}}
	if m := w.Mean(3); m != 2 {
		t.Fatalf("mean of the newest 3 = %v, want 2", m)
	}
	if m := w.Mean(10); m != 26.5 {
		t.Fatalf("mean of all = %v, want 26.5", m)
	}
	if m := (Window{}).Mean(5); m != 0 {
		t.Fatalf("empty mean = %v", m)
	}
}
