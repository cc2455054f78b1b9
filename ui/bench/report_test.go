package bench

import (
	"math"
	"testing"
	"time"
)

func us(vs ...int) []time.Duration {
	ds := make([]time.Duration, len(vs))
	for i, v := range vs {
		ds[i] = time.Duration(v) * time.Microsecond
	}
	return ds
}

// TestPercentileNearestRank checks the nearest-rank definition: the p-th
// percentile of n samples is the ceil(p/100·n)-th smallest (1-based).
func TestPercentileNearestRank(t *testing.T) {
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // given unsorted: 100 … 1 µs
	}
	for _, tc := range []struct {
		name string
		ds   []time.Duration
		p    float64
		want float64
	}{
		{"empty", nil, 50, 0},
		{"one sample p50", us(7), 50, 7},
		{"one sample p99", us(7), 99, 7},
		{"two samples p50 is the first", us(20, 10), 50, 10},
		{"two samples p99 is the second", us(20, 10), 99, 20},
		{"ten samples p50 is the 5th", us(10, 9, 8, 7, 6, 5, 4, 3, 2, 1), 50, 5},
		{"ten samples p99 is the 10th", us(10, 9, 8, 7, 6, 5, 4, 3, 2, 1), 99, 10},
		{"ten samples p10 is the 1st", us(10, 9, 8, 7, 6, 5, 4, 3, 2, 1), 10, 1},
		{"ten samples p11 is the 2nd", us(10, 9, 8, 7, 6, 5, 4, 3, 2, 1), 11, 2},
		{"hundred samples p50", us(hundred...), 50, 50},
		{"hundred samples p99", us(hundred...), 99, 99},
		{"hundred samples p100", us(hundred...), 100, 100},
		{"p0 is the smallest", us(3, 1, 2), 0, 1},
		{"above p100 is the largest", us(3, 1, 2), 150, 3},
		{"fractions of a microsecond", []time.Duration{1500, 2500}, 50, 1.5},
	} {
		if got := percentileUS(tc.ds, tc.p); got != tc.want {
			t.Errorf("%s: percentileUS(p%g) = %g, want %g", tc.name, tc.p, got, tc.want)
		}
	}
	ds := us(3, 1, 2)
	percentileUS(ds, 50)
	if ds[0] != 3*time.Microsecond || ds[1] != time.Microsecond {
		t.Errorf("percentileUS sorted its argument in place: %v", ds)
	}
}

func TestRatio(t *testing.T) {
	for _, tc := range []struct{ a, b, want float64 }{
		{3, 4, 0.75},
		{4, 3, 1.3333},
		{1, 0, 0},
		{1, -1, 0},
		{0, 5, 0},
	} {
		if got := ratio(tc.a, tc.b); got != tc.want {
			t.Errorf("ratio(%g, %g) = %g, want %g", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestNewTarget(t *testing.T) {
	for _, tc := range []struct {
		value, target float64
		op            string
		met           bool
		shown         float64
	}{
		{0.9, 0.9, ">=", true, 0.9},
		{0.89, 0.9, ">=", false, 0.89},
		{64, 64, "<=", true, 64},
		{64.5, 64, "<=", false, 64.5},
		{math.NaN(), 0, "<=", false, -1},
		{math.Inf(1), 0.8, ">=", false, -1},
		{0.123456, 0.1, ">=", true, 0.1235},
	} {
		got := newTarget("x", tc.value, tc.op, tc.target)
		if got.Met != tc.met || got.Value != tc.shown || got.Op != tc.op || got.Target != tc.target {
			t.Errorf("newTarget(%g %s %g) = %+v, want met %v value %g", tc.value, tc.op, tc.target, got, tc.met, tc.shown)
		}
	}
}

// TestFinishRatios checks every ratio finish derives, with each figure and
// each reference a different number so that a swapped operand or a wrong
// reference shows; the per-mode echoes measured in turns win over the
// run's references, which stand in only where a mode has none.
func TestFinishRatios(t *testing.T) {
	ref := References{
		MemcpyGBps: 10, MemcpySegmentGBps: 8, EchoLargeGBps: 4,
		EchoNoopRTPS: 1000, EchoLookupRTPS: 500,
		EchoNoopLoadedRTPS: 400, EchoLookupLoadedRTPS: 200,
	}
	shm := &ModeResult{
		Mode: "shm", StoreGBps: 6, RetrieveGBps: 7, MemcpyFromSegmentGBps: 14,
		NoopRTPS: 900, LookupRTPS: 300, NoopLoadedRTPS: 330, LookupLoadedRTPS: 120,
		EchoNoopRTPS: 1200, EchoLookupRTPS: 600, EchoNoopLoadedRTPS: 550, EchoLookupLoadedRTPS: 240,
	}
	// Pickle has no echoes of its own: the references stand in.
	pickle := &ModeResult{
		Mode: "pickle", StoreGBps: 3, RetrieveGBps: 2,
		NoopRTPS: 800, LookupRTPS: 250, NoopLoadedRTPS: 100, LookupLoadedRTPS: 50,
	}
	r := &Result{References: ref, SHM: shm, Pickle: pickle}
	r.finish()

	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"shm noop", shm.NoopRatio, 0.75},                                // 900/1200
		{"shm lookup", shm.LookupRatio, 0.5},                             // 300/600
		{"shm noop loaded", shm.NoopLoadedRatio, 0.6},                    // 330/550
		{"shm lookup loaded", shm.LookupLoadedRatio, 0.5},                // 120/240
		{"shm noop loaded vs alone", shm.NoopLoadedVsEchoAlone, 0.275},   // 330/1200
		{"shm lookup loaded vs alone", shm.LookupLoadedVsEchoAlone, 0.2}, // 120/600
		{"shm store vs private", shm.StoreVsPrivate, 0.6},                // 6/10
		{"shm retrieve vs private", shm.RetrieveVsPrivate, 0.7},          // 7/10
		{"shm retrieve vs from segment", shm.RetrieveVsFromSegment, 0.5}, // 7/14
		{"shm store", shm.StoreRatio, 0.75},                              // 6/8
		{"shm retrieve", shm.RetrieveRatio, 0.875},                       // 7/8

		{"pickle noop", pickle.NoopRatio, 0.8},                                 // 800/1000
		{"pickle lookup", pickle.LookupRatio, 0.5},                             // 250/500
		{"pickle noop loaded", pickle.NoopLoadedRatio, 0.25},                   // 100/400
		{"pickle lookup loaded", pickle.LookupLoadedRatio, 0.25},               // 50/200
		{"pickle noop loaded vs alone", pickle.NoopLoadedVsEchoAlone, 0.1},     // 100/1000
		{"pickle lookup loaded vs alone", pickle.LookupLoadedVsEchoAlone, 0.1}, // 50/500
		{"pickle store", pickle.StoreRatio, 0.75},                              // 3/4
		{"pickle retrieve", pickle.RetrieveRatio, 0.5},                         // 2/4
	} {
		if c.got != c.want {
			t.Errorf("%s ratio = %g, want %g", c.name, c.got, c.want)
		}
	}
	if shm.ReferenceName != "memcpy_segment" || pickle.ReferenceName != "zmq_echo_large" {
		t.Errorf("reference names %q, %q", shm.ReferenceName, pickle.ReferenceName)
	}

	targets := map[string]Target{}
	for _, tg := range r.Targets {
		targets[tg.Name] = tg
	}
	for name, want := range map[string]float64{
		"shm.store_vs_memcpy_segment":                           0.75,
		"shm.noop_under_store_vs_echo_under_stream":             0.6,
		"pickle.lookup_status_under_store_vs_echo_under_stream": 0.25,
		"checksum_mismatches":                                   0,
	} {
		if tg, ok := targets[name]; !ok || tg.Value != want {
			t.Errorf("target %s = %+v (present %v), want value %g", name, tg, ok, want)
		}
	}
}

// TestFinishWithoutSegmentReference: where the copy into segment pages
// could not be measured, SHM is judged against private memcpy.
func TestFinishWithoutSegmentReference(t *testing.T) {
	shm := &ModeResult{Mode: "shm", StoreGBps: 5, RetrieveGBps: 2}
	r := &Result{References: References{MemcpyGBps: 10}, SHM: shm}
	r.finish()
	if shm.ReferenceName != "memcpy" || shm.StoreRatio != 0.5 || shm.RetrieveRatio != 0.2 {
		t.Errorf("got reference %q store %g retrieve %g", shm.ReferenceName, shm.StoreRatio, shm.RetrieveRatio)
	}
}
