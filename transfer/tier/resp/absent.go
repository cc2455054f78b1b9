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
// once (Put forgets the key here).
const absentFor = 100 * time.Millisecond

// maxAbsent bounds the keys remembered.
const maxAbsent = 1 << 14

// absentKeys remembers keys the server said were absent, with when it was
// asked (not answered: an answer that took long is as old as the question).
type absentKeys struct {
	mu sync.Mutex
	m  map[string]time.Time
}

func newAbsentKeys() *absentKeys { return &absentKeys{m: make(map[string]time.Time)} }

// firstFresh returns the index of the first of keys known absent at now,
// len(keys) when none is.
func (a *absentKeys) firstFresh(keys []string, now time.Time) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.m) == 0 {
		return len(keys)
	}
	for i, k := range keys {
		if asked, ok := a.m[k]; ok {
			if now.Sub(asked) < absentFor {
				return i
			}
			delete(a.m, k)
		}
	}
	return len(keys)
}

// add remembers key as absent when asked.
func (a *absentKeys) add(key string, asked time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.m) >= maxAbsent {
		now := time.Now()
		for k, t := range a.m {
			if now.Sub(t) >= absentFor {
				delete(a.m, k)
			}
		}
		if len(a.m) >= maxAbsent {
			clear(a.m)
		}
	}
	a.m[key] = asked
}

// forget drops key (just written by us).
func (a *absentKeys) forget(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.m, key)
}
