package l1

import "unsafe"

// Span is the address range of the pool's mapping, for a reading of where
// its pages live (hostmem.PlacementCache); ok is false once Close began.
func (p *Pool) Span() (start, end uintptr, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	mem := p.seg.Bytes()
	if p.closed || len(mem) == 0 {
		return 0, 0, false
	}
	start = uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	return start, start + uintptr(len(mem)), true
}
