package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"kvdock/core/engine"
	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/core/testkit/logbuf"
	"kvdock/core/testkit/profiles"
	"kvdock/core/testkit/promseries"
	"kvdock/settings"
	"kvdock/transfer/torchpickle"
	"kvdock/ui/httpapi"
	"kvdock/ui/metrics"
)

const (
	chunk    = 16
	layers   = 2
	hidden   = 4
	instance = 7
	token    = "s3cret-token"
)

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

// harness is a real engine on an ephemeral ZMQ port with the HTTP API in
// front of it on a real listener.
type harness struct {
	t    *testing.T
	eng  *engine.Engine
	cli  *client.Client
	base string
	port int
}

// testConfig is a tiny anonymous-pool engine on free loopback ports.
func testConfig(t *testing.T, tok string) settings.Config {
	t.Helper()
	empty := ""
	cfg := settings.Default()
	cfg.Server.Host = "127.0.0.1"
	cfg.Server.Port = freePort(t)
	cfg.Server.ChunkSize = chunk
	cfg.Server.ShmName = &empty
	cfg.L1.SizeGB = 0.01
	cfg.L1.Prefault = false
	cfg.HTTP.Host = "127.0.0.1"
	cfg.HTTP.Port = freePort(t)
	cfg.HTTP.Token = tok
	return cfg
}

func start(t *testing.T, tok string) *harness {
	t.Helper()
	return startWith(t, tok, nil)
}

// startWith is start with the config changed by edit first (nil: none);
// the harness's client speaks the configured profile (auto's default
// under auto).
func startWith(t *testing.T, tok string, edit func(*settings.Config)) *harness {
	t.Helper()
	cfg := testConfig(t, tok)
	if edit != nil {
		edit(&cfg)
	}
	sources := map[string]settings.Source{
		"server.port":     {Kind: settings.SourceFlag, Detail: "--port"},
		"server.shm_name": {Kind: settings.SourceFlag, Detail: "--shm-name"},
		"l1.size_gb":      {Kind: settings.SourceEnv, Detail: "KVDOCK_L1_SIZE_GB"},
	}
	if err := settings.Validate(cfg, sources); err != nil {
		t.Fatalf("test config invalid: %v", err)
	}
	m := metrics.New()
	eng := engine.New(cfg, engine.Options{Sources: sources, Observer: m, Version: "test"})
	m.Watch(eng)
	ctx, cancel := context.WithCancel(context.Background())
	if err := eng.Start(ctx); err != nil {
		cancel()
		t.Fatalf("engine start: %v", err)
	}
	api := httpapi.New(eng, httpapi.Options{Token: tok, Metrics: m})
	ln, err := httpapi.Listen("127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- api.Serve(ctx, ln) }()

	prof := profiles.Load(t, cfg.Server.ClientProtocol())
	cli, err := client.Dial(fmt.Sprintf("tcp://127.0.0.1:%d", cfg.Server.Port), prof, client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cli.Close()
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve returned %v after shutdown", err)
		}
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		if err := eng.Stop(stopCtx); err != nil {
			t.Errorf("engine stop: %v", err)
		}
	})
	return &harness{t: t, eng: eng, cli: cli, base: "http://" + ln.Addr().String(), port: cfg.Server.Port}
}

func (h *harness) call(name string, args ...any) client.Reply {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := h.cli.Call(ctx, name, args...)
	if err != nil {
		h.t.Fatalf("%s: %v", name, err)
	}
	return r
}

func tokens(n int) []uint32 {
	ts := make([]uint32, n)
	for i := range ts {
		ts[i] = uint32(1000 + i)
	}
	return ts
}

func key(req string, nChunks int) protocol.Key {
	w := 0
	return protocol.Key{ModelName: "m", WorldSize: 1, WorkerID: &w, TokenIDs: tokens(nChunks * chunk),
		Start: 0, End: nChunks * chunk, RequestID: req}
}

// register registers the worker; with --shm-name "" it must be told to pickle.
func (h *harness) register() {
	h.t.Helper()
	r := h.call(protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{InstanceID: instance, ModelName: "m",
		WorldSize: 1, BlockSize: chunk, NumLayers: layers, HiddenDimSize: hidden, DtypeStr: "float16"})
	var resp map[string]any
	if err := r.Decode(&resp); err != nil {
		h.t.Fatal(err)
	}
	if resp["shm_name"] != "" || fmt.Sprint(resp["pool_size"]) != "0" {
		h.t.Fatalf("register answered %v; want the pickle fallback {\"\", 0}", resp)
	}
}

const chunkBytes = 2 * layers * chunk * hidden * 2

// store stores nChunks chunks by pickle and returns the bytes stored.
func (h *harness) store(req string, nChunks int) int64 {
	h.t.Helper()
	k := key(req, nChunks)
	h.call(protocol.PrepareStore, k, int64(instance))
	ts := make([]torchpickle.Tensor, nChunks)
	for i := range ts {
		d := bytes.Repeat([]byte{byte(i + 1)}, chunkBytes)
		ts[i] = torchpickle.Tensor{Dtype: "float16", Shape: []int{2, layers, chunk, hidden}, Data: d}
	}
	data, err := torchpickle.AppendEncode(nil, ts)
	if err != nil {
		h.t.Fatal(err)
	}
	var ok bool
	if err := h.call(protocol.CommitStore, k, int64(instance), data).Decode(&ok); err != nil || !ok {
		h.t.Fatalf("COMMIT_STORE = %v, %v", ok, err)
	}
	return int64(nChunks * chunkBytes)
}

// lookup runs LOOKUP then QUERY_PREFETCH_STATUS and returns the hit chunks.
func (h *harness) lookup(req string, nChunks int) int64 {
	h.t.Helper()
	h.call(protocol.Lookup, key(req, nChunks), int64(1))
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		r := h.call(protocol.QueryPrefetchStatus, req)
		if r.Present {
			var n int64
			if err := r.Decode(&n); err != nil {
				h.t.Fatal(err)
			}
			return n
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.t.Fatal("QUERY_PREFETCH_STATUS never answered")
	return 0
}

// retrieve serves nChunks chunks back by pickle (after a lookup locked them).
func (h *harness) retrieve(req string, nChunks int) {
	h.t.Helper()
	k := key(req, nChunks)
	var resp map[string]any
	if err := h.call(protocol.PrepareRetrieve, k, int64(instance)).Decode(&resp); err != nil {
		h.t.Fatal(err)
	}
	if resp["success"] != true {
		h.t.Fatalf("PREPARE_RETRIEVE = %v", resp)
	}
	h.call(protocol.CommitRetrieve, k, int64(instance))
}

type response struct {
	code   int
	header http.Header
	body   []byte
}

func (h *harness) do(method, path string, body io.Reader, hdr map[string]string) response {
	h.t.Helper()
	req, err := http.NewRequest(method, h.base+path, body)
	if err != nil {
		h.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return response{code: res.StatusCode, header: res.Header, body: b}
}

func (h *harness) getJSON(path string, v any) {
	h.t.Helper()
	r := h.do(http.MethodGet, path, nil, nil)
	if r.code != http.StatusOK {
		h.t.Fatalf("GET %s = %d %s", path, r.code, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		h.t.Fatalf("GET %s Content-Type = %q", path, ct)
	}
	if err := json.Unmarshal(r.body, v); err != nil {
		h.t.Fatalf("GET %s: %v in %s", path, err, r.body)
	}
}

func (h *harness) metrics() map[string]*dto.MetricFamily {
	h.t.Helper()
	r := h.do(http.MethodGet, "/metrics", nil, nil)
	if r.code != http.StatusOK {
		h.t.Fatalf("GET /metrics = %d", r.code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(r.body))
	if err != nil {
		h.t.Fatalf("/metrics does not parse: %v\n%s", err, r.body)
	}
	return fams
}

func TestMetricsExistAtZeroAndMoveWithTraffic(t *testing.T) {
	h := start(t, "")
	before := h.metrics()
	for _, name := range []string{
		"lmcache_mp_l1_memory_usage_bytes", "lmcache_mp_l1_usage_ratio", "lmcache_mp_l1_read_total",
		"lmcache_mp_l1_write_total", "lmcache_mp_l1_evicted_total", "lmcache_mp_l1_allocation_failure_total",
		"lmcache_mp_lookup_requested_total", "lmcache_mp_lookup_hit_total", "lmcache_mp_active_prefetch_jobs",
		"lmcache_mp_l1_eviction_loop_ticks_total",
	} {
		if name != "lmcache_mp_l1_eviction_loop_ticks_total" {
			if v := promseries.Value(t, before, name); v != 0 {
				t.Errorf("%s = %v before traffic, want 0", name, v)
			}
		} else {
			promseries.Value(t, before, name)
		}
	}
	if v := promseries.Value(t, before, "kvdock_requests_total", "type", "LOOKUP", "outcome", "ok"); v != 0 {
		t.Errorf("LOOKUP ok before traffic = %v", v)
	}
	if v := promseries.Value(t, before, "kvdock_transfer_bytes_total", "mode", "pickle", "direction", "in"); v != 0 {
		t.Errorf("pickle bytes in before traffic = %v", v)
	}
	for _, kind := range []string{protocol.KindUnknownType, protocol.KindHandlerErr} {
		promseries.Value(t, before, "kvdock_bad_input_total", "kind", kind)
	}
	promseries.Value(t, before, "kvdock_contexts", "mode", "shm")
	promseries.Value(t, before, "kvdock_request_duration_seconds", "type", "COMMIT_STORE")
	if v := promseries.Value(t, before, "kvdock_up"); v != 1 {
		t.Errorf("kvdock_up = %v while serving", v)
	}

	h.register()
	in := h.store("r1", 2)
	if hits := h.lookup("r1", 2); hits != 2 {
		t.Fatalf("lookup hit chunks = %d, want 2", hits)
	}
	h.retrieve("r1", 2)
	// A pickle COMMIT_STORE without data is a handler error (upstream fails
	// to unpickle it): counted as bad input. The seed profile sends no reply
	// to a failed request, so the call times out.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, _ = h.cli.Call(ctx, protocol.CommitStore, key("r2", 1), int64(instance), []byte{})
	cancel()

	after := h.metrics()
	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"kvdock_requests_total", []string{"type", "COMMIT_STORE", "outcome", "ok"}, 1},
		{"kvdock_requests_total", []string{"type", "LOOKUP", "outcome", "ok"}, 1},
		{"kvdock_requests_total", []string{"type", "COMMIT_STORE", "outcome", "error"}, 1},
		{"kvdock_request_duration_seconds", []string{"type", "COMMIT_STORE"}, 2}, // the store and the failed one
		{"kvdock_transfer_bytes_total", []string{"mode", "pickle", "direction", "in"}, float64(in)},
		{"kvdock_transfer_bytes_total", []string{"mode", "pickle", "direction", "out"}, float64(in)},
		{"kvdock_transfer_bytes_total", []string{"mode", "shm", "direction", "in"}, 0},
		{"kvdock_contexts", []string{"mode", "pickle"}, 1},
		{"kvdock_contexts", []string{"mode", "shm"}, 0},
		{"kvdock_bad_input_total", []string{"kind", protocol.KindHandlerErr}, 1},
		{"lmcache_mp_l1_write_total", nil, 2},
		{"lmcache_mp_lookup_requested_total", nil, 2 * chunk},
		{"lmcache_mp_lookup_hit_total", nil, 2 * chunk},
		{"lmcache_mp_l1_memory_usage_bytes", nil, 2 * 4096}, // two chunks, 4096-aligned
	}
	// Only bounds a failure: a loaded -race run may take seconds to record.
	deadline := time.Now().Add(10 * time.Second)
	for _, c := range checks {
		got := promseries.Value(t, after, c.name, c.labels...)
		// The error outcome is recorded after the handler returns; allow it a moment.
		for got != c.want && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			after = h.metrics()
			got = promseries.Value(t, after, c.name, c.labels...)
		}
		if got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if v := promseries.Value(t, after, "lmcache_mp_l1_read_total"); v < 2 {
		t.Errorf("lmcache_mp_l1_read_total = %v, want >= 2 after a 2-chunk hit", v)
	}
	if v := promseries.Value(t, after, "lmcache_mp_l1_usage_ratio"); !(v > 0 && v < 1) {
		t.Errorf("lmcache_mp_l1_usage_ratio = %v", v)
	}

	// Counters survive a clear and never go down.
	if r := h.do(http.MethodPost, "/clear-cache", nil, nil); r.code != http.StatusOK {
		t.Fatalf("clear-cache = %d %s", r.code, r.body)
	}
	cleared := h.metrics()
	if v := promseries.Value(t, cleared, "lmcache_mp_l1_memory_usage_bytes"); v != 0 {
		t.Errorf("usage after clear = %v", v)
	}
	if v := promseries.Value(t, cleared, "lmcache_mp_l1_write_total"); v != 2 {
		t.Errorf("write counter after clear = %v, want 2", v)
	}
}

func TestStatus(t *testing.T) {
	h := start(t, "")
	h.register()
	in := h.store("s1", 3)
	h.lookup("s1", 3)
	h.retrieve("s1", 3)

	// Field names are the contract: read the raw document, not our struct.
	var raw map[string]any
	h.getJSON("/status", &raw)
	for _, k := range []string{"is_healthy", "engine_type", "chunk_size", "hash_algorithm", "active_sessions",
		"registered_non_cuda_instance_ids", "non_cuda_context_meta", "active_prefetch_jobs",
		"shm_name", "pool_size", "shm_reason", "contexts", "pool", "gpu", "requests", "state", "endpoint",
		"protocol", "uptime_seconds", "version"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("/status lacks %q", k)
		}
	}
	meta, _ := raw["non_cuda_context_meta"].(map[string]any)
	m7, _ := meta["7"].(map[string]any)
	if m7["model_name"] != "m" || m7["world_size"] != float64(1) || m7["block_size"] != float64(chunk) || m7["use_mla"] != false {
		t.Errorf("non_cuda_context_meta = %v", meta)
	}

	var st httpapi.Status
	h.getJSON("/api/status", &st)
	if !st.IsHealthy || st.EngineType != "MPCacheEngine" || st.State != "serving" || st.ChunkSize != chunk ||
		st.HashAlgorithm != "blake3" || st.Version != "test" || st.Protocol != "nongpu-v1" {
		t.Errorf("status header = %+v", st)
	}
	if want := fmt.Sprintf(":%d", h.port); !strings.HasSuffix(st.Endpoint, want) {
		t.Errorf("endpoint = %q, want ...%s", st.Endpoint, want)
	}
	if st.ShmName != "" || st.PoolSize != 0 || st.ShmShared || !strings.Contains(st.ShmReason, `--shm-name ""`) {
		t.Errorf("SHM decision = %q %d %v %q; want off because of --shm-name \"\"", st.ShmName, st.PoolSize, st.ShmShared, st.ShmReason)
	}
	if st.Pool.Shared || st.Pool.Segment != "" || st.Pool.CapacityBytes <= 0 || st.Pool.UsedBytes != 3*4096 || st.Pool.Objects != 3 {
		t.Errorf("pool = %+v", st.Pool)
	}
	if len(st.RegisteredNonCudaInstanceIDs) != 1 || st.RegisteredNonCudaInstanceIDs[0] != instance {
		t.Errorf("registered ids = %v", st.RegisteredNonCudaInstanceIDs)
	}
	if len(st.Contexts) != 1 {
		t.Fatalf("contexts = %+v", st.Contexts)
	}
	c := st.Contexts[0]
	if c.InstanceID != instance || c.Mode != "PICKLE" || c.Reason == "" || c.Stores != 1 || c.Retrieves != 1 ||
		c.HitChunks != 3 || c.BytesIn != in || c.BytesOut != in || c.Dtype != "float16" ||
		fmt.Sprint(c.Shape) != fmt.Sprint([]int{2, layers, chunk, hidden}) || c.ChunkBytes != chunkBytes {
		t.Errorf("context = %+v", c)
	}
	if rc := st.Requests.ByType["COMMIT_STORE"]; rc.OK != 1 || rc.Count != 1 || rc.MeanLatencySeconds <= 0 {
		t.Errorf("COMMIT_STORE counters = %+v", rc)
	}
	if st.Lookup.Lookups != 1 || st.Lookup.HitChunks != 3 {
		t.Errorf("lookup = %+v", st.Lookup)
	}
	if st.GPU.Available || st.GPU.Reason == "" {
		t.Errorf("gpu = %+v; the test engine has no sampler", st.GPU)
	}
	if len(st.Events) == 0 {
		t.Error("no events in /status")
	}
}

func TestHealthcheckAndStoppedEngine(t *testing.T) {
	h := start(t, "")
	for _, p := range []string{"/healthcheck", "/api/healthcheck"} {
		var hc map[string]any
		h.getJSON(p, &hc)
		if hc["status"] != "healthy" {
			t.Errorf("%s = %v", p, hc)
		}
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.eng.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	r := h.do(http.MethodGet, "/healthcheck", nil, nil)
	var hc httpapi.Health
	if err := json.Unmarshal(r.body, &hc); err != nil || r.code != http.StatusServiceUnavailable ||
		hc.Status != "unhealthy" || !strings.Contains(hc.Reason, "stopped") {
		t.Errorf("healthcheck of a stopped engine = %d %s", r.code, r.body)
	}
	r = h.do(http.MethodPost, "/clear-cache", nil, nil)
	var cr httpapi.ErrorBody
	if err := json.Unmarshal(r.body, &cr); err != nil || r.code != http.StatusServiceUnavailable ||
		cr.Status != "error" || cr.Error == "" {
		t.Errorf("clear-cache of a stopped engine = %d %s", r.code, r.body)
	}
	var st httpapi.Status
	h.getJSON("/status", &st)
	if st.IsHealthy || st.State != "stopped" {
		t.Errorf("status of a stopped engine: healthy %v state %q", st.IsHealthy, st.State)
	}
	if v := promseries.Value(t, h.metrics(), "kvdock_up"); v != 0 {
		t.Errorf("kvdock_up = %v while stopped", v)
	}
}

func TestConf(t *testing.T) {
	h := start(t, token)
	var conf httpapi.Conf
	h.getJSON("/conf", &conf)
	want := map[string]httpapi.ConfValue{
		"server.port":       {Value: float64(h.port), Source: "flag --port"},
		"server.shm_name":   {Value: "", Source: "flag --shm-name"},
		"server.chunk_size": {Value: float64(chunk), Source: "default"},
		"l1.size_gb":        {Value: 0.01, Source: "env KVDOCK_L1_SIZE_GB"},
		"l1.prefault":       {Value: false, Source: "default"},
		"ui.refresh":        {Value: "1s", Source: "default"},
		"http.token":        {Value: "(set, redacted)", Source: "default"},
	}
	for k, w := range want {
		g, l, _ := strings.Cut(k, ".")
		got, ok := conf[g][l]
		if !ok || got != w {
			t.Errorf("/conf %s = %+v, want %+v", k, got, w)
		}
	}
	if n := len(settings.Keys()); countConf(conf) != n {
		t.Errorf("/conf has %d keys, settings has %d", countConf(conf), n)
	}
	if strings.Contains(string(h.do(http.MethodGet, "/conf", nil, nil).body), token) {
		t.Error("/conf leaks the HTTP token")
	}
}

func countConf(c httpapi.Conf) int {
	n := 0
	for _, g := range c {
		n += len(g)
	}
	return n
}

func TestClearCacheWithToken(t *testing.T) {
	h := start(t, token)
	h.register()
	h.store("c1", 2)
	if hits := h.lookup("c1", 2); hits != 2 {
		t.Fatalf("hits before clear = %d", hits)
	}
	h.call(protocol.FreeLookupLocks, key("c1", 2), int64(1))

	for _, hdr := range []map[string]string{nil, {"Authorization": "Bearer wrong"}, {"Authorization": token}, {"Authorization": "Basic " + token}} {
		r := h.do(http.MethodPost, "/clear-cache", nil, hdr)
		if r.code != http.StatusUnauthorized || r.header.Get("WWW-Authenticate") == "" {
			t.Errorf("clear-cache with %v = %d %s; want 401", hdr, r.code, r.body)
		}
	}
	if hits := h.lookup("c2", 2); hits != 2 {
		t.Fatalf("an unauthorised clear dropped the cache: hits = %d", hits)
	}
	h.call(protocol.FreeLookupLocks, key("c2", 2), int64(1))
	// Reads need no token.
	if r := h.do(http.MethodGet, "/status", nil, nil); r.code != http.StatusOK {
		t.Errorf("status with a token configured = %d", r.code)
	}

	r := h.do(http.MethodPost, "/api/clear-cache", nil, map[string]string{"Authorization": "Bearer " + token})
	var cr httpapi.ClearResult
	if err := json.Unmarshal(r.body, &cr); err != nil || r.code != http.StatusOK || cr.Status != "ok" || cr.Objects != 2 || cr.Bytes <= 0 {
		t.Fatalf("clear-cache = %d %s; want 2 objects and their bytes", r.code, r.body)
	}
	if ev := lastEvent(h.eng, "cache cleared"); !strings.Contains(ev, "by HTTP API: 2 objects") {
		t.Errorf("the event %q does not say the HTTP API cleared 2 objects", ev)
	}
	if hits := h.lookup("c3", 2); hits != 0 {
		t.Errorf("LOOKUP after clear: QUERY_PREFETCH_STATUS = %d, want 0", hits)
	}
	// kvdock ctl's clears are its own in the events pane, behind the same token.
	ctlHdr := map[string]string{"User-Agent": httpapi.CtlAgent + "/test"}
	if r := h.do(http.MethodPost, "/clear-cache", nil, ctlHdr); r.code != http.StatusUnauthorized {
		t.Fatalf("ctl's clear without the token = %d", r.code)
	}
	ctlHdr["Authorization"] = "Bearer " + token
	if r := h.do(http.MethodPost, "/clear-cache", nil, ctlHdr); r.code != http.StatusOK {
		t.Fatalf("ctl's clear = %d %s", r.code, r.body)
	}
	if ev := lastEvent(h.eng, "cache cleared"); !strings.Contains(ev, "by kvdock ctl: 0 objects") {
		t.Errorf("the event %q does not name kvdock ctl", ev)
	}
}

// lastEvent returns the newest engine event whose text contains sub.
func lastEvent(e *engine.Engine, sub string) string {
	evs := e.Snapshot().Events
	for i := len(evs) - 1; i >= 0; i-- {
		if strings.Contains(evs[i].Message, sub) {
			return evs[i].Message
		}
	}
	return ""
}

func TestBadRequests(t *testing.T) {
	h := start(t, "")
	cases := []struct {
		method, path string
		body         io.Reader
		code         int
		allow        string
	}{
		{http.MethodGet, "/nope", nil, http.StatusNotFound, ""},
		{http.MethodGet, "/status/extra", nil, http.StatusNotFound, ""},
		{http.MethodPost, "/status", nil, http.StatusMethodNotAllowed, "GET, HEAD"},
		{http.MethodDelete, "/metrics", nil, http.StatusMethodNotAllowed, "GET, HEAD"},
		{http.MethodGet, "/clear-cache", nil, http.StatusMethodNotAllowed, "POST"},
		{http.MethodPost, "/clear-cache", bytes.NewReader(make([]byte, 2<<20)), http.StatusRequestEntityTooLarge, ""},
		// A chunked body has no length up front; it is cut at the limit.
		{http.MethodPost, "/clear-cache", io.MultiReader(bytes.NewReader(make([]byte, 1<<20)), strings.NewReader("x")), http.StatusRequestEntityTooLarge, ""},
	}
	for _, c := range cases {
		r := h.do(c.method, c.path, c.body, nil)
		var eb httpapi.ErrorBody
		if r.code != c.code || json.Unmarshal(r.body, &eb) != nil || eb.Status != "error" || eb.Error == "" {
			t.Errorf("%s %s = %d %s; want %d with a JSON error", c.method, c.path, r.code, r.body, c.code)
		}
		if c.allow != "" && r.header.Get("Allow") != c.allow {
			t.Errorf("%s %s Allow = %q, want %q", c.method, c.path, r.header.Get("Allow"), c.allow)
		}
	}
	// The cache was never cleared by the rejected requests, and the server still answers.
	var hc httpapi.Health
	h.getJSON("/healthcheck", &hc)
	if hc.Status != "healthy" {
		t.Errorf("after bad requests: %+v", hc)
	}
}

func TestServeStopsOnContext(t *testing.T) {
	api := httpapi.New(fakeEngine{}, httpapi.Options{})
	ln, cancel, done := serve(t, api)
	res, err := http.Get("http://" + ln.Addr().String() + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("healthcheck of a starting engine = %d", res.StatusCode)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve = %v after cancel", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	if _, err := http.Get("http://" + ln.Addr().String() + "/healthcheck"); err == nil {
		t.Error("server still answering after shutdown")
	}
	if _, err := httpapi.Listen("127.0.0.1", -1); err == nil {
		t.Error("Listen accepted port -1")
	}
}

// TestServeStopsDespiteSilentConnections: connections that never send a
// request (Shutdown counts one as active for its first 5 s) do not hold a
// stop: Serve returns within ShutdownGrace and a little, having closed them.
func TestServeStopsDespiteSilentConnections(t *testing.T) {
	api := httpapi.New(fakeEngine{}, httpapi.Options{})
	ln, cancel, done := serve(t, api)
	var silent []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		silent = append(silent, c)
	}
	// The server has taken them (a request on a fourth answers).
	res, err := http.Get("http://" + ln.Addr().String() + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	start := time.Now()
	cancel()
	select {
	case <-done:
	case <-time.After(4 * time.Second):
		t.Fatalf("Serve still running %v after cancel with %d silent connections", time.Since(start), len(silent))
	}
	_ = silent[0].SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := silent[0].Read(make([]byte, 1)); err == nil {
		t.Error("a silent connection was left open after the stop")
	}
}

type fakeEngine struct{}

func (fakeEngine) Snapshot() engine.Snapshot                      { return engine.Snapshot{State: engine.Starting} }
func (fakeEngine) RemoveInstance(int64, engine.ClearOrigin) error { return nil }

func (fakeEngine) ClearCache(engine.ClearOrigin) (engine.Cleared, error) {
	return engine.Cleared{}, fmt.Errorf("engine is not running")
}

func TestNonLoopbackWithoutTokenWarns(t *testing.T) {
	for _, c := range []struct {
		host, token string
		warn        bool
	}{
		{"0.0.0.0", "", true},
		{"0.0.0.0", token, false},
		{"127.0.0.1", "", false},
	} {
		var logs logbuf.Buffer
		api := httpapi.New(fakeEngine{}, httpapi.Options{Token: c.token, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		ln, err := httpapi.Listen(c.host, 0)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- api.Serve(ctx, ln) }()
		// The warning, if any, is logged before "listening": without that
		// line the check below would pass vacuously.
		waitErr := logs.Wait("HTTP API listening", 5*time.Second)
		cancel()
		<-done
		if waitErr != nil {
			t.Fatalf("host %s: %v", c.host, waitErr)
		}
		if got := strings.Contains(logs.String(), "level=WARN"); got != c.warn {
			t.Errorf("host %s token %q: warned %v, want %v\n%s", c.host, c.token, got, c.warn, logs.String())
		}
	}
}

// TestStatusShowsGroups: a hybrid model's context lists its KV groups in
// /status (each group's dtype, shape and chunk bytes) and upstream's meta
// carries num_groups; a plain model's context has no groups field.
func TestStatusShowsGroups(t *testing.T) {
	h := start(t, "")
	h.register()
	r := h.call(protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{InstanceID: 8, ModelName: "hy",
		WorldSize: 1, BlockSize: chunk, NumLayers: layers, HiddenDimSize: hidden, DtypeStr: "float16",
		GroupLayouts: []protocol.GroupLayout{
			{BlockSize: chunk, NumLayers: layers, HiddenDimSize: hidden, DtypeStr: "float16"},
			{BlockSize: chunk, NumLayers: 1, HiddenDimSize: 2 * hidden, DtypeStr: "float32"},
		}})
	var resp map[string]any
	if err := r.Decode(&resp); err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Meta     map[string]map[string]any `json:"non_cuda_context_meta"`
		Contexts []map[string]any          `json:"contexts"`
	}
	h.getJSON("/status", &raw)
	if len(raw.Contexts) != 2 {
		t.Fatalf("contexts = %v", raw.Contexts)
	}
	if _, ok := raw.Contexts[0]["groups"]; ok {
		t.Errorf("a plain model lists groups: %v", raw.Contexts[0])
	}
	gs, _ := raw.Contexts[1]["groups"].([]any)
	if len(gs) != 2 {
		t.Fatalf("hybrid context groups = %v", raw.Contexts[1]["groups"])
	}
	g1, _ := gs[1].(map[string]any)
	if g1["dtype"] != "float32" || fmt.Sprint(g1["shape"]) != fmt.Sprint([]any{2.0, 1.0, float64(chunk), float64(2 * hidden)}) ||
		g1["chunk_bytes"] != float64(2*chunk*2*hidden*4) {
		t.Errorf("group 1 = %v", g1)
	}
	if raw.Meta["8"]["num_groups"] != float64(2) {
		t.Errorf("meta = %v", raw.Meta["8"])
	}
}

func TestUnregisterEndpoint(t *testing.T) {
	h := start(t, token)
	h.register()
	auth := map[string]string{"Authorization": "Bearer " + token}
	path := fmt.Sprintf("/unregister?instance_id=%d", instance)
	if r := h.do(http.MethodPost, path, nil, nil); r.code != http.StatusUnauthorized {
		t.Fatalf("unregister without the token = %d %s", r.code, r.body)
	}
	if r := h.do(http.MethodGet, path, nil, auth); r.code != http.StatusMethodNotAllowed {
		t.Fatalf("GET unregister = %d", r.code)
	}
	for _, bad := range []string{"/unregister", "/unregister?instance_id=x", "/unregister?instance_id=99999999999999999999",
		"/unregister?instance_id=1&instance_id=2", "/unregister?instance_id=" + strings.Repeat("9", 5000)} {
		if r := h.do(http.MethodPost, bad, nil, auth); r.code != http.StatusBadRequest || len(r.body) > 400 {
			t.Errorf("%.60s = %d %s; want a short 400", bad, r.code, r.body)
		}
	}
	if r := h.do(http.MethodPost, "/unregister?instance_id=-5", nil, auth); r.code != http.StatusNotFound {
		t.Errorf("unknown id = %d %s; want 404", r.code, r.body)
	}
	if st := h.status(); len(st.RegisteredNonCudaInstanceIDs) != 1 {
		t.Fatalf("a refused unregister changed the registrations: %v", st.RegisteredNonCudaInstanceIDs)
	} else if wl := st.WorkerLiveness; wl.Enabled || wl.ReapTimeoutSeconds != 120 || wl.RegistrationGraceSeconds != 3600 || wl.IdleSeconds != 300 || wl.TrackedInstances != 1 {
		// The default seed profile: its PING carries no id, so no reaper.
		t.Fatalf("worker_liveness %+v", wl)
	}
	r := h.do(http.MethodPost, "/api"+path, nil, auth)
	var ur httpapi.UnregisterResult
	if err := json.Unmarshal(r.body, &ur); err != nil || r.code != http.StatusOK || ur.Status != "ok" || ur.InstanceID != instance {
		t.Fatalf("unregister = %d %s", r.code, r.body)
	}
	st := h.status()
	if len(st.RegisteredNonCudaInstanceIDs) != 0 || len(st.Contexts) != 1 || st.Contexts[0].State != "removed" || st.Transfer.Removed != 1 {
		t.Fatalf("status after unregister: ids %v, contexts %+v, transfer %+v", st.RegisteredNonCudaInstanceIDs, st.Contexts, st.Transfer)
	}
	if ev := lastEvent(h.eng, "removed by"); !strings.Contains(ev, "removed by HTTP API") {
		t.Errorf("event %q does not name the HTTP API", ev)
	}
	if r := h.do(http.MethodPost, path, nil, auth); r.code != http.StatusNotFound {
		t.Errorf("second unregister = %d; want 404", r.code)
	}
}

func (h *harness) status() httpapi.Status {
	h.t.Helper()
	r := h.do(http.MethodGet, "/status", nil, nil)
	var st httpapi.Status
	if err := json.Unmarshal(r.body, &st); err != nil || r.code != http.StatusOK {
		h.t.Fatalf("status = %d %s: %v", r.code, r.body, err)
	}
	return st
}
