package dashboard

import (
	"strings"
	"testing"

	"kvdock/core/engine"
	"kvdock/core/rpc"
	"kvdock/core/series"
	"kvdock/settings"
)

// TestLatencyBlock: the Events pane heads with each request kind seen in
// the last minute, busiest first, its requests per second, the p50 of its
// seconds weighted by their requests and the p99 of its worst second; a
// kind idle for the last minute is not listed.
func TestLatencyBlock(t *testing.T) {
	f := newFakeEngine(t)
	f.snap.Rates.Latency["GET_CHUNK_SIZE"] = engine.LatencyRates{
		Rate: series.Window{Fine: []float64{0, 1, 3}}, P50: series.Window{Fine: []float64{9, 0.001, 0.003}},
		P99: series.Window{Fine: []float64{9, 0.004, 0.002}}}
	m := newTestModel(t, f, 80, 30)
	press(t, m, "4")
	s := trimRight(screen(m))
	mustContain(t, s,
		"REQUEST, LAST MIN        REQ/S  P50 AVG  P99 MAX   P99 EACH SECOND · last 29s",
		"QUERY_PREFETCH_STATUS     31.0    30 µs   216 µs   ",
		"LOOKUP                    10.0    80 µs   5.0 ms   ",
		"GET_CHUNK_SIZE            1.33   2.5 ms   4.0 ms   ",
		"instance 9001 uses PICKLE")
	mustNotContain(t, s, "REGISTER_KV_CACHE_NON_GPU_CONTEXT", "NOOP")
	if a, b := strings.Index(s, "QUERY_PREFETCH_STATUS"), strings.Index(s, "PREPARE_RETRIEVE"); a < 0 || b < a {
		t.Errorf("kinds not busiest first:\n%s", s)
	}

	// Narrow: numbers only.
	m = newTestModel(t, f, 60, 30)
	press(t, m, "4")
	s = trimRight(screen(m))
	mustContain(t, s, "REQUEST, LAST MIN        REQ/S  P50 AVG  P99 MAX\n", "LOOKUP                    10.0    80 µs   5.0 ms\n")
	mustNotContain(t, s, "EACH SECOND", "▁")

	// Short: a row says which kinds are left out, and events still show.
	m = newTestModel(t, f, 80, 14)
	press(t, m, "4")
	s = trimRight(screen(m))
	mustContain(t, s, "QUERY_PREFETCH_STATUS", "+5 more: LOOKUP, COMMIT_STORE, PREPARE_STORE, PREPARE_RETRIEVE, GET_CHUNK_SIZE", "fallback")

	// No requests: one line says so.
	f.snap.Rates.Latency = nil
	m = newTestModel(t, f, 80, 24)
	press(t, m, "4")
	mustContain(t, screen(m), "Latency   no requests in the last minute")
}

// TestHeaderProtocolDetections: under --protocol auto the header names
// "auto" and, where the line has room, the peers settled on each table.
func TestHeaderProtocolDetections(t *testing.T) {
	f := newFakeEngine(t)
	f.snap.Protocol = settings.ProtocolAuto
	f.snap.Requests = rpc.Stats{Detections: map[string]int64{"rpc-messages": 2, "nongpu-v1": 1, "engine-driven": 0},
		AmbiguousDetections: 1}
	m := newTestModel(t, f, 160, 30)
	line1 := strings.Split(screen(m), "\n")[0]
	if !strings.Contains(line1, "tcp://localhost:5555  auto  up 2h03m  peers nongpu-v1 1 · rpc-messages 2 (1 guessed)") {
		t.Errorf("wide header = %q", line1)
	}
	m = newTestModel(t, f, 80, 24)
	line1 = strings.TrimRight(strings.Split(screen(m), "\n")[0], " ")
	if !strings.HasSuffix(line1, "auto  up 2h03m") {
		t.Errorf("80-column header = %q; the counts do not fit and are left out whole", line1)
	}
	f.snap.Protocol = "nongpu-v1"
	m = newTestModel(t, f, 160, 30)
	if line1 := screen(m); strings.Contains(strings.Split(line1, "\n")[0], "peers") {
		t.Errorf("fixed profile header shows detections: %q", strings.Split(line1, "\n")[0])
	}
}

// TestLatencyLongKindNames: a long request name is whole where the width
// allows and cut (never the numbers) where it does not.
func TestLatencyLongKindNames(t *testing.T) {
	f := newFakeEngine(t)
	const name = "REGISTER_KV_CACHE_NON_GPU_CONTEXT"
	f.snap.Rates.Latency = map[string]engine.LatencyRates{name: {
		Rate: series.Window{Fine: []float64{2}}, P50: series.Window{Fine: []float64{0.001}}, P99: series.Window{Fine: []float64{0.002}}}}
	m := newTestModel(t, f, 100, 24)
	press(t, m, "4")
	mustContain(t, screen(m), name+"     2.00   1.0 ms   2.0 ms")
	m = newTestModel(t, f, 60, 24)
	press(t, m, "4")
	mustContain(t, screen(m), name+"     2.00   1.0 ms   2.0 ms")
	m = newTestModel(t, f, 50, 24)
	press(t, m, "4")
	mustContain(t, screen(m), "REGISTER_KV_CACHE_NON_~     2.00   1.0 ms   2.0 ms")
}
