package l1

import (
	"fmt"

	"kvdock/core/hostmem"
)

// HostMemory reads the host's available memory from /proc/meminfo (Path
// overrides it for tests). It is a settings.MemoryProbe.
type HostMemory struct {
	Path string
}

// MemAvailable is MemAvailable from meminfo in bytes: the memory the kernel
// can give a new allocation without swapping (free plus reclaimable cache;
// /dev/shm pages are not in it).
func (h HostMemory) MemAvailable() (int64, error) {
	m, err := hostmem.ReadMemory(h.Path)
	if err != nil {
		return 0, fmt.Errorf("l1: %w", err)
	}
	return m.Available, nil
}
