package misses

import "testing"

// Carry adds a predecessor's tally to this one, context by context.
func TestTallyCarry(t *testing.T) {
	var c Counts
	c[Evicted] = 3
	old := NewTally()
	old.Add(Context{"m", 1}, &c, 1)
	old.Add(Context{"n", 2}, &c, 0)
	tl := NewTally()
	tl.Add(Context{"m", 1}, &c, 0)
	tl.Carry(old.Report())
	r := tl.Report()
	m, _ := r.For(Context{"m", 1})
	n, _ := r.For(Context{"n", 2})
	if r.Total[Evicted] != 9 || r.TierMissed != 1 || m.Missed[Evicted] != 6 || m.TierMissed != 1 || n.Missed[Evicted] != 3 {
		t.Fatalf("carried tally %+v", r)
	}
}
