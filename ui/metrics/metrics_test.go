package metrics

import (
	"encoding/json"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"kvdock/assets"
	"kvdock/core/engine"
	"kvdock/core/gpu"
	"kvdock/core/rpc"
	"kvdock/core/testkit/promseries"
	"kvdock/core/tierstate"
	"kvdock/core/workers"
)

type fakeSource struct {
	mu sync.Mutex
	s  engine.Snapshot
}

func (f *fakeSource) Snapshot() engine.Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.s
}

func (f *fakeSource) set(fn func(*engine.Snapshot)) {
	f.mu.Lock()
	fn(&f.s)
	f.mu.Unlock()
}

func gather(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// watched is a collector watching a new fake engine.
func watched() (*fakeSource, *Metrics) {
	src := &fakeSource{}
	m := New()
	m.Watch(src)
	return src, m
}

func TestCountersStayMonotonicAcrossResets(t *testing.T) {
	src, m := watched()
	src.set(func(s *engine.Snapshot) { s.Pool.WriteReservations = 5; s.Lookup.HitTokens = 64 })
	if v := promseries.Value(t, gather(t, m), "lmcache_mp_l1_write_total"); v != 5 {
		t.Fatalf("write total = %v, want 5", v)
	}
	// A pool rebuild resets the engine's counter; ours keeps counting.
	src.set(func(s *engine.Snapshot) { s.Pool.WriteReservations = 2; s.Lookup.HitTokens = 80 })
	f := gather(t, m)
	if v := promseries.Value(t, f, "lmcache_mp_l1_write_total"); v != 7 {
		t.Errorf("write total after reset = %v, want 7", v)
	}
	if v := promseries.Value(t, f, "lmcache_mp_lookup_hit_total"); v != 80 {
		t.Errorf("hit total = %v, want 80", v)
	}
}

func TestTransferBytesSurviveUnregisterAndFallback(t *testing.T) {
	src, m := watched()
	reg := time.Unix(100, 0)
	src.set(func(s *engine.Snapshot) {
		s.Contexts = []workers.ContextInfo{
			{InstanceID: 1, Mode: workers.ModeSHM, Registered: reg, BytesIn: 1000, BytesOut: 10},
			{InstanceID: 2, Mode: workers.ModePickle, Registered: reg, BytesIn: 50},
		}
	})
	f := gather(t, m)
	if v := promseries.Value(t, f, "kvdock_transfer_bytes_total", "mode", "shm", "direction", "in"); v != 1000 {
		t.Errorf("shm in = %v", v)
	}
	if v := promseries.Value(t, f, "kvdock_contexts", "mode", "shm"); v != 1 {
		t.Errorf("shm contexts = %v", v)
	}
	// Instance 1 falls back to pickle and moves 200 more bytes; instance 2
	// unregisters; instance 2 registers again with fresh counters.
	src.set(func(s *engine.Snapshot) {
		s.Contexts = []workers.ContextInfo{
			{InstanceID: 1, Mode: workers.ModePickle, Registered: reg, BytesIn: 1200, BytesOut: 10},
			{InstanceID: 2, Mode: workers.ModePickle, Registered: reg.Add(time.Second), BytesIn: 30},
		}
	})
	f = gather(t, m)
	want := map[[2]string]float64{{"shm", "in"}: 1000, {"shm", "out"}: 10, {"pickle", "in"}: 50 + 200 + 30, {"pickle", "out"}: 0}
	for k, w := range want {
		if v := promseries.Value(t, f, "kvdock_transfer_bytes_total", "mode", k[0], "direction", k[1]); v != w {
			t.Errorf("transfer %v = %v, want %v", k, v, w)
		}
	}
	if v := promseries.Value(t, f, "kvdock_contexts", "mode", "shm"); v != 0 {
		t.Errorf("shm contexts after fallback = %v", v)
	}
	if v := promseries.Value(t, f, "kvdock_contexts", "mode", "pickle"); v != 2 {
		t.Errorf("pickle contexts = %v", v)
	}
}

func TestObserverAndGPU(t *testing.T) {
	src, m := watched()
	src.set(func(s *engine.Snapshot) {
		s.Requests.Requests = map[string]rpc.RequestStats{"LOOKUP": {}, "NOOP": {}}
		s.Requests.BadInput = map[string]int64{"something_new": 3}
		s.GPU = gpu.Snapshot{Available: true, Devices: []gpu.Device{{Index: 0, Name: "NVIDIA H200", MemUsed: 1 << 30, MemTotal: 141 << 30}}}
	})
	f := gather(t, m)
	if v := promseries.Value(t, f, "kvdock_requests_total", "type", "NOOP", "outcome", "error"); v != 0 {
		t.Errorf("primed NOOP error = %v", v)
	}
	if v := promseries.Value(t, f, "kvdock_bad_input_total", "kind", "something_new"); v != 3 {
		t.Errorf("unknown bad-input kind = %v", v)
	}
	if v := promseries.Value(t, f, "kvdock_gpu_memory_total_bytes", "gpu", "0", "name", "NVIDIA H200"); v != 141<<30 {
		t.Errorf("gpu total = %v", v)
	}
	var obs rpc.Observer = m
	obs.OnRequest("LOOKUP", rpc.OutcomeOK, 2*time.Millisecond)
	obs.OnRequest("LOOKUP", rpc.OutcomeDropped, time.Millisecond)
	f = gather(t, m)
	if v := promseries.Value(t, f, "kvdock_requests_total", "type", "LOOKUP", "outcome", "ok"); v != 1 {
		t.Errorf("LOOKUP ok = %v", v)
	}
	h := f["kvdock_request_duration_seconds"].GetMetric()
	var n uint64
	for _, s := range h {
		for _, l := range s.GetLabel() {
			if l.GetValue() == "LOOKUP" {
				n = s.GetHistogram().GetSampleCount()
			}
		}
	}
	if n != 2 {
		t.Errorf("LOOKUP latency samples = %d, want 2", n)
	}
}

// TestDashboardUsesExportedMetrics keeps assets/grafana-dashboard.json in
// step with the metric names.
func TestDashboardUsesExportedMetrics(t *testing.T) {
	src := &fakeSource{}
	src.s.GPU = gpu.Snapshot{Available: true, Devices: []gpu.Device{{Name: "x"}}}
	m := New()
	m.Watch(src)
	m.OnRequest("NOOP", rpc.OutcomeOK, time.Millisecond)
	fams := gather(t, m)

	var dash struct {
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			GridPos struct {
				X, Y, W, H int
			} `json:"gridPos"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(assets.GrafanaDashboard(), &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	name := regexp.MustCompile(`\b(?:lmcache_mp|kvdock)_[a-z0-9_]+`)
	used := map[string]bool{}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, n := range name.FindAllString(tg.Expr, -1) {
				base := n
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(n, suf); ok && fams[b] != nil {
						base = b
					}
				}
				if fams[base] == nil {
					t.Errorf("panel %q queries %s, which kvdock does not export", p.Title, n)
				}
				used[base] = true
			}
		}
	}
	for _, n := range []string{"lmcache_mp_l1_usage_ratio", "lmcache_mp_lookup_hit_total", "kvdock_requests_total",
		"kvdock_request_duration_seconds", "kvdock_transfer_bytes_total", "kvdock_contexts", "kvdock_bad_input_total",
		"kvdock_gpu_memory_used_bytes",
		"kvdock_tokens_saved_total", "kvdock_tokens_saved_last_hour", "kvdock_hit_ratio_last_minute",
		"kvdock_lookups_per_second_last_minute", "kvdock_lookup_missed_chunks_total", "kvdock_whatif_hit_ratio",
		"kvdock_contexts_by_state", "kvdock_workers_reaped_total", "kvdock_instance_id_reused_total",
		"kvdock_protocol_detections_total"} {
		if !used[n] {
			t.Errorf("dashboard does not show %s", n)
		}
	}
	// Panels have their own ids and cells: Grafana keeps one of two
	// panels sharing an id, and overlapping ones hide each other.
	ids := map[int]string{}
	for i, p := range dash.Panels {
		if prev, ok := ids[p.ID]; ok {
			t.Errorf("panels %q and %q share id %d", prev, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		a := p.GridPos
		if a.W <= 0 || a.H <= 0 || a.X < 0 || a.X+a.W > 24 {
			t.Errorf("panel %q at %+v is outside the 24-column grid", p.Title, a)
		}
		for _, q := range dash.Panels[:i] {
			b := q.GridPos
			if a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H {
				t.Errorf("panels %q and %q overlap", q.Title, p.Title)
			}
		}
	}
	unit := string(assets.SystemdUnit())
	for _, line := range []string{"ExecStart=/usr/local/bin/kvdock --headless", "Restart=on-failure", "PrivateDevices=no", "ReadWritePaths=/dev/shm"} {
		if !strings.Contains(unit, "\n"+line+"\n") {
			t.Errorf("systemd unit lacks %q", line)
		}
	}
}

func TestTierMetricsByIndexAndType(t *testing.T) {
	src, m := watched()
	if fams := gather(t, m); fams["kvdock_tier_up"] != nil {
		t.Fatal("tier series exist with no tier configured")
	}
	src.set(func(s *engine.Snapshot) {
		s.Tiers = []tierstate.Tier{
			{Index: 0, Type: "fs", Target: "/data/l2", State: tierstate.Up, UsedBytes: 1 << 20, CapacityBytes: 10 << 30,
				Objects: 8, Hits: 5, Misses: 2, Corrupt: 1, QueueDepth: 3, QueueBytes: 3 << 17, DroppedWrites: 4,
				ReadBytes: 1000, WriteBytes: 2000, Loads: 5, LoadTimeouts: 1},
			{Index: 1, Type: "resp", Target: "redis://redis:6379", State: tierstate.Down, Reason: "connection refused", Hits: 9},
		}
	})
	fams := gather(t, m)
	for _, c := range []struct {
		name  string
		want  float64
		label []string
	}{
		{"kvdock_tier_up", 1, []string{"index", "0", "type", "fs"}},
		{"kvdock_tier_up", 0, []string{"index", "1", "type", "resp"}},
		{"kvdock_tier_state", 1, []string{"index", "1", "type", "resp", "state", "down"}},
		{"kvdock_tier_state", 0, []string{"index", "1", "type", "resp", "state", "up"}},
		{"kvdock_tier_used_bytes", 1 << 20, []string{"index", "0"}},
		{"kvdock_tier_capacity_bytes", 10 << 30, []string{"index", "0"}},
		{"kvdock_tier_objects", 8, []string{"index", "0"}},
		{"kvdock_tier_queue_depth", 3, []string{"index", "0"}},
		{"kvdock_tier_queue_bytes", 3 << 17, []string{"index", "0"}},
		{"kvdock_tier_hits_total", 5, []string{"index", "0"}},
		{"kvdock_tier_hits_total", 9, []string{"index", "1", "type", "resp"}},
		{"kvdock_tier_misses_total", 2, []string{"index", "0"}},
		{"kvdock_tier_corrupt_total", 1, []string{"index", "0"}},
		{"kvdock_tier_dropped_writes_total", 4, []string{"index", "0"}},
		{"kvdock_tier_read_bytes_total", 1000, []string{"index", "0"}},
		{"kvdock_tier_write_bytes_total", 2000, []string{"index", "0"}},
		{"kvdock_tier_loads_total", 5, []string{"index", "0"}},
		{"kvdock_tier_load_timeouts_total", 1, []string{"index", "0"}},
	} {
		if got := promseries.Value(t, fams, c.name, c.label...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.label, got, c.want)
		}
	}
	if f := fams["kvdock_tier_hits_total"]; f.GetType() != dto.MetricType_COUNTER {
		t.Errorf("hits type %v", f.GetType())
	}

	// An engine restart resets the tier's totals; the series does not go down.
	src.set(func(s *engine.Snapshot) { s.Tiers[0].Hits = 2 })
	if got := promseries.Value(t, gather(t, m), "kvdock_tier_hits_total", "index", "0"); got != 7 {
		t.Errorf("hits after reset = %v, want 7", got)
	}

	// The text exposition parses, and names no target or reason (a label
	// per reason would grow without bound).
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	parsed, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if parsed["kvdock_tier_dropped_writes_total"] == nil || strings.Contains(body, "connection refused") || strings.Contains(body, "redis:6379") {
		t.Errorf("exposition:\n%s", body)
	}
}

func TestLivenessMetrics(t *testing.T) {
	src, m := watched()
	now := time.Unix(1_700_000_000, 0)
	src.set(func(s *engine.Snapshot) {
		s.Taken = now
		s.Contexts = []workers.ContextInfo{
			{InstanceID: 1, Mode: workers.ModeSHM, State: workers.StateActive, LastRequest: now.Add(-2 * time.Second)},
			{InstanceID: 2, Mode: workers.ModeSHM, State: workers.StateIdle, LastRequest: now.Add(-10 * time.Minute)},
			{InstanceID: 3, Mode: workers.ModePickle, State: workers.StateReaped, LastRequest: now.Add(-time.Hour), Gone: now},
		}
		s.Transfer.Reaped, s.Transfer.Removed, s.Transfer.Reused = 1, 2, 3
	})
	f := gather(t, m)
	for state, want := range map[string]float64{"active": 1, "idle": 1, "reaped": 1, "removed": 0} {
		if v := promseries.Value(t, f, "kvdock_contexts_by_state", "state", state); v != want {
			t.Errorf("contexts %s = %v, want %v", state, v, want)
		}
	}
	if v := promseries.Value(t, f, "kvdock_context_last_seen_seconds", "instance_id", "2"); v != 600 {
		t.Errorf("last seen of 2 = %v", v)
	}
	if n := len(f["kvdock_context_last_seen_seconds"].GetMetric()); n != 2 {
		t.Errorf("%d last-seen series; a reaped context must not have one", n)
	}
	// A reaped context is not registered: it is not counted by mode.
	if v := promseries.Value(t, f, "kvdock_contexts", "mode", "pickle"); v != 0 {
		t.Errorf("pickle contexts = %v, want 0", v)
	}
	for name, want := range map[string]float64{"kvdock_workers_reaped_total": 1, "kvdock_workers_removed_total": 2, "kvdock_instance_id_reused_total": 3} {
		if v := promseries.Value(t, f, name); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
}
