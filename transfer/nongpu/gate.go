package nongpu

import (
	"sync"
	"time"
)

// pickleGate bounds the pickled bytes on their way in. A pickle worker
// waits for its PREPARE_STORE reply before it pickles and sends the chunks
// (spec 4.3), so that reply is the one point where the server can make a
// worker wait before the bytes exist: each pickle PREPARE_STORE takes a
// ticket for the bytes its key can carry, and is answered only once the
// tickets held stay within the limit (one is always granted when none is
// held). A ticket is returned when that instance's next COMMIT_STORE with
// data is done, when the instance unregisters, or after ticketTTL (a worker
// that gave up waiting, or never commits, holds nothing for long). The
// wire server's in-flight read stop is the backstop for workers that send
// without waiting.
type pickleGate struct {
	mu      sync.Mutex
	limit   int64
	used    int64
	held    map[int64][]*ticket // per instance, oldest first
	waiting []*ticket           // FIFO
	closed  bool
}

// ticketTTL is how long a granted ticket waits for its commit.
const ticketTTL = 10 * time.Second

// maxWaiting bounds the prepares of one instance waiting for a ticket: a
// worker has a store or a few in flight; past it (a peer sending prepares
// without commits) a prepare is answered at once, unticketed (the wire
// server's in-flight read stop still bounds what its commits hold).
const maxWaiting = 8

type ticket struct {
	instance int64
	bytes    int64
	grant    func() // answers the PREPARE_STORE
	timer    *time.Timer
}

func newPickleGate(limit int64) *pickleGate {
	return &pickleGate{limit: limit, held: map[int64][]*ticket{}}
}

// acquire asks for n bytes for a store of instance; grant runs (on this
// goroutine or a later releaser's) once they are granted.
// A ticket counts at most the limit (a key of a huge range holds no more).
func (g *pickleGate) acquire(instance, n int64, grant func()) {
	t := &ticket{instance: instance, bytes: min(n, g.limit), grant: grant}
	g.mu.Lock()
	waiting := 0
	for _, w := range g.waiting {
		if w.instance == instance {
			waiting++
		}
	}
	if g.closed || g.limit <= 0 || waiting >= maxWaiting {
		g.mu.Unlock()
		grant()
		return
	}
	g.waiting = append(g.waiting, t)
	granted := g.grantLocked()
	g.mu.Unlock()
	run(granted)
}

// grantLocked moves waiting tickets to held, in order, while they fit, and
// returns them for their grants to run outside the lock.
func (g *pickleGate) grantLocked() []*ticket {
	var out []*ticket
	for len(g.waiting) > 0 {
		t := g.waiting[0]
		if g.used != 0 && g.used+t.bytes > g.limit {
			break
		}
		g.waiting[0] = nil
		g.waiting = g.waiting[1:]
		g.used += t.bytes
		g.held[t.instance] = append(g.held[t.instance], t)
		t.timer = time.AfterFunc(ticketTTL, func() { g.expire(t) })
		out = append(out, t)
	}
	return out
}

func run(ts []*ticket) {
	for _, t := range ts {
		t.grant()
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
	run(granted)
}

// expire returns a ticket whose commit never came. Its instance's other
// waiting prepares are answered at once, unticketed: a worker that let a
// ticket lapse is not waiting for the gate (it gave up, or it never meant
// to commit), and it must not hold the line for the others.
func (g *pickleGate) expire(t *ticket) {
	g.mu.Lock()
	held := false
	for _, h := range g.held[t.instance] {
		held = held || h == t
	}
	if !held {
		g.mu.Unlock()
		return
	}
	g.dropLocked(t)
	now := g.takeWaitingLocked(t.instance)
	granted := g.grantLocked()
	g.mu.Unlock()
	run(now)
	run(granted)
}

// takeWaitingLocked removes and returns instance's waiting tickets.
func (g *pickleGate) takeWaitingLocked(instance int64) []*ticket {
	var out []*ticket
	keep := g.waiting[:0]
	for _, t := range g.waiting {
		if t.instance == instance {
			out = append(out, t)
		} else {
			keep = append(keep, t)
		}
	}
	clear(g.waiting[len(keep):])
	g.waiting = keep
	return out
}

// dropLocked returns t if it is still held.
func (g *pickleGate) dropLocked(t *ticket) {
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
	now := g.takeWaitingLocked(instance)
	granted := g.grantLocked()
	g.mu.Unlock()
	run(now)
	run(granted)
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
	g.held, g.used = map[int64][]*ticket{}, 0
	g.mu.Unlock()
	run(now)
}

// setLimit changes the limit (a restart with a new setting); waiting
// prepares that now fit are granted.
func (g *pickleGate) setLimit(limit int64) {
	g.mu.Lock()
	g.limit = limit
	granted := g.grantLocked()
	g.mu.Unlock()
	run(granted)
}

// state is the bytes held and the prepares waiting (for tests and stats).
func (g *pickleGate) state() (used int64, waiting int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.used, len(g.waiting)
}
