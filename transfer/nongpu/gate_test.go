package nongpu

import "testing"

// TestPickleGateBoundsAndOrder: prepares are granted in order while their
// bytes fit the limit (one always when none is held); a commit of the
// instance returns its oldest ticket and grants the next waiters; an
// unregister answers the instance's waiters at once and returns its tickets.
func TestPickleGateBoundsAndOrder(t *testing.T) {
	g := newPickleGate(256)
	var granted []int
	ask := func(inst int64, n int64, tag int) { g.acquire(inst, n, func() { granted = append(granted, tag) }) }
	ask(1, 300, 1) // over the limit alone: granted (counted as the limit), nothing else held
	ask(2, 100, 2) // waits: 300 held
	ask(3, 100, 3)
	ask(4, 100, 4)
	if used, waiting := g.state(); len(granted) != 1 || used != 256 || waiting != 3 {
		t.Fatalf("granted %v, used %d, waiting %d; want [1], 256, 3", granted, used, waiting)
	}
	g.committed(1)
	if used, waiting := g.state(); len(granted) != 3 || granted[1] != 2 || granted[2] != 3 || used != 200 || waiting != 1 {
		t.Fatalf("after commit: granted %v, used %d, waiting %d; want [1 2 3], 200, 1", granted, used, waiting)
	}
	g.committed(7) // no ticket: nothing changes
	if used, _ := g.state(); used != 200 {
		t.Fatalf("a commit without a ticket returned bytes: used %d", used)
	}
	ask(5, 100, 5)
	g.forget(5) // its waiting prepare is answered at once
	if granted[len(granted)-1] != 5 {
		t.Fatalf("unregistered instance's prepare not answered: %v", granted)
	}
	g.forget(2)
	if used, waiting := g.state(); used != 200 || waiting != 0 || granted[len(granted)-1] != 4 {
		t.Fatalf("after forgetting 2: used %d, waiting %d, granted %v; want 200, 0, ...4", used, waiting, granted)
	}
	ask(6, 1000, 6)
	g.close()
	if used, waiting := g.state(); used != 0 || waiting != 0 || granted[len(granted)-1] != 6 {
		t.Fatalf("after close: used %d, waiting %d, granted %v", used, waiting, granted)
	}
	ask(8, 1<<40, 8)
	if granted[len(granted)-1] != 8 {
		t.Fatal("a closed gate must grant at once")
	}
}

// TestPickleGateBoundsWaitingPerInstance: an instance sending prepares
// without commits queues at most maxWaiting of them; the rest are answered
// at once (unticketed), so the waiting list cannot grow without bound.
func TestPickleGateBoundsWaitingPerInstance(t *testing.T) {
	g := newPickleGate(100)
	answered := 0
	g.acquire(1, 100, func() { answered++ }) // holds the limit
	for range 1000 {
		g.acquire(2, 100, func() { answered++ })
	}
	used, waiting := g.state()
	if waiting != maxWaiting || used != 100 || answered != 1+1000-maxWaiting {
		t.Fatalf("waiting %d (max %d), used %d, answered %d", waiting, maxWaiting, used, answered)
	}
	g.close()
	if answered != 1001 {
		t.Fatalf("close answered %d of 1001", answered)
	}
}

// TestPickleGateLapsedTicket: a ticket whose commit never comes lapses; its
// instance's waiting prepares are answered then (it does not hold the line),
// the others are granted in order, and a ticket counts at most the limit.
func TestPickleGateLapsedTicket(t *testing.T) {
	g := newPickleGate(100)
	var order []int
	ask := func(inst, n int64, tag int) { g.acquire(inst, n, func() { order = append(order, tag) }) }
	ask(1, 1<<40, 1) // a huge key: counts as the limit
	if used, _ := g.state(); used != 100 {
		t.Fatalf("a huge ticket holds %d, want the limit 100", used)
	}
	ask(1, 50, 2) // the same instance, waiting
	ask(2, 50, 3)
	g.mu.Lock()
	lapsed := g.held[1][0]
	g.mu.Unlock()
	g.expire(lapsed)
	if len(order) != 3 || order[1] != 2 || order[2] != 3 {
		t.Fatalf("after the lapse: answered %v, want [1 2 3] (2 unticketed, 3 granted)", order)
	}
	if used, waiting := g.state(); used != 50 || waiting != 0 {
		t.Fatalf("used %d, waiting %d; want 50 (instance 2's), 0", used, waiting)
	}
	g.expire(lapsed) // already gone: nothing changes
	if used, _ := g.state(); used != 50 {
		t.Fatalf("a second expiry changed the bytes held: %d", used)
	}
}

// TestPickleGateSetLimit: raising the limit grants the prepares that now fit.
func TestPickleGateSetLimit(t *testing.T) {
	g := newPickleGate(100)
	n := 0
	for range 3 {
		g.acquire(1, 100, func() { n++ })
	}
	if n != 1 {
		t.Fatalf("granted %d at limit 100, want 1", n)
	}
	g.setLimit(300)
	if used, waiting := g.state(); n != 3 || used != 300 || waiting != 0 {
		t.Fatalf("after raising the limit: granted %d, used %d, waiting %d; want 3, 300, 0", n, used, waiting)
	}
}
