package whatif

import (
	"testing"

	"kvdock/core/keys"
)

// ResetCounts empties the curve but keeps what the pools hold: a key
// stored before the reset is still a hit after it.
func TestResetCountsKeepsContent(t *testing.T) {
	e := New(Options{PoolBytes: 1 << 20, MinSamples: 64, MaxSamples: 64})
	ks := make([]keys.ObjectKey, 16)
	for i := range ks {
		ks[i] = testKey(uint64(i), "m")
	}
	for i := range ks {
		e.Stored(&ks[i], 1024)
	}
	var p Prefix
	e.Probe(&p, ks, len(ks))
	if c := e.Curve(); c.Sampled == 0 || len(c.Points) == 0 {
		t.Fatalf("no curve before the reset: %+v", c)
	}
	e.ResetCounts()
	if c := e.Curve(); c.Sampled != 0 || c.Weight != 0 || len(c.Points) != 0 {
		t.Fatalf("curve after the reset: %+v, want empty", c)
	}
	p = Prefix{}
	e.Probe(&p, ks, len(ks))
	c := e.Curve()
	if c.Sampled != uint64(len(ks)) || len(c.Points) == 0 || c.Points[3].HitRatio < 0.99 || c.Measured < 0.99 {
		t.Fatalf("curve after the reset and a reuse: %+v, want every key a hit at 1× (as measured)", c)
	}
}
