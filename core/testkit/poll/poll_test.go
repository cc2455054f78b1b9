package poll

import (
	"testing"
	"time"
)

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	n := 0
	start := time.Now()
	Until(t, time.Second, "third check", func() bool { n++; return n == 3 })
	if n != 3 || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("%d checks in %v", n, time.Since(start))
	}
}

// failer records a Fatalf instead of ending the goroutine's test.
type failer struct {
	testing.TB
	msg string
}

func (f *failer) Helper() {}

func (f *failer) Fatalf(format string, args ...any) {
	f.msg = format
	panic(f)
}

func TestUntilFailsAfterTheLimit(t *testing.T) {
	f := &failer{TB: t}
	start := time.Now()
	func() {
		defer func() {
			if r := recover(); r != f {
				t.Fatalf("recovered %v, want the failer's Fatalf", r)
			}
		}()
		Until(f, 20*time.Millisecond, "never", func() bool { return false })
	}()
	if f.msg == "" || time.Since(start) < 20*time.Millisecond {
		t.Fatalf("failed with %q after %v", f.msg, time.Since(start))
	}
}
