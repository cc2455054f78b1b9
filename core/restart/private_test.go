package restart

import (
	"strings"
	"testing"

	"kvdock/core/l1"
)

// A pool kept in a private segment (--shm-name "") is adopted only by a
// start whose pool is private too: never by a shared plan, named or auto,
// nor the other way round, nor with another size or alignment.
func TestMatchKeepsPrivateAndSharedApart(t *testing.T) {
	private := l1.PrivateSegmentName("localhost", 5555)
	r := sample()
	r.Auto = false
	r.Pool.Segment.Name = private
	w := Want{Endpoint: "localhost:5555", Segment: private, Size: r.Pool.Size, Align: r.Pool.Align}
	if m := Match(r, w); m != "" {
		t.Fatalf("the same private pool refused: %s", m)
	}
	// The kept private segment is adopted whatever its name, as an auto
	// segment is: an endpoint changed in place kept its old name.
	moved := w
	moved.Segment = l1.PrivateSegmentName("localhost", 1)
	if m := Match(r, moved); m != "" {
		t.Fatalf("the kept private pool refused for another private name: %s", m)
	}
	for name, tc := range map[string]struct {
		change func(*Record, *Want)
		want   string
	}{
		"private kept, named plan": {func(_ *Record, w *Want) { w.Segment = "lmcache_l1_pool_x" }, "this start's pool is shared"},
		"private kept, auto plan": {func(_ *Record, w *Want) { w.Auto, w.Segment = true, "lmcache_l1_pool_42" },
			"this start's pool is shared"},
		"shared kept, private plan": {func(r *Record, _ *Want) { r.Pool.Segment.Name = "lmcache_l1_pool_x" }, "this start's pool is private"},
		"auto kept, private plan": {func(r *Record, _ *Want) { r.Auto, r.Pool.Segment.Name = true, "lmcache_l1_pool_42" },
			"this start's pool is private"},
		"size":  {func(_ *Record, w *Want) { w.Size *= 2 }, "l1.size_gb"},
		"align": {func(_ *Record, w *Want) { w.Align *= 2 }, "l1.align_bytes"},
	} {
		r2, w2 := r, w
		tc.change(&r2, &w2)
		if m := Match(r2, w2); m == "" || !strings.Contains(m, tc.want) {
			t.Errorf("%s: Match = %q, want a refusal saying %q", name, m, tc.want)
		}
	}
}
