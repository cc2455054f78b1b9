package resp

import (
	"sync"
	"time"
)

// absentFor is how long a server's "absent" answer for a key is trusted.
// A scheduler asks about the same waiting request's prefix at every step,
// and every lookup of a prefix no tier holds costs an EXISTS round trip to a
// server that may be busy taking 32 MiB values (milliseconds each, measured
// with redis-cli --latency under the bench's write load): within this
// window the answer comes from memory. The price: a chunk another host
// writes meanwhile is seen up to absentFor later. Our own writes are seen at
// once (Put forgets the key here, and an answer asked for before that write
// is not remembered).
const absentFor = 100 * time.Millisecond

// refreshAfter is the age at which a remembered answer that a lookup relies
// on is asked again in the background (see Tier.KnownAbsent): a prefix that
// keeps being looked up stays answered from memory, and the answer is never
// older than absentFor.
const refreshAfter = absentFor / 2

// maxAbsent bounds the keys remembered.
const maxAbsent = 1 << 14

// absentKeys remembers keys the server said were absent, with when it was
// asked (not answered: an answer that took long is as old as the question).
type absentKeys struct {
	mu sync.Mutex
	m  map[string]absentEntry
	// writes counts forget calls: an answer asked for before one of our
	// writes may predate that write, so it is not remembered (see add).
	writes uint64
}

type absentEntry struct {
	asked      time.Time
	refreshing bool // a background EXISTS for the key is under way
}

func newAbsentKeys() *absentKeys { return &absentKeys{m: make(map[string]absentEntry)} }

// question is what add needs to know of the moment an EXISTS was asked.
type question struct {
	at     time.Time
	writes uint64
}

// ask marks the moment a question is sent to the server.
func (a *absentKeys) ask() question {
	a.mu.Lock()
	defer a.mu.Unlock()
	return question{at: time.Now(), writes: a.writes}
}

// firstFresh returns the index of the first of keys known absent at now,
// len(keys) when none is.
func (a *absentKeys) firstFresh(keys []string, now time.Time) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.m) == 0 {
		return len(keys)
	}
	for i, k := range keys {
		if e, ok := a.m[k]; ok {
			if now.Sub(e.asked) < absentFor {
				return i
			}
			delete(a.m, k)
		}
	}
	return len(keys)
}

// knownAbsent tells whether key is known absent at now; refresh is true
// when the caller should ask the server again in the background (the answer
// is past refreshAfter and nobody is asking yet). The caller that gets
// refresh true must end it with add or drop.
func (a *absentKeys) knownAbsent(key string, now time.Time) (absent, refresh bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.m[key]
	if !ok {
		return false, false
	}
	age := now.Sub(e.asked)
	if age >= absentFor {
		delete(a.m, key)
		return false, false
	}
	if age >= refreshAfter && !e.refreshing {
		e.refreshing = true
		a.m[key] = e
		return true, true
	}
	return true, false
}

// add remembers key as absent as of q, unless one of our own writes came
// after q was asked (the answer may predate it).
func (a *absentKeys) add(key string, q question) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.writes != q.writes {
		if e, ok := a.m[key]; ok && e.refreshing {
			e.refreshing = false
			a.m[key] = e
		}
		return
	}
	if len(a.m) >= maxAbsent {
		now := time.Now()
		for k, e := range a.m {
			if now.Sub(e.asked) >= absentFor && !e.refreshing {
				delete(a.m, k)
			}
		}
		if len(a.m) >= maxAbsent {
			clear(a.m)
		}
	}
	a.m[key] = absentEntry{asked: q.at}
}

// drop ends a background refresh of key that got no answer: the entry it
// refreshes ages out as it would have.
func (a *absentKeys) drop(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if e, ok := a.m[key]; ok && e.refreshing {
		e.refreshing = false
		a.m[key] = e
	}
}

// present drops key: the server now has it (another host wrote it).
func (a *absentKeys) present(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.m, key)
}

// forget drops key (just written by us).
func (a *absentKeys) forget(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.writes++
	delete(a.m, key)
}
