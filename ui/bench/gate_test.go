package bench

import (
	"sync/atomic"
	"testing"
	"time"
)

// The union counts overlapping spans once: it is at least the longest
// span, at most the time from the first enter to the last leave, and less
// than the spans' sum when they overlap.
func TestVerifyGateUnionOfSpans(t *testing.T) {
	var g verifyGate
	start := time.Now()
	g.enter() // A
	time.Sleep(20 * time.Millisecond)
	bStart := time.Now()
	g.enter() // B
	time.Sleep(20 * time.Millisecond)
	g.leave() // A
	a := time.Since(start)
	time.Sleep(20 * time.Millisecond)
	g.leave() // B
	b := time.Since(bStart)
	wall := time.Since(start)
	u := g.take()
	if u < max(a, b) || u > wall || u >= a+b {
		t.Fatalf("union %v: spans %v and %v, wall %v", u, a, b, wall)
	}
	if again := g.take(); again != 0 {
		t.Fatalf("take after take: %v, want 0", again)
	}
}

// A checksum (alone) waits for the timed work under way, and timed work
// that starts meanwhile waits for the checksum.
func TestVerifyGateAloneExcludesTimedWork(t *testing.T) {
	var g verifyGate
	var timed atomic.Int32
	g.enter()
	timed.Add(1)
	ran := make(chan int32)
	go func() {
		g.alone(func() { ran <- timed.Load() })
	}()
	time.Sleep(10 * time.Millisecond) // let alone queue up
	entered := make(chan struct{})
	go func() {
		g.enter() // must wait for the queued checksum
		close(entered)
		g.leave()
	}()
	select {
	case <-ran:
		t.Fatal("the checksum ran during timed work")
	case <-entered:
		t.Fatal("timed work started while a checksum waited")
	case <-time.After(20 * time.Millisecond):
	}
	timed.Add(-1)
	g.leave()
	if n := <-ran; n != 0 {
		t.Fatalf("the checksum ran with %d timed spans open", n)
	}
	<-entered
}
