package metrics

import (
	"testing"

	"kvdock/core/engine"
	"kvdock/core/series"
	"kvdock/core/testkit/promseries"
)

// TestTokensSavedAndRateGauges: the tokens-saved counter and the
// last-minute gauges come from the engine's sampled rates, at zero before
// any traffic.
func TestTokensSavedAndRateGauges(t *testing.T) {
	src, m := watched()
	f := gather(t, m)
	for _, n := range []string{"kvdock_tokens_saved_total", "kvdock_hit_ratio_last_minute", "kvdock_store_bytes_per_second_last_minute"} {
		if v := promseries.Value(t, f, n); v != 0 {
			t.Errorf("%s = %v before traffic, want 0", n, v)
		}
	}
	old := make([]float64, 100) // outside the last minute: 100 asked, none hit
	for i := range old {
		old[i] = 1
	}
	src.set(func(s *engine.Snapshot) {
		s.Rates.Server = engine.ServerRates{
			TokensSavedTotal: 4096, TokensSavedHour: 1024,
			AskedChunks: series.Window{Fine: append(old, 4, 4)}, HitChunks: series.Window{Fine: append(make([]float64, 100), 3, 1)},
			StoreBytes: series.Window{Fine: []float64{2e9, 4e9}},
		}
	})
	f = gather(t, m)
	if v := promseries.Value(t, f, "kvdock_tokens_saved_total"); v != 4096 {
		t.Errorf("tokens saved total %v, want 4096", v)
	}
	if v := promseries.Value(t, f, "kvdock_tokens_saved_last_hour"); v != 1024 {
		t.Errorf("tokens saved last hour %v, want 1024", v)
	}
	// 4 hit of 58 × 1 + 8 asked in the last 60 s.
	if v := promseries.Value(t, f, "kvdock_hit_ratio_last_minute"); v != 4.0/66 {
		t.Errorf("hit ratio %v, want %v", v, 4.0/66)
	}
	if v := promseries.Value(t, f, "kvdock_store_bytes_per_second_last_minute"); v != 3e9 {
		t.Errorf("store B/s %v, want 3e9", v)
	}
}
