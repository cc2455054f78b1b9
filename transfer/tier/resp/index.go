package resp

import (
	"container/list"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// maxIndexEntries bounds the index's memory (about 200 B an entry) whatever
// the value sizes: past it the least recently used entries go, as past the
// byte capacity.
const maxIndexEntries = 1 << 18

// index tracks this host's own values on the server in LRU order, so the
// tier can keep them under max_capacity_gb: each counted at what the server
// says it takes (MEMORY USAGE, see share.go), those of earlier runs adopted
// at start from the copy kept on the server. It is approximate by design:
// the server is shared and not ours (other hosts write under the same
// prefix, Redis's own maxmemory policy or a TTL may drop keys behind our
// back), so it counts what we wrote and evicts what we wrote, least
// recently used first.
type index struct {
	mu       sync.Mutex
	capacity int64
	ttl      time.Duration
	used     int64
	ll       *list.List // front = least recently used
	m        map[string]*list.Element
	swept    time.Time // last pass dropping entries past their TTL
	// tell, when set (tier.ContentNotifier), is told under mu each key
	// confirmed written and each confirmed key dropped.
	tell atomic.Pointer[func(string, bool)]
}

// sweepEvery spaces the passes that drop expired entries from the count.
const sweepEvery = time.Second

type entry struct {
	key     string
	size    int64
	written time.Time
	held    bool // its write was confirmed (an adopted entry never is)
}

func newIndex(capacity int64, ttl time.Duration) *index {
	return &index{capacity: capacity, ttl: ttl, ll: list.New(), m: map[string]*list.Element{}}
}

// reserve records a write of size bytes under key and returns the keys to
// delete from the server to make room (least recently used first; entries
// whose TTL has passed are dropped without a delete, the server did it).
func (x *index) reserve(key string, size int64, now time.Time) ([]string, error) {
	if size > x.capacity {
		return nil, fmt.Errorf("value of %d bytes exceeds the tier's capacity of %d bytes", size, x.capacity)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	held := false
	if el, ok := x.m[key]; ok {
		// A rewrite: the value stays held until this write fails.
		held = el.Value.(*entry).held
		el.Value.(*entry).held = false
		x.drop(el)
	}
	victims := x.trim(size, 1, now)
	x.m[key] = x.ll.PushBack(&entry{key: key, size: size, written: now, held: held})
	x.used += size
	return victims, nil
}

// trim drops the least recently used entries until size more bytes and
// entries more entries fit, and returns the keys to delete from the server
// (entries past their TTL are dropped without a delete: the server did it).
func (x *index) trim(size int64, entries int, now time.Time) []string {
	var victims []string
	for x.ll.Len() > 0 && (x.used+size > x.capacity || x.ll.Len()+entries > maxIndexEntries) {
		e := x.drop(x.ll.Front())
		if x.ttl == 0 || now.Sub(e.written) < x.ttl {
			victims = append(victims, e.key)
		}
	}
	return victims
}

// resize sets key's size to what the server says it takes (the value's
// length was counted until it answered) and returns the keys to delete to
// stay within the capacity. A key no longer indexed stays out.
func (x *index) resize(key string, size int64, now time.Time) []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	el, ok := x.m[key]
	if !ok {
		return nil
	}
	e := el.Value.(*entry)
	x.used += size - e.size
	e.size = size
	return x.trim(0, 0, now)
}

// adopt counts entries of an earlier run (oldest first) as the least
// recently used, except keys written since (their entries are newer), and
// returns the keys to delete to stay within the capacity.
func (x *index) adopt(entries []entry, now time.Time) []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		if _, ok := x.m[e.key]; ok || (x.ttl > 0 && now.Sub(e.written) >= x.ttl) {
			continue
		}
		x.m[e.key] = x.ll.PushFront(&e)
		x.used += e.size
	}
	return x.trim(0, 0, now)
}

func (x *index) drop(el *list.Element) *entry {
	e := x.ll.Remove(el).(*entry)
	delete(x.m, e.key)
	x.used -= e.size
	if f := x.tell.Load(); f != nil && e.held {
		(*f)(e.key, false)
	}
	return e
}

// confirm marks key's write as landed, if key is still indexed (an
// eviction may have overtaken the write).
func (x *index) confirm(key string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	el, ok := x.m[key]
	if !ok || el.Value.(*entry).held {
		return
	}
	el.Value.(*entry).held = true
	if f := x.tell.Load(); f != nil {
		(*f)(key, true)
	}
}

// touch marks key as just used (a hit).
func (x *index) touch(key string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if el, ok := x.m[key]; ok {
		x.ll.MoveToBack(el)
	}
}

// remove forgets key (deleted, failed to write, or found absent).
func (x *index) remove(key string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if el, ok := x.m[key]; ok {
		x.drop(el)
	}
}

// usage returns the bytes and objects this process has in the tier. With a
// TTL, entries the server has expired are dropped first (a pass over the
// index at most once a second, under maxIndexEntries).
func (x *index) usage(now time.Time) (int64, int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.ttl > 0 && now.Sub(x.swept) >= sweepEvery {
		x.swept = now
		for el := x.ll.Front(); el != nil; {
			next := el.Next()
			if now.Sub(el.Value.(*entry).written) >= x.ttl {
				x.drop(el)
			}
			el = next
		}
	}
	return x.used, int64(x.ll.Len())
}
