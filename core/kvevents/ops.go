package kvevents

import (
	"slices"
	"sync"
	"sync/atomic"

	"kvdock/core/keys"
)

// The data path's calls (the pool observer's Stored, Lost and Cleared, the
// transfer module's Commit, a prefetch's Loaded, a tier's Stored and Lost)
// do not change the announced sets themselves: each appends an op, in call
// order, and the ops are applied later, in that order, under the tracker's
// mutex: by the publisher before it flushes, by every reader (Stats, Since,
// Sync, Describe, Flush) before it reads, and, once asyncOps wait, by a
// goroutine of their own. Applying them in one order is applying them as
// they came, so what is announced is what the calls made, only later; the
// request that made them is answered first (the work of a store's chunks,
// a few µs each, was on its reply's path and under the pool's mutex).

// Bounds of the waiting ops. Past asyncOps a goroutine applies them (the
// only applier when no publisher runs, --kv-event-log-size without a
// stream); past maxOps or maxOpTokens (a commit's ops hold its tokens) the
// caller applies them itself, so a starved applier costs bounded memory.
const (
	asyncOps    = 512
	maxOps      = 1 << 16
	maxOpTokens = 4 << 20
)

type opKind uint8

const (
	opStored opKind = iota
	opLost
	opCleared
	opCommit
	opLoaded
	opTierStored
	opTierLost
	opRegistered
)

// op is one data-path call waiting to be applied.
type op struct {
	kind opKind
	k    keys.ObjectKey   // opStored, opLost, opTier*
	c    *Commit          // opCommit: owned (Tokens copied)
	ks   []keys.ObjectKey // opLoaded: owned
	v    *Tiers           // opTier*
	i    int              // opTier*: the tier
	r    *registration    // opRegistered
}

// opQueue holds the waiting ops; only its own mutex guards it, so the data
// path never waits for an applier.
type opQueue struct {
	mu     sync.Mutex
	ops    []op
	spare  []op // the slice the last apply emptied
	tokens int  // tokens held by the waiting commits
	// held (Hold) keeps the ops after the first holdAt waiting until
	// Release; under mu, so that a Hold never waits for an applier.
	held   bool
	holdAt int
	// applying is set while an asynchronous applier runs.
	applying atomic.Bool
}

// isHeld reports whether a Hold is in force.
func (q *opQueue) isHeld() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.held
}

// push queues o (holding tokens tokens) and wakes the publisher when the
// queue was empty; past the bounds it applies the queue on the caller.
func (t *Tracker) push(o op, tokens int) {
	q := &t.ops
	q.mu.Lock()
	first := len(q.ops) == 0
	q.ops = append(q.ops, o)
	q.tokens += tokens
	n, toks := len(q.ops), q.tokens
	q.mu.Unlock()
	switch {
	case n >= maxOps || toks >= maxOpTokens:
		// Held or not (Hold): memory stays bounded and the sets exact,
		// though a chunk may then be announced before a re-announcement
		// in progress ends.
		t.mu.Lock()
		t.apply(true)
		t.mu.Unlock()
	case n >= asyncOps:
		if q.applying.CompareAndSwap(false, true) {
			go t.applyAsync()
		}
	case first && !t.opt.NoStream:
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
}

// applyAsync applies the waiting ops until fewer than asyncOps wait.
func (t *Tracker) applyAsync() {
	for {
		t.mu.Lock()
		held := t.ops.isHeld()
		t.applyLocked()
		t.mu.Unlock()
		t.ops.applying.Store(false)
		if held {
			return // Release applies them
		}
		t.ops.mu.Lock()
		n := len(t.ops.ops)
		t.ops.mu.Unlock()
		if n < asyncOps || !t.ops.applying.CompareAndSwap(false, true) {
			return
		}
	}
}

// Sync applies every op the data path queued so far: what is read after it
// reflects every call made before it. While held (Hold) it waits for
// Release, so that a poll of the log after a restart reads the
// re-announcement.
func (t *Tracker) Sync() {
	t.lockSynced()
	t.mu.Unlock()
}

// SyncUnlessHeld is Sync, except that while a Hold is in force it returns
// at once, applying nothing: for figures that may lag (the poll log's
// Stats), never for reads.
func (t *Tracker) SyncUnlessHeld() {
	if t.ops.isHeld() {
		return
	}
	t.mu.Lock()
	if !t.ops.isHeld() {
		t.applyLocked()
	}
	t.mu.Unlock()
}

// lockSynced locks t.mu once no Hold is in force and applies the waiting
// ops; the caller unlocks.
func (t *Tracker) lockSynced() {
	t.mu.Lock()
	for t.ops.isHeld() {
		t.unheld.Wait()
	}
	t.applyLocked()
}

// waiting is how many ops wait, and the tokens they hold.
func (t *Tracker) waiting() (ops, tokens int) {
	t.ops.mu.Lock()
	defer t.ops.mu.Unlock()
	return len(t.ops.ops), t.ops.tokens
}

// Hold stops the data path's ops queued after it from being applied
// (they wait, in order) until Release: a restart's re-announcement of the
// adopted pool (Reannounce) then runs while the new process serves, and
// its chunks still lead the stream, before any change the data path made
// after Hold. The ops queued before it (the adoption's, the restored
// registrations) are applied by the next applier, the re-announcement at
// the latest, not by Hold, which never waits for an applier: it is on the
// restart's gap. While held, Stats counts the stream as behind (Queued >
// 0).
func (t *Tracker) Hold() {
	q := &t.ops
	q.mu.Lock()
	defer q.mu.Unlock()
	q.held, q.holdAt = true, len(q.ops)
}

// Release ends Hold and applies what the data path queued meanwhile.
func (t *Tracker) Release() {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := &t.ops
	q.mu.Lock()
	q.held, q.holdAt = false, 0
	q.mu.Unlock()
	t.applyLocked()
	t.unheld.Broadcast()
}

// applyLocked applies the waiting ops in their order, while held (Hold)
// only those queued before it; t.mu is held, so two appliers never apply
// two parts of the queue out of order.
func (t *Tracker) applyLocked() { t.apply(false) }

// apply is applyLocked, held or not when force is set.
func (t *Tracker) apply(force bool) {
	q := &t.ops
	q.mu.Lock()
	n := len(q.ops)
	if q.held && !force {
		n = min(n, q.holdAt)
	}
	if n == 0 {
		q.mu.Unlock()
		return
	}
	all := q.ops
	ops := all[:n]
	if n == len(all) {
		q.ops, q.tokens = q.spare[:0], 0
	} else {
		// The ops after the hold stay queued, in a slice of their own.
		q.ops = append(q.spare[:0], all[n:]...)
		for i := range ops {
			if ops[i].c != nil {
				q.tokens -= len(ops[i].c.Tokens)
			}
		}
	}
	q.spare, q.holdAt = nil, max(q.holdAt-n, 0)
	q.mu.Unlock()
	for i := range ops {
		o := &ops[i]
		switch o.kind {
		case opStored:
			t.storedLocked(&o.k)
		case opLost:
			ek := keyOf(&o.k)
			if n := t.l1.nodes[ek]; n != nil {
				t.lostLocked(t.l1, ek, n, &o.k)
			}
		case opCleared:
			t.removeAll(t.l1)
		case opCommit:
			t.commitLocked(o.c)
		case opLoaded:
			t.loadedLocked(o.ks)
		case opTierStored:
			o.v.storedLocked(o.i, &o.k)
		case opTierLost:
			o.v.lostLocked(o.i, &o.k)
		case opRegistered:
			t.registeredLocked(o.r)
		}
	}
	clear(all) // the commits' tokens and keys go with them (those left were copied)
	q.mu.Lock()
	if q.spare == nil && cap(all) <= maxOps {
		q.spare = all[:0]
	}
	q.mu.Unlock()
}

// pushCommit queues c, whose slices the tracker takes: its tokens are
// copied (they are the request's), the rest is the caller's no more.
func (t *Tracker) pushCommit(c Commit) {
	c.Tokens = slices.Clone(c.Tokens)
	t.push(op{kind: opCommit, c: &c}, len(c.Tokens))
}
