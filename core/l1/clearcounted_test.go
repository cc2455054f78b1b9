package l1

import "testing"

// TestClearCountedReportsObjectsAndBytes: the count an operator sees after
// a clear covers every live object (locked ones included, they are gone
// from the cache's view) with its rounded size, and a second clear reports
// nothing, doomed leftovers included.
func TestClearCountedReportsObjectsAndBytes(t *testing.T) {
	p, _ := newPool(t, 8, nil)
	store(t, p, keyRange(0, 2), 100) // rounded up to 4096 each
	store(t, p, keyRange(2, 3), 5000)
	if _, err := p.ReserveWrite(InstanceOwner(2), keyRange(10, 11), 4096); err != nil {
		t.Fatal(err) // a write in flight: doomed by the clear, still counted
	}
	n, b := p.ClearCounted()
	if n != 4 || b != 5*4096 {
		t.Fatalf("ClearCounted = %d objects, %d bytes; want 4, %d", n, b, 5*4096)
	}
	if n, b := p.ClearCounted(); n != 0 || b != 0 {
		t.Fatalf("second ClearCounted = %d, %d; want 0, 0 (doomed objects were already counted)", n, b)
	}
	if s := p.Stats(); s.Objects != 0 {
		t.Fatalf("%d objects left after the clear", s.Objects)
	}
}
