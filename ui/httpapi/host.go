package httpapi

import "kvdock/core/hostmem"

// HostStatus is the host's RAM and where the pool's pages live.
type HostStatus struct {
	// MemoryTotalBytes and MemoryAvailableBytes come from /proc/meminfo
	// (-1 when it could not be read; MemoryError says why).
	MemoryTotalBytes     int64  `json:"memory_total_bytes"`
	MemoryAvailableBytes int64  `json:"memory_available_bytes"`
	MemoryError          string `json:"memory_error,omitempty"`
	NUMANodes            int    `json:"numa_nodes"`
	// PoolNUMA says in words where the pool's pages live ("single-node",
	// or each node's share); PoolPagesByNode is resident pages by node
	// number, read only on a host of several nodes.
	PoolNUMA        string  `json:"pool_numa"`
	PoolPagesByNode []int64 `json:"pool_pages_by_node"`
	PoolNUMAError   string  `json:"pool_numa_error,omitempty"`
}

func hostStatus(h hostmem.Host) HostStatus {
	pages := h.Pool.Pages
	if pages == nil {
		pages = []int64{}
	}
	return HostStatus{MemoryTotalBytes: h.Total, MemoryAvailableBytes: h.Available, MemoryError: h.MemoryErr,
		NUMANodes: h.Nodes, PoolNUMA: h.Where(), PoolPagesByNode: pages, PoolNUMAError: h.PoolErr}
}
