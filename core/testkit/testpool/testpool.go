// Package testpool opens the anonymous L1 pools the tier tests store chunks
// in, with one set of test defaults.
package testpool

import (
	"testing"
	"time"

	"kvdock/core/l1"
)

// Anon opens an anonymous (not shared-memory) pool of size bytes: LRU,
// 600 s write and 300 s read TTLs, watermark 0.8, ratio 0.2. Each adjust
// may change the options before the open. The pool closes when the test
// ends.
func Anon(t testing.TB, size int64, adjust ...func(*l1.Options)) *l1.Pool {
	t.Helper()
	opts := l1.Options{
		Size: size, Align: 64, Plan: l1.Decision{Reason: "test: anonymous pool"},
		WriteTTL: 600 * time.Second, ReadTTL: 300 * time.Second, Policy: "LRU",
		Watermark: 0.8, Ratio: 0.2,
	}
	for _, a := range adjust {
		a(&opts)
	}
	p, err := l1.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}
