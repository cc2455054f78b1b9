package fs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// BenchmarkRatio compares the tier with a plain sequential file write/read
// of the same bytes on the same file system, interleaved in one loop so both
// see the same machine load. Metrics: tier-ns/op, plain-ns/op and
// ratio = plain time / tier time (1.0 = as fast as a plain file; the target
// is ≥ 0.8). Writes store a new chunk each time and both sides keep the
// same number of files: the tier by LRU eviction, the plain side by removing
// the file written that many writes ago. Reads cycle through those files.
//
//	go test -run '^$' -bench Ratio -benchtime 200x ./transfer/tier/fs/
func BenchmarkRatio(b *testing.B) {
	for _, sz := range []struct {
		name string
		size int
	}{{"128KiB", 128 << 10}, {"32MiB", 32 << 20}} {
		const files = 16
		b.Run("write-"+sz.name, func(b *testing.B) {
			tr, plain, val := benchSides(b, files, sz.size)
			ctx := context.Background()
			var tierT, plainT time.Duration
			b.SetBytes(int64(sz.size))
			b.ResetTimer()
			for i := range b.N {
				dt, dp := pair(i, func() {
					if err := tr.Put(ctx, fmt.Sprint("key", i), val); err != nil {
						b.Fatal(err)
					}
				}, func() {
					if err := os.WriteFile(filepath.Join(plain, fmt.Sprint(i)), val, 0o600); err != nil {
						b.Fatal(err)
					}
					if i >= files {
						os.Remove(filepath.Join(plain, fmt.Sprint(i-files)))
					}
				})
				tierT, plainT = tierT+dt, plainT+dp
			}
			report(b, tierT, plainT)
		})
		b.Run("read-"+sz.name, func(b *testing.B) {
			tr, plain, val := benchSides(b, files, sz.size)
			ctx := context.Background()
			for i := range files {
				if err := tr.Put(ctx, fmt.Sprint("key", i), val); err != nil {
					b.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(plain, fmt.Sprint(i)), val, 0o600); err != nil {
					b.Fatal(err)
				}
			}
			var tierT, plainT time.Duration
			b.SetBytes(int64(sz.size))
			b.ResetTimer()
			for i := range b.N {
				dt, dp := pair(i, func() {
					if got, err := tr.Get(ctx, fmt.Sprint("key", i%files)); err != nil || len(got) != sz.size {
						b.Fatal(err)
					}
				}, func() {
					if got, err := os.ReadFile(filepath.Join(plain, fmt.Sprint(i%files))); err != nil || len(got) != sz.size {
						b.Fatal(err)
					}
				})
				tierT, plainT = tierT+dt, plainT+dp
			}
			report(b, tierT, plainT)
		})
	}
}

// benchSides opens a tier that holds files values of size bytes and a
// plain directory beside it, both closed when b ends, and returns the value
// both sides store.
func benchSides(b *testing.B, files, size int) (tr *Tier, plain string, val []byte) {
	b.Helper()
	dir := b.TempDir()
	tr, err := Open(FSConfig{BasePath: filepath.Join(dir, "tier"), CapacityBytes: int64(files) * charge(int64(size)), RecoverOnStart: true}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tr.Close() })
	plain = filepath.Join(dir, "plain")
	os.Mkdir(plain, 0o700)
	return tr, plain, bytes.Repeat([]byte{7}, size)
}

// pair runs both sides, the tier first on even iterations and the plain
// file first on odd ones, so neither always runs right after the other.
func pair(i int, tierOp, plainOp func()) (tierT, plainT time.Duration) {
	run := func(fn func()) time.Duration {
		t0 := time.Now()
		fn()
		return time.Since(t0)
	}
	if i%2 == 0 {
		tierT = run(tierOp)
		return tierT, run(plainOp)
	}
	plainT = run(plainOp)
	return run(tierOp), plainT
}

func report(b *testing.B, tierT, plainT time.Duration) {
	b.ReportMetric(float64(tierT.Nanoseconds())/float64(b.N), "tier-ns/op")
	b.ReportMetric(float64(plainT.Nanoseconds())/float64(b.N), "plain-ns/op")
	if tierT > 0 {
		b.ReportMetric(float64(plainT)/float64(tierT), "ratio")
	}
}

// BenchmarkStartScan times the start scan (Open with recover_on_start) of
// 20,000 chunk files of 8 KiB, per file, with the scan's workers
// (scanWorkers) and, as the reference in the same run, with one worker
// (GOMAXPROCS 1): a restart serves once its tiers are open, so the scan
// is part of the gap.
//
//	go test -run '^$' -bench StartScan -benchtime 3x ./transfer/tier/fs/
func BenchmarkStartScan(b *testing.B) {
	const files, size = 20000, 8 << 10
	base := b.TempDir()
	cfg := FSConfig{BasePath: base, CapacityBytes: 4 << 30, RecoverOnStart: true}
	tr, err := Open(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	for i := range files {
		k := fmt.Sprint("scan", i)
		if err := tr.Put(context.Background(), k, value(k, size)); err != nil {
			b.Fatal(err)
		}
	}
	tr.Close()
	per := map[int]float64{}
	for _, procs := range []int{runtime.GOMAXPROCS(0), 1} {
		b.Run(fmt.Sprintf("procs=%d", procs), func(b *testing.B) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			var took time.Duration
			for range b.N {
				start := time.Now()
				tr, err := Open(cfg, nil)
				took += time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				if n := tr.Stats().Objects; n != files {
					b.Fatalf("%d files indexed, want %d", n, files)
				}
				tr.Close()
			}
			per[procs] = float64(took.Microseconds()) / float64(b.N*files)
			b.ReportMetric(per[procs], "µs/file")
			b.ReportMetric(float64(scanWorkers()), "workers")
		})
	}
	if one, all := per[1], per[runtime.GOMAXPROCS(0)]; all > 0 && one > 0 {
		b.Logf("one worker %.2f µs a file, %d workers %.2f (×%.2f)", one, scanWorkers(), all, one/all)
	}
}
