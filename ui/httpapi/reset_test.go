package httpapi_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"kvdock/core/lookup"
	"kvdock/core/protocol"
	"kvdock/ui/httpapi"
)

// POST /reset-stats needs the token (401 without, nothing reset); with it
// the lookup figures, miss breakdown and what-if start again, the cache
// stays, and /status says since when.
func TestResetStatsWithToken(t *testing.T) {
	h := start(t, token)
	h.register()
	h.store("r1", 2)
	if hits := h.lookup("r1", 3); hits != 2 {
		t.Fatalf("hits = %d", hits)
	}
	var st httpapi.Status
	h.getJSON("/status", &st)
	if st.Lookup.Lookups != 1 || st.Misses.TotalMissed != 1 || st.StatsResetAt != nil || st.StatsSince == nil {
		t.Fatalf("before the reset: lookup %+v, misses %d, reset at %v, since %v", st.Lookup, st.Misses.TotalMissed, st.StatsResetAt, st.StatsSince)
	}
	for _, hdr := range []map[string]string{nil, {"Authorization": "Bearer wrong"}, {"User-Agent": httpapi.CtlAgent}} {
		if r := h.do(http.MethodPost, "/reset-stats", nil, hdr); r.code != http.StatusUnauthorized {
			t.Errorf("reset-stats with %v = %d %s; want 401", hdr, r.code, r.body)
		}
	}
	h.getJSON("/status", &st)
	if st.Lookup.Lookups != 1 || st.StatsResetAt != nil {
		t.Fatalf("an unauthorised reset reset: lookups %d, reset at %v", st.Lookup.Lookups, st.StatsResetAt)
	}
	if r := h.do(http.MethodGet, "/reset-stats", nil, nil); r.code != http.StatusMethodNotAllowed {
		t.Errorf("GET /reset-stats = %d, want 405", r.code)
	}

	r := h.do(http.MethodPost, "/api/reset-stats", nil, map[string]string{"Authorization": "Bearer " + token})
	var rr httpapi.ResetResult
	if err := json.Unmarshal(r.body, &rr); err != nil || r.code != http.StatusOK || rr.Status != "ok" || rr.ResetAt == nil {
		t.Fatalf("reset-stats = %d %s", r.code, r.body)
	}
	if ev := lastEvent(h.eng, "statistics reset"); !strings.Contains(ev, "by HTTP API") {
		t.Errorf("the event %q does not say the HTTP API reset the statistics", ev)
	}
	h.getJSON("/status", &st)
	if st.Lookup.Lookups != 0 || st.Lookup.HitChunks != 0 || st.Misses.TotalMissed != 0 || st.WhatIf.SampledLookups != 0 || st.TokensSaved.Total != 0 {
		t.Fatalf("after the reset: lookup %+v, misses %d, what-if %d, tokens %d", st.Lookup, st.Misses.TotalMissed, st.WhatIf.SampledLookups, st.TokensSaved.Total)
	}
	if st.StatsResetAt == nil || !st.StatsResetAt.Equal(*rr.ResetAt) || st.StatsSince == nil || !st.StatsSince.Equal(*rr.ResetAt) ||
		st.Misses.Since == nil || !st.Misses.Since.Equal(*rr.ResetAt) || st.TokensSaved.Since == nil {
		t.Fatalf("after the reset /status says stats since %v (reset %v, misses since %v), want %v", st.StatsSince, st.StatsResetAt, st.Misses.Since, rr.ResetAt)
	}
	if st.Pool.Objects != 2 {
		t.Fatalf("the reset changed the cache: %d objects", st.Pool.Objects)
	}
	if hits := h.lookup("r2", 2); hits != 2 {
		t.Fatalf("hits after the reset = %d", hits)
	}
	h.getJSON("/status", &st)
	if st.Lookup.Lookups != 1 || st.WhatIf.Window == "" || st.WhatIf.WindowSince == nil {
		t.Fatalf("after the reset and a lookup: lookups %d, what-if window %q since %v", st.Lookup.Lookups, st.WhatIf.Window, st.WhatIf.WindowSince)
	}
}

// An engine that cannot reset its statistics answers 501, after the token.
func TestResetStatsNotImplemented(t *testing.T) {
	api := httpapi.New(fakeEngine{}, httpapi.Options{})
	rec := httptest.NewRecorder()
	api.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/reset-stats", nil))
	if rec.Code != http.StatusNotImplemented {
		t.Fatalf("reset-stats on an engine without it = %d %s", rec.Code, rec.Body)
	}
}

// Benchmark lookups are in lookup.bench, not in the workers' figures; a
// model nobody registered is named in lookup.unregistered_models.
func TestStatusBenchAndUnregistered(t *testing.T) {
	h := start(t, "")
	bench := lookup.BenchModelPrefix + "small"
	h.call(protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{InstanceID: 9, ModelName: bench,
		WorldSize: 1, BlockSize: chunk, NumLayers: layers, HiddenDimSize: hidden, DtypeStr: "float16"})
	for _, m := range []string{bench, "nobody"} {
		k := key("b", 3)
		k.ModelName, k.WorkerID = m, nil
		h.call(protocol.Lookup, k, int64(1))
	}
	var st httpapi.Status
	h.getJSON("/status", &st)
	if st.Lookup.Lookups != 1 || st.Lookup.EarlyExits != 1 || st.Lookup.Bench.Lookups != 1 || st.Lookup.Bench.RequestedChunks != 3 {
		t.Fatalf("lookup = %+v", st.Lookup)
	}
	u := st.Lookup.UnregisteredModels
	if len(u) != 1 || u[0].ModelName != "nobody" || u[0].Lookups != 1 ||
		u[0].Message != "no worker registered for model nobody (world size 1): lookups answer 0" {
		t.Fatalf("unregistered_models = %+v", u)
	}
	if st.Rates.LastMinute.WindowSeconds > 60 || time.Duration(st.Rates.WindowSeconds)*time.Second != time.Minute {
		t.Fatalf("rates window %d s, last minute over %v s", st.Rates.WindowSeconds, st.Rates.LastMinute.WindowSeconds)
	}
}
