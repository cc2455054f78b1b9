package alloc

import (
	"cmp"
	"fmt"
	"slices"
)

// Extent is one allocated byte range, as Alloc handed it out: Size is the
// requested size, rounded up to Align by Carve as by Alloc.
type Extent struct{ Off, Size int64 }

// Carve makes the allocator's state the one where exactly used is allocated
// (a pool adopted from a previous process): every extent must be aligned,
// non-empty, inside the region and overlap no other, else nothing changes
// and the error says which extent is wrong. used is sorted in place.
func (a *Allocator) Carve(used []Extent) error {
	slices.SortFunc(used, func(x, y Extent) int { return cmp.Compare(x.Off, y.Off) })
	var end int64
	for i, e := range used {
		n := a.Round(e.Size)
		switch {
		case e.Size <= 0 || n <= 0:
			return fmt.Errorf("alloc: extent at %d has size %d, want > 0", e.Off, e.Size)
		case e.Off < 0 || e.Off&(a.align-1) != 0:
			return fmt.Errorf("alloc: extent at %d is not aligned to %d", e.Off, a.align)
		case e.Off > a.size || n > a.size-e.Off:
			return fmt.Errorf("alloc: extent [%d, +%d) passes the region of %d bytes", e.Off, n, a.size)
		case i > 0 && e.Off < end:
			return fmt.Errorf("alloc: extent at %d overlaps the one before it, which ends at %d", e.Off, end)
		}
		end = e.Off + n
	}
	a.Reset()
	a.remove(a.byStart[0])
	a.free = 0
	var at int64
	for _, e := range used {
		if e.Off > at {
			a.insert(at, e.Off-at)
			a.free += e.Off - at
		}
		at = e.Off + a.Round(e.Size)
	}
	if at < a.size {
		a.insert(at, a.size-at)
		a.free += a.size - at
	}
	return nil
}
