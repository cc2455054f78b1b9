package nongpu

import (
	"sync"
	"testing"
	"time"

	"kvdock/core/rpc"
)

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

// retrieveRig drives a gate's retrieves as the PREPARE_RETRIEVE handler
// does: each granted retrieve writes its reply into a buffer charged to its
// counter and leaves it "held by libzmq" until the test releases it.
type retrieveRig struct {
	t      *testing.T
	g      *pickleGate
	mu     sync.Mutex
	held   map[int]*rpc.Later
	ticket map[int]bool // whether the work ran with a counter
	grants chan int
}

func newRetrieveRig(t *testing.T, limit int64, ttl time.Duration) *retrieveRig {
	g := newPickleGate(limit)
	g.ttl = ttl
	t.Cleanup(g.close)
	return &retrieveRig{t: t, g: g, held: map[int]*rpc.Later{}, ticket: map[int]bool{}, grants: make(chan int, 64)}
}

func (r *retrieveRig) retrieve(inst, n int64, tag int) {
	r.g.acquireRetrieve(inst, n, func(charge *rpc.HeldBytes) {
		later := (&rpc.Request{}).Defer()
		if _, err := later.ReplyBuffer(int(n), charge); err != nil {
			r.t.Error(err)
		}
		r.mu.Lock()
		r.held[tag], r.ticket[tag] = later, charge != nil
		r.mu.Unlock()
		r.grants <- tag
	})
}

// release is libzmq done with tag's reply (the peer read it).
func (r *retrieveRig) release(tag int) {
	r.mu.Lock()
	l := r.held[tag]
	r.mu.Unlock()
	l.Answer(nil, nil)
}

func (r *retrieveRig) granted() []int {
	var out []int
	for {
		select {
		case tag := <-r.grants:
			out = append(out, tag)
		default:
			return out
		}
	}
}

func (r *retrieveRig) await(tag int) {
	r.t.Helper()
	select {
	case got := <-r.grants:
		if got != tag {
			r.t.Fatalf("granted %d, want %d", got, tag)
		}
	case <-time.After(10 * time.Second):
		r.t.Fatalf("retrieve %d never granted", tag)
	}
}

// TestPickleGateRetrieveWaitsForItsReply: a pickle retrieve's ticket is
// held until its reply buffer is released (libzmq wrote it), not until its
// handler returned; later retrieves and stores wait in order meanwhile, and
// are granted once it is released.
func TestPickleGateRetrieveWaitsForItsReply(t *testing.T) {
	r := newRetrieveRig(t, 256, time.Hour)
	r.retrieve(1, 200, 1)
	if got := r.granted(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("first retrieve: granted %v, want [1] at once", got)
	}
	r.retrieve(2, 200, 2)
	stored := make(chan struct{})
	r.g.acquire(3, 50, func() { close(stored) }) // fits, but waits its turn behind 2
	if got := r.granted(); len(got) != 0 {
		t.Fatalf("granted %v while the first reply is still held", got)
	}
	if used, waiting := r.g.state(); used != 200 || waiting != 2 {
		t.Fatalf("used %d, waiting %d; want 200, 2", used, waiting)
	}
	r.release(1)
	r.await(2)
	<-stored
	r.release(2)
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.g.mu.Lock()
		r.g.sweepLocked()
		r.g.mu.Unlock()
		if used, _ := r.g.state(); used == 50 {
			break
		}
		if time.Now().After(deadline) {
			used, _ := r.g.state()
			t.Fatalf("used %d after both replies left, want 50 (the store's)", used)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPickleGateRetrieveOnePerInstance: an instance holds one retrieve
// ticket; its next retrieve waits for it without holding up another
// instance's.
func TestPickleGateRetrieveOnePerInstance(t *testing.T) {
	r := newRetrieveRig(t, 1000, time.Hour)
	r.retrieve(1, 100, 1)
	r.retrieve(1, 100, 2)
	r.retrieve(2, 100, 3)
	if got := r.granted(); len(got) != 2 || got[0] != 1 || got[1] != 3 {
		t.Fatalf("granted %v, want [1 3]", got)
	}
	r.release(1)
	r.await(2)
	r.release(2)
	r.release(3)
}

// TestPickleGateRetrieveLapse: a reply its peer never reads holds the
// budget for the lapse at most; then the others are granted, and the
// instance's retrieves go unticketed while that reply is still out (it
// cannot take the budget again), gated again once it left.
func TestPickleGateRetrieveLapse(t *testing.T) {
	r := newRetrieveRig(t, 100, 50*time.Millisecond)
	r.retrieve(1, 100, 1) // never read (until the end)
	r.retrieve(1, 100, 2) // the same instance: waits for 1
	r.retrieve(2, 100, 3) // another: waits for the budget
	if got := r.granted(); len(got) != 1 {
		t.Fatalf("granted %v before the lapse", got)
	}
	seen := map[int]bool{}
	for len(seen) < 2 {
		select {
		case tag := <-r.grants:
			seen[tag] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("after the lapse only %v were answered", seen)
		}
	}
	if !seen[2] || !seen[3] {
		t.Fatalf("answered %v, want 2 and 3", seen)
	}
	r.mu.Lock()
	if r.ticket[2] || !r.ticket[3] {
		t.Errorf("instance 1's waiting retrieve ticketed %v, instance 2's %v; want false, true", r.ticket[2], r.ticket[3])
	}
	r.mu.Unlock()
	if _, lapses, _ := r.g.retrieveState(1); lapses != 1 {
		t.Errorf("lapses %d, want 1", lapses)
	}
	r.release(2)
	r.retrieve(1, 100, 4) // reply 1 still out: unticketed at once
	r.await(4)
	r.mu.Lock()
	if r.ticket[4] {
		t.Error("a retrieve of an instance whose reply lapsed unread took a ticket")
	}
	r.mu.Unlock()
	r.release(4)
	r.release(1) // the peer read it after all: the instance is gated again
	r.release(3)
	r.retrieve(1, 100, 5)
	r.await(5)
	r.mu.Lock()
	if !r.ticket[5] {
		t.Error("instance 1 not gated again once its lapsed reply left")
	}
	r.mu.Unlock()
	r.release(5)
}

// TestPickleGateRetrieveForgetAndClose: an unregister answers the
// instance's waiting retrieves unticketed; a close answers everything.
func TestPickleGateRetrieveForgetAndClose(t *testing.T) {
	r := newRetrieveRig(t, 100, time.Hour)
	r.retrieve(1, 100, 1)
	r.retrieve(2, 100, 2)
	r.retrieve(3, 100, 3)
	r.await(1)
	r.g.forget(2)
	r.await(2)
	r.g.close()
	r.await(3)
	r.retrieve(4, 100, 4)
	r.await(4)
	for _, tag := range []int{1, 2, 3, 4} {
		r.release(tag)
	}
}

// TestPickleGateRetrieveConcurrent: stores and retrieves of many instances
// at once, replies released in any order: everything is answered and the
// budget comes back to 0 (run with -race).
func TestPickleGateRetrieveConcurrent(t *testing.T) {
	r := newRetrieveRig(t, 300, time.Hour)
	const n = 40
	r.grants = make(chan int, 2*n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inst := int64(i % 7)
			if i%2 == 0 {
				r.g.acquire(inst, 100, func() {
					go r.g.committed(inst)
				})
				return
			}
			r.retrieve(inst, 100, i)
		}()
	}
	released := 0
	for released < n/2 {
		select {
		case tag := <-r.grants:
			go r.release(tag)
			released++
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d retrieves answered", released, n/2)
		}
	}
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.g.mu.Lock()
		r.g.sweepLocked()
		r.g.mu.Unlock()
		used, waiting := r.g.state()
		if used == 0 && waiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("used %d, waiting %d at the end", used, waiting)
		}
		time.Sleep(time.Millisecond)
	}
}
