package l1

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"kvdock/core/keys"
)

// mobj is the reference model of one object.
type mobj struct {
	write    bool // write-locked, else ready
	readers  int
	deadline time.Time
	size     int64
}

// model is a deliberately naive reference: a map and the rules of spec 5.4.
type model struct {
	objs             map[keys.ObjectKey]*mobj
	wttl, rttl       time.Duration
	now              time.Time
	align            int64
	poolSize         int64
	evictionsAllowed bool
}

func (m *model) expire() {
	for k, o := range m.objs {
		if !m.now.Before(o.deadline) {
			if o.write {
				delete(m.objs, k)
			} else {
				o.readers = 0
			}
		}
	}
}

func (m *model) evictable(o *mobj) bool { return !o.write && o.readers == 0 }

// TestRandomAgainstModel runs thousands of random operation sequences on a
// small pool and, after every step, checks the pool against the model and
// its own invariants: live allocations aligned, inside the pool and
// disjoint; used bytes equal the sum of live objects; lock counts and the
// LRU list consistent; evictions only of unlocked objects. Each sequence
// ends by draining every lock the model holds; no lock may remain.
func TestRandomAgainstModel(t *testing.T) {
	const (
		sequences = 2000
		steps     = 60
		universe  = 48
		align     = 64
		units     = 40
	)
	for seq := range sequences {
		r := rand.New(rand.NewPCG(uint64(seq), 99))
		c := newClock()
		policy := PolicyLRU
		if seq%4 == 3 {
			policy = PolicyNoop
		}
		p, err := Open(Options{Size: units * align, Align: align, Now: c.Now, Policy: policy,
			WriteTTL: 600 * time.Second, ReadTTL: 300 * time.Second, Watermark: 0.7, Ratio: 0.25})
		if err != nil {
			t.Fatal(err)
		}
		m := &model{objs: map[keys.ObjectKey]*mobj{}, wttl: 600 * time.Second, rttl: 300 * time.Second,
			align: align, poolSize: units * align}
		pick := func() []keys.ObjectKey {
			n := 1 + r.IntN(6)
			ks := make([]keys.ObjectKey, n)
			for i := range ks {
				ks[i] = modelKey(r.IntN(universe))
			}
			return ks
		}
		var trace []string
		fail := func(format string, args ...any) {
			t.Helper()
			p.Close()
			t.Fatalf("sequence %d after %v: %s", seq, trace, fmt.Sprintf(format, args...))
		}
		for range steps {
			m.now = c.Now()
			m.expire()
			m.evictionsAllowed = false
			op := r.IntN(12)
			ks := pick()
			switch op {
			case 0, 1, 2: // ReserveWrite
				size := int64(1 + r.IntN(3*align))
				trace = append(trace, fmt.Sprintf("W%d/%d", len(ks), size))
				var want []int
				for i, k := range ks {
					if _, ok := m.objs[k]; ok || slices.ContainsFunc(want, func(j int) bool { return ks[j] == k }) {
						continue
					}
					want = append(want, i)
				}
				m.evictionsAllowed = true
				res, err := p.ReserveWrite(ks, size)
				if err != nil {
					if !errors.Is(err, ErrNoSpace) {
						fail("ReserveWrite: %v", err)
					}
					for _, i := range want {
						if present(p, ks[i]) {
							fail("failed batch left key %d reserved", i)
						}
					}
					break
				}
				if len(res) != len(want) {
					fail("reserved %d, model wants %d", len(res), len(want))
				}
				for j, rv := range res {
					if rv.Index != want[j] || rv.Key != ks[want[j]] || rv.Length != size {
						fail("reservation %d = %+v, want index %d", j, rv, want[j])
					}
					m.objs[rv.Key] = &mobj{write: true, deadline: m.now.Add(m.wttl), size: size}
				}
			case 3: // FinishWrite
				trace = append(trace, "F")
				p.FinishWrite(ks)
				for _, k := range ks {
					if o, ok := m.objs[k]; ok && o.write {
						o.write = false
					}
				}
			case 4: // AbortWrite
				trace = append(trace, "A")
				p.AbortWrite(ks)
				for _, k := range ks {
					if o, ok := m.objs[k]; ok && o.write {
						delete(m.objs, k)
					}
				}
			case 5, 6: // ReserveReadPrefix
				count := 1 + r.IntN(3)
				trace = append(trace, fmt.Sprintf("R%d", count))
				want := 0
				for _, k := range ks {
					o, ok := m.objs[k]
					if !ok || o.write {
						break
					}
					want++
				}
				if got := p.ReserveReadPrefix(ks, count); got != want {
					fail("ReserveReadPrefix = %d, model %d", got, want)
				}
				for _, k := range ks[:want] {
					o := m.objs[k]
					o.readers += count
					o.deadline = m.now.Add(m.rttl)
				}
			case 7: // FinishRead
				count := 1 + r.IntN(2)
				trace = append(trace, fmt.Sprintf("f%d", count))
				p.FinishRead(ks, count)
				for _, k := range ks {
					if o, ok := m.objs[k]; ok && !o.write {
						o.readers = max(0, o.readers-count)
					}
				}
			case 8: // Delete
				trace = append(trace, "D")
				want := 0
				for _, k := range ks {
					if o, ok := m.objs[k]; ok && m.evictable(o) {
						delete(m.objs, k)
						want++
					}
				}
				if got := p.Delete(ks); got != want {
					fail("Delete = %d, model %d", got, want)
				}
			case 9: // time passes; sometimes past a TTL
				d := time.Duration(r.IntN(400)) * time.Second
				trace = append(trace, fmt.Sprintf("+%v", d))
				c.Add(d)
			case 10: // eviction loop
				trace = append(trace, "L")
				m.evictionsAllowed = true
				p.maintain()
			case 11:
				if r.IntN(10) == 0 {
					trace = append(trace, "C")
					if got := p.Clear(); got != len(m.objs) {
						fail("Clear = %d, model %d", got, len(m.objs))
					}
					clear(m.objs)
				} else {
					trace = append(trace, "T")
					p.Touch(ks)
				}
			}
			if msg := check(p, m); msg != "" {
				fail("%s", msg)
			}
		}
		// Drain every lock the model holds.
		m.now = c.Now()
		m.expire()
		for k, o := range m.objs {
			if o.write {
				p.FinishWrite([]keys.ObjectKey{k})
				o.write = false
			}
			if o.readers > 0 {
				p.FinishRead([]keys.ObjectKey{k}, o.readers)
				o.readers = 0
			}
		}
		if msg := check(p, m); msg != "" {
			fail("after draining: %s", msg)
		}
		if s := p.Stats(); s.WriteLocked != 0 || s.ReadLocked != 0 {
			fail("lock leak after draining: %+v", s)
		}
		p.mu.Lock()
		leaked := len(p.t.locked)
		p.mu.Unlock()
		if leaked != 0 {
			fail("%d records left in the locked set", leaked)
		}
		p.Close()
	}
}

func modelKey(i int) keys.ObjectKey {
	k := key(i % 16)
	k.Model = []string{"a", "b", "c"}[i/16%3] // three models share chunk hashes
	if i%5 == 0 {
		k.Salt = "s"
	}
	return k
}

// check compares the pool with the model; evictions of unlocked objects are
// applied to the model when the last operation allowed them.
func check(p *Pool, m *model) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := m.now.UnixNano()
	p.sweep(now) // applies due TTLs, as the model did
	for k, o := range m.objs {
		if p.t.find(k) != nilRec {
			continue
		}
		if !m.evictionsAllowed || !m.evictable(o) {
			return fmt.Sprintf("object %v (write=%v readers=%d) vanished", k, o.write, o.readers)
		}
		delete(m.objs, k) // evicted
	}
	if len(p.t.index) != len(m.objs) {
		return fmt.Sprintf("pool has %d objects, model %d", len(p.t.index), len(m.objs))
	}
	type span struct{ off, end int64 }
	var spans []span
	var used int64
	writeLocked, readLocked := 0, 0
	for k, o := range m.objs {
		i := p.t.find(k)
		rec := p.t.recs[i]
		if rec.off%m.align != 0 || rec.off < 0 || rec.off+rec.length > m.poolSize || rec.length != o.size {
			return fmt.Sprintf("object %v at [%d,+%d) misaligned, outside the pool or wrong size", k, rec.off, rec.length)
		}
		if (rec.state == stateWrite) != o.write || int(rec.readers) != o.readers {
			return fmt.Sprintf("object %v: state %d readers %d, model write=%v readers=%d", k, rec.state, rec.readers, o.write, o.readers)
		}
		_, inLocked := p.t.locked[i]
		if inLocked != (o.write || o.readers > 0) {
			return fmt.Sprintf("object %v: locked-set membership %v", k, inLocked)
		}
		if o.write {
			writeLocked++
		}
		if o.readers > 0 {
			readLocked++
		}
		rounded := (rec.length + m.align - 1) / m.align * m.align
		used += rounded
		spans = append(spans, span{rec.off, rec.off + rounded})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].off < spans[j].off })
	for i := 1; i < len(spans); i++ {
		if spans[i].off < spans[i-1].end {
			return fmt.Sprintf("allocations overlap: %v and %v", spans[i-1], spans[i])
		}
	}
	if got := p.alloc.Size() - p.alloc.Free(); got != used {
		return fmt.Sprintf("used bytes %d, live objects sum to %d", got, used)
	}
	if p.t.writeLocked != writeLocked || p.t.readLocked != readLocked {
		return fmt.Sprintf("lock counters %d/%d, model %d/%d", p.t.writeLocked, p.t.readLocked, writeLocked, readLocked)
	}
	n := 0
	for i, prev := p.t.mru, int32(nilRec); i != nilRec; prev, i = i, p.t.recs[i].next {
		if p.t.recs[i].prev != prev {
			return "LRU list links broken"
		}
		n++
	}
	if n != len(m.objs) {
		return fmt.Sprintf("LRU list holds %d objects, table %d", n, len(m.objs))
	}
	return ""
}
