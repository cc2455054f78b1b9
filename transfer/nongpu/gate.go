package nongpu

import (
	"sync"
	"time"

	"kvdock/core/rpc"
)

// pickleGate bounds the pickled bytes in flight, stores and retrieves in
// one budget. A pickle worker sends its chunks only after its PREPARE_STORE
// reply (spec 4.3), so that reply waits for a ticket for the bytes its key
// can carry; a pickle PREPARE_RETRIEVE likewise waits before its reply is
// built. A ticket comes back with the instance's next COMMIT_STORE with
// data (store), once libzmq has written the reply (retrieve), on
// unregister, or after ticketTTL, so neither kind waits on the other and a
// peer that never commits or reads holds nothing for long. One ticket is
// always granted when none is held; an instance holds one retrieve ticket
// at a time. The wire server's read stop and reply budget bound what is
// left (peers that send without waiting, replies nobody reads).
type pickleGate struct {
	mu      sync.Mutex
	limit   int64
	used    int64
	ttl     time.Duration
	held    map[int64][]*ticket // store tickets per instance, oldest first
	reading map[int64]*ticket   // the retrieve ticket of an instance
	lapsed  []*ticket           // dropped retrieve tickets whose replies are still out
	lapses  int64               // retrieve tickets that lapsed (for tests and stats)
	reads   int64               // retrieve tickets granted (for tests and stats)
	waiting []*ticket           // FIFO
	polling bool
	closed  bool
}

// retrievePoll is how often the bytes of sent retrieve replies are checked
// while a request waits for the budget.
const retrievePoll = time.Millisecond

// ticketTTL is how long a granted ticket waits for its commit (a store's)
// or for its reply to leave (a retrieve's). The lapsed list is bounded by
// the instances: one whose lapsed reply is still out takes no further
// ticket (its retrieves go unticketed meanwhile), so it holds about one
// entry per instance (two when a ticket lapses while its reply is still
// being written), plus those of instances unregistered meanwhile.
const ticketTTL = 10 * time.Second

// maxWaiting bounds the prepares of one instance waiting for a ticket: a
// worker has a store or a few in flight; past it (a peer sending prepares
// without commits) a prepare is answered at once, unticketed (the wire
// server's in-flight read stop still bounds what its commits hold).
const maxWaiting = 8

type ticket struct {
	instance int64
	bytes    int64
	grant    func() // answers the PREPARE_STORE, or prepares and answers the retrieve
	timer    *time.Timer
	// A retrieve's: its reply buffer is charged to held; sent once answered.
	retrieve bool
	held     *rpc.HeldBytes
	work     func(*rpc.HeldBytes)
	sent     bool
	dropped  bool // no longer counted (lapsed, unregistered, closed)
}

func newPickleGate(limit int64) *pickleGate {
	return &pickleGate{limit: limit, ttl: ticketTTL, held: map[int64][]*ticket{}, reading: map[int64]*ticket{}}
}

// acquire asks for n bytes for a store of instance; grant runs (on this
// goroutine or a later releaser's) once they are granted.
// A ticket counts at most the limit (a key of a huge range holds no more).
func (g *pickleGate) acquire(instance, n int64, grant func()) {
	g.enqueue(&ticket{instance: instance, bytes: n, grant: grant})
}

// acquireRetrieve asks for n bytes for a retrieve reply of instance; work
// runs once they are granted, with the counter to charge its reply buffer
// to (nil when unticketed: the gate is off or closed, too many of the
// instance's wait, or it unregistered), on this goroutine when granted at
// once, else on a new one. The ticket is returned once work returned and
// the buffers charged to the counter were released.
func (g *pickleGate) acquireRetrieve(instance, n int64, work func(charge *rpc.HeldBytes)) {
	held, err := rpc.NewHeldBytes()
	if err != nil {
		work(nil) // no memory for a counter: answered unticketed
		return
	}
	t := &ticket{instance: instance, bytes: n, retrieve: true, held: held, work: work}
	t.grant = func() {
		work(held)
		g.sent(t)
	}
	g.enqueue(t)
}

// enqueue queues t and runs what can be granted; t's own grant runs on
// this goroutine.
func (g *pickleGate) enqueue(t *ticket) {
	g.mu.Lock()
	t.bytes = min(t.bytes, max(g.limit, 0))
	waiting := 0
	for _, w := range g.waiting {
		if w.instance == t.instance && w.retrieve == t.retrieve {
			waiting++
		}
	}
	if g.closed || g.limit <= 0 || waiting >= maxWaiting || (t.retrieve && g.stuckLocked(t.instance)) {
		g.mu.Unlock()
		g.unticketed([]*ticket{t}, t)
		return
	}
	g.waiting = append(g.waiting, t)
	granted := g.grantLocked()
	g.mu.Unlock()
	g.run(granted, t)
}

// unticketed answers tickets that were never granted: a store's prepare
// at once, a retrieve's work with no counter (self's here, others' on
// goroutines of their own).
func (g *pickleGate) unticketed(ts []*ticket, self *ticket) {
	for _, t := range ts {
		if !t.retrieve {
			t.grant()
			continue
		}
		t.held.Free() // nothing was charged to it
		if t == self {
			t.work(nil)
		} else {
			go t.work(nil)
		}
	}
}

// grantLocked moves waiting tickets to held, in order, while they fit, and
// returns them for their grants to run outside the lock. A retrieve of an
// instance that holds one already is passed over (it waits for its own
// instance, not for the budget).
func (g *pickleGate) grantLocked() []*ticket {
	g.sweepLocked()
	var out []*ticket
	keep := g.waiting[:0]
	full := false
	for _, t := range g.waiting {
		switch {
		case full, t.retrieve && g.reading[t.instance] != nil:
			keep = append(keep, t)
			continue
		case g.used != 0 && g.used+t.bytes > g.limit:
			full = true
			keep = append(keep, t)
			continue
		}
		g.used += t.bytes
		if t.retrieve {
			g.reading[t.instance] = t
			g.reads++
		} else {
			g.held[t.instance] = append(g.held[t.instance], t)
		}
		t.timer = time.AfterFunc(g.ttl, func() { g.expire(t) })
		out = append(out, t)
	}
	clear(g.waiting[len(keep):])
	g.waiting = keep
	if len(g.waiting) > 0 && !g.polling && !g.closed && len(g.reading) > 0 {
		g.polling = true
		go g.poll()
	}
	return out
}

// sweepLocked returns the retrieve tickets whose replies have left, and
// frees the counters of lapsed replies that left since.
func (g *pickleGate) sweepLocked() {
	for _, t := range g.reading {
		if t.sent && t.held.Load() == 0 {
			g.dropLocked(t)
		}
	}
	keep := g.lapsed[:0]
	for _, t := range g.lapsed {
		if t.held.Load() == 0 {
			t.held.Free()
		} else {
			keep = append(keep, t)
		}
	}
	clear(g.lapsed[len(keep):])
	g.lapsed = keep
}

// poll grants waiting tickets as retrieve replies leave, until nothing
// waits or no retrieve ticket is out.
func (g *pickleGate) poll() {
	tick := time.NewTicker(retrievePoll)
	defer tick.Stop()
	for range tick.C {
		g.mu.Lock()
		granted := g.grantLocked()
		if len(g.waiting) == 0 || len(g.reading) == 0 || g.closed {
			g.polling = false
			g.mu.Unlock()
			g.run(granted, nil)
			return
		}
		g.mu.Unlock()
		g.run(granted, nil)
	}
}

// sent notes that t's retrieve was answered: its ticket is returned once
// its reply buffer is released (at once when there was none).
func (g *pickleGate) sent(t *ticket) {
	g.mu.Lock()
	t.sent = true
	if t.dropped {
		g.retireLocked(t)
	}
	granted := g.grantLocked()
	g.mu.Unlock()
	g.run(granted, nil)
}

// run runs grants outside the lock: self's and the stores' here, other
// retrieves' (a prepare and a pickle encode each) on goroutines of their own.
func (g *pickleGate) run(ts []*ticket, self *ticket) {
	for _, t := range ts {
		if t.retrieve && t != self {
			go t.grant()
		} else {
			t.grant()
		}
	}
}

// committed returns the oldest ticket of instance (its commit is done).
func (g *pickleGate) committed(instance int64) {
	g.mu.Lock()
	q := g.held[instance]
	if len(q) == 0 {
		g.mu.Unlock()
		return
	}
	g.dropLocked(q[0])
	granted := g.grantLocked()
	g.mu.Unlock()
	g.run(granted, nil)
}

// expire returns a ticket whose commit never came. Its instance's other
// waiting prepares are answered at once, unticketed: a worker that let a
// ticket lapse is not waiting for the gate (it gave up, or it never meant
// to commit), and it must not hold the line for the others.
//
// A lapsed retrieve ticket (its reply not read within ttl) stops counting
// in the same way: while that reply is still out, the instance's retrieves
// are answered unticketed, so that a peer that does not read cannot take
// ticket after ticket and hold the others up one lapse at a time; those
// replies are bounded by the wire server's reply budget for the peer.
func (g *pickleGate) expire(t *ticket) {
	g.mu.Lock()
	if t.retrieve {
		if g.reading[t.instance] != t {
			g.mu.Unlock()
			return
		}
		g.lapses++
		g.dropLocked(t)
		now := g.takeWaitingLocked(t.instance, false, true)
		granted := g.grantLocked()
		g.mu.Unlock()
		g.unticketed(now, nil)
		g.run(granted, nil)
		return
	}
	held := false
	for _, h := range g.held[t.instance] {
		held = held || h == t
	}
	if !held {
		g.mu.Unlock()
		return
	}
	g.dropLocked(t)
	now := g.takeWaitingLocked(t.instance, true, false)
	granted := g.grantLocked()
	g.mu.Unlock()
	g.unticketed(now, nil)
	g.run(granted, nil)
}

// takeWaitingLocked removes and returns instance's waiting tickets of the
// kinds asked for.
func (g *pickleGate) takeWaitingLocked(instance int64, stores, retrieves bool) []*ticket {
	var out []*ticket
	keep := g.waiting[:0]
	for _, t := range g.waiting {
		if t.instance == instance && ((t.retrieve && retrieves) || (!t.retrieve && stores)) {
			out = append(out, t)
		} else {
			keep = append(keep, t)
		}
	}
	clear(g.waiting[len(keep):])
	g.waiting = keep
	return out
}

// retireLocked frees the counter of a dropped retrieve ticket that was
// answered, or keeps it for sweepLocked while its reply is still out. (Not
// answered yet: its work may still charge the counter, so sent does this.)
func (g *pickleGate) retireLocked(t *ticket) {
	if t.held.Load() == 0 {
		t.held.Free()
	} else {
		g.lapsed = append(g.lapsed, t)
	}
}

// stuckLocked reports whether a lapsed reply of instance is still out (its
// peer does not read it).
func (g *pickleGate) stuckLocked(instance int64) bool {
	for _, t := range g.lapsed {
		if t.instance == instance && t.held.Load() != 0 {
			return true
		}
	}
	return false
}

// dropLocked returns t if it is still held. A retrieve ticket's counter is
// freed, or kept for sweepLocked while its reply is still out.
func (g *pickleGate) dropLocked(t *ticket) {
	if t.retrieve {
		if g.reading[t.instance] != t {
			return
		}
		t.timer.Stop()
		g.used -= t.bytes
		delete(g.reading, t.instance)
		t.dropped = true
		if t.sent {
			g.retireLocked(t)
		}
		return
	}
	q := g.held[t.instance]
	for i, h := range q {
		if h != t {
			continue
		}
		t.timer.Stop()
		g.used -= t.bytes
		q = append(q[:i], q[i+1:]...)
		if len(q) == 0 {
			delete(g.held, t.instance)
		} else {
			g.held[t.instance] = q
		}
		return
	}
}

// forget returns every ticket of instance (unregistered) and answers its
// waiting prepares at once.
func (g *pickleGate) forget(instance int64) {
	g.mu.Lock()
	for _, t := range append([]*ticket(nil), g.held[instance]...) {
		g.dropLocked(t)
	}
	if t := g.reading[instance]; t != nil {
		g.dropLocked(t)
	}
	now := g.takeWaitingLocked(instance, true, true)
	granted := g.grantLocked()
	g.mu.Unlock()
	g.unticketed(now, nil)
	g.run(granted, nil)
}

// close answers every waiting prepare and grants everything from now on.
func (g *pickleGate) close() {
	g.mu.Lock()
	g.closed = true
	now := g.waiting
	g.waiting = nil
	for _, q := range g.held {
		for _, t := range q {
			t.timer.Stop()
		}
	}
	for _, t := range g.reading {
		g.dropLocked(t)
	}
	g.held, g.used = map[int64][]*ticket{}, 0
	g.mu.Unlock()
	g.unticketed(now, nil)
}

// setLimit changes the limit (a restart with a new setting); waiting
// prepares that now fit are granted.
func (g *pickleGate) setLimit(limit int64) {
	g.mu.Lock()
	g.limit = limit
	granted := g.grantLocked()
	g.mu.Unlock()
	g.run(granted, nil)
}

// retrieveState is the retrieve tickets granted and lapsed so far, and the
// bytes of instance's answered retrieve reply still out (-1: it holds no
// answered ticket). For tests.
func (g *pickleGate) retrieveState(instance int64) (reads, lapses, out int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	out = -1
	if t := g.reading[instance]; t != nil && t.sent {
		out = t.held.Load()
	}
	return g.reads, g.lapses, out
}

// state is the bytes held and the prepares waiting (for tests and stats).
func (g *pickleGate) state() (used int64, waiting int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.used, len(g.waiting)
}
