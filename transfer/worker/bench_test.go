package worker_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"kvdock/transfer/worker"
)

// BenchmarkSHMStoreRoundTrips stores 4-chunk prompts of 32 MiB chunks
// through a real engine in this process, as kvdock bench's SHM worker
// does, and reports the medians of the parts of a store: PREPARE_STORE,
// the copies into the slots, COMMIT_STORE right after them; and, for
// comparison, NOOP right after as long a busy spell without a copy, and
// NOOP back to back. One op is one prompt stored.
//
//	go test -run XXX -bench SHMStoreRoundTrips -benchtime 40x ./transfer/worker/
func BenchmarkSHMStoreRoundTrips(b *testing.B) {
	c := dial(b, startEngineSized(b, true, 256, 1))
	ctx := context.Background()
	// 2 × 1 layer × 256 tokens × 16384 × 4 B = 32 MiB per chunk.
	w, err := worker.Register(ctx, c, worker.Config{InstanceID: 1, Model: "m", Layers: 1, Hidden: 16384, Dtype: "float32", Populate: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = w.Close() })
	chunks := make([][]byte, 4)
	for i := range chunks {
		chunks[i] = make([]byte, w.Layout().Bytes)
		for j := range chunks[i] {
			chunks[i][j] = byte(i*7 + j)
		}
	}
	var prep, cp, commit, noopBusy, noop []time.Duration
	b.ResetTimer()
	for i := range b.N {
		if i%6 == 5 { // 6 prompts fill 768 MiB of the 1 GiB pool
			if _, err := c.Call(ctx, "CLEAR"); err != nil {
				b.Fatal(err)
			}
		}
		toks := make([]uint32, 4*256)
		for j := range toks {
			toks[j] = uint32(i*100000 + j)
		}
		key := w.Key(toks, 4, fmt.Sprintf("rt-%d", i))
		t0 := time.Now()
		ps, err := w.PrepareStore(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		for n, s := range ps.Slots {
			copy(w.Segment()[s.Offset:s.Offset+s.Length], chunks[n])
		}
		t2 := time.Now()
		if _, err := w.CommitStore(ctx, key, nil); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		prep, cp, commit = append(prep, t1.Sub(t0)), append(cp, t2.Sub(t1)), append(commit, t3.Sub(t2))
		for end := time.Now().Add(t2.Sub(t1)); time.Now().Before(end); {
		}
		t4 := time.Now()
		if _, err := c.Call(ctx, "NOOP"); err != nil {
			b.Fatal(err)
		}
		t5 := time.Now()
		if _, err := c.Call(ctx, "NOOP"); err != nil {
			b.Fatal(err)
		}
		noopBusy, noop = append(noopBusy, t5.Sub(t4)), append(noop, time.Since(t5))
	}
	b.StopTimer()
	med := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds())
	}
	b.ReportMetric(med(prep), "prepare-µs")
	b.ReportMetric(med(cp), "copies-µs")
	b.ReportMetric(med(commit), "commit-µs")
	b.ReportMetric(med(noopBusy), "noop-after-busy-µs")
	b.ReportMetric(med(noop), "noop-µs")
}
