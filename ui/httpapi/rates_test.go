package httpapi

import (
	"encoding/json"
	"strings"
	"testing"

	"kvdock/core/engine"
	"kvdock/core/series"
	"kvdock/core/workers"
)

func win(v ...float64) series.Window { return series.Window{Fine: v} }

// TestStatusRatesAndTokensSaved: /status carries the last minute of rates
// (a second without lookups has a null hit ratio, not NaN that would break
// the JSON), per context and per request kind, and the tokens saved.
func TestStatusRatesAndTokensSaved(t *testing.T) {
	long := make([]float64, 100)
	for i := range long {
		long[i] = float64(i)
	}
	s := engine.Snapshot{
		Contexts: []workers.ContextInfo{{InstanceID: 5, Model: "m", WorldSize: 1}},
		Rates: engine.Rates{
			Server: engine.ServerRates{
				Lookups: win(long...), AskedChunks: win(0, 10, 30), HitChunks: win(0, 5, 30),
				StoreBytes: win(1e9, 3e9), TokensSaved: win(256, 768),
				TokensSavedTotal: 123456, TokensSavedHour: 1000.4,
			},
			Contexts: map[int64]engine.ContextRates{
				5: {AskedChunks: win(4, 0), HitChunks: win(1, 0), TokensSavedTotal: 77, TokensSavedHour: 70},
				6: {}, // gone from Contexts: not listed
			},
			Latency: map[string]engine.LatencyRates{
				"LOOKUP": {Rate: win(0, 2), P50: win(0, 0.001), P99: win(0, 0.004)},
				"NOOP":   {Rate: win(0, 0)},
			},
		},
	}
	b, err := json.Marshal(NewStatus(s))
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	var got struct {
		Rates struct {
			WindowSeconds int `json:"window_seconds"`
			LastMinute    struct {
				HitRatio         *float64 `json:"hit_ratio"`
				StoreBytesPerSec float64  `json:"store_bytes_per_s"`
			} `json:"last_minute"`
			Server struct {
				Lookups  []float64  `json:"lookups_per_s"`
				HitRatio []*float64 `json:"hit_ratio"`
			} `json:"server"`
			Latency  map[string]LatencyStatus `json:"latency"`
			Contexts []struct {
				InstanceID  int64    `json:"instance_id"`
				HitRatio    *float64 `json:"hit_ratio"`
				TokensSaved int64    `json:"tokens_saved"`
				LastHour    int64    `json:"tokens_saved_last_hour"`
			} `json:"contexts"`
		} `json:"rates"`
		TokensSaved TokensSavedStatus `json:"tokens_saved"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("unmarshal: %v\n%s", err, b)
	}
	r := got.Rates
	if r.WindowSeconds != RatesWindow || len(r.Server.Lookups) != RatesWindow || r.Server.Lookups[RatesWindow-1] != 99 {
		t.Errorf("server lookups window: %d points ending %v", len(r.Server.Lookups), r.Server.Lookups)
	}
	if h := r.Server.HitRatio; len(h) != 3 || h[0] != nil || *h[1] != 0.5 || *h[2] != 1 {
		t.Errorf("server hit ratio series %s", mustJSON(h))
	}
	if h := r.LastMinute.HitRatio; h == nil || *h != 35.0/40 {
		t.Errorf("last-minute hit ratio %v, want 0.875", h)
	}
	if r.LastMinute.StoreBytesPerSec != 2e9 {
		t.Errorf("last-minute store B/s %v, want 2e9", r.LastMinute.StoreBytesPerSec)
	}
	if _, ok := r.Latency["NOOP"]; ok || len(r.Latency["LOOKUP"].P99Seconds) != 2 {
		t.Errorf("latency kinds %v, want LOOKUP only (NOOP had no requests)", r.Latency)
	}
	if len(r.Contexts) != 1 || r.Contexts[0].InstanceID != 5 || r.Contexts[0].TokensSaved != 77 || r.Contexts[0].LastHour != 70 ||
		r.Contexts[0].HitRatio == nil || *r.Contexts[0].HitRatio != 0.25 {
		t.Errorf("contexts %s", mustJSON(r.Contexts))
	}
	if got.TokensSaved != (TokensSavedStatus{Total: 123456, LastHour: 1000}) {
		t.Errorf("tokens saved %+v", got.TokensSaved)
	}
	// An engine that never sampled still gives arrays, not nulls.
	b, _ = json.Marshal(NewStatus(engine.Snapshot{}))
	if !strings.Contains(string(b), `"lookups_per_s":[]`) || !strings.Contains(string(b), `"hit_ratio":[]`) {
		t.Errorf("empty rates: %s", b)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
