package l1

import (
	"time"
	"unsafe"

	"kvdock/core/hostmem"
)

// placementEvery bounds how often the pool's NUMA placement is read: the
// kernel walks every page of the mapping to write numa_maps, so a large
// pool is not read on every 1 s snapshot.
const placementEvery = 30 * time.Second

// placementCache holds the last reading of the pool's NUMA placement.
type placementCache struct {
	at  time.Time
	p   hostmem.Placement
	err string
}

// Placement returns on which NUMA nodes the pool's resident pages live,
// read from /proc/self/numa_maps at most every 30 s (a reading is reused
// until then); err says why it is unknown.
func (p *Pool) Placement() (pl hostmem.Placement, err string) {
	p.numaMu.Lock()
	defer p.numaMu.Unlock()
	now := p.now()
	if !p.numa.at.IsZero() && now.Sub(p.numa.at) < placementEvery && !now.Before(p.numa.at) {
		return p.numa.p, p.numa.err
	}
	start, end, ok := p.span()
	c := placementCache{at: now}
	if !ok {
		c.err = "pool closed"
	} else if got, rerr := hostmem.ReadPlacement("", start, end); rerr != nil {
		c.err = rerr.Error()
	} else {
		c.p = got
	}
	p.numa = c
	return c.p, c.err
}

// span is the address range of the pool's mapping.
func (p *Pool) span() (start, end uintptr, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	mem := p.seg.Bytes()
	if p.closed || len(mem) == 0 {
		return 0, 0, false
	}
	start = uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	return start, start + uintptr(len(mem)), true
}
