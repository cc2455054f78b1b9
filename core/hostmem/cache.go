package hostmem

import (
	"fmt"
	"sync"
	"time"
)

// Probe reads the host's available memory from a meminfo file (Path; "" =
// /proc/meminfo). It is a settings.MemoryProbe.
type Probe struct {
	Path string
}

// MemAvailable is MemAvailable from meminfo in bytes: the memory the kernel
// can give a new allocation without swapping (free plus reclaimable cache;
// /dev/shm pages are not in it).
func (p Probe) MemAvailable() (int64, error) {
	m, err := ReadMemory(p.Path)
	if err != nil {
		return 0, fmt.Errorf("available memory: %w", err)
	}
	return m.Available, nil
}

// PlacementEvery bounds how often PlacementCache reads numa_maps: the kernel
// walks every page of the mapping to write it, so a large pool is not read
// on every 1 s snapshot.
const PlacementEvery = 30 * time.Second

// PlacementCache holds the last reading of one mapping's NUMA placement and
// reuses it for PlacementEvery. The zero value is ready; it is safe for
// concurrent use.
type PlacementCache struct {
	mu  sync.Mutex
	at  time.Time
	p   Placement
	err string
}

// Read returns on which nodes the resident pages of the mapping span names
// live, read from /proc/self/numa_maps unless the last reading is younger
// than PlacementEvery at now; err says why it is unknown (span not ok: the
// mapping is gone).
func (c *PlacementCache) Read(now time.Time, span func() (start, end uintptr, ok bool)) (p Placement, err string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && now.Sub(c.at) < PlacementEvery && !now.Before(c.at) {
		return c.p, c.err
	}
	c.at, c.p, c.err = now, Placement{}, ""
	start, end, ok := span()
	if !ok {
		c.err = "pool closed"
	} else if got, rerr := ReadPlacement("", start, end); rerr != nil {
		c.err = rerr.Error()
	} else {
		c.p = got
	}
	return c.p, c.err
}
