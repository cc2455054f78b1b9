package httpapi

import (
	"math"
	"strconv"
	"time"

	"kvdock/core/engine"
	"kvdock/core/series"
)

// RatesWindow is how many one-second points /status carries: a compact
// recent window (the dashboard keeps the longer history on screen).
const RatesWindow = 60

// RatesStatus is the recent history of the rates, one point a second,
// oldest first, over the last WindowSeconds (fewer right after a start).
// LastMinute sums the window: a reader that polls once a minute needs
// nothing else.
type RatesStatus struct {
	WindowSeconds int                      `json:"window_seconds"`
	StepSeconds   float64                  `json:"step_seconds"`
	LastMinute    RatesSummary             `json:"last_minute"`
	Server        RatesSeries              `json:"server"`
	Latency       map[string]LatencyStatus `json:"latency"`
	Contexts      []ContextRatesStatus     `json:"contexts"`
}

// RatesSummary is the means over the window (HitRatio is hit chunks ÷
// asked chunks over it; null without lookups). WindowSeconds is the span
// they cover: window_seconds, or less right after a start or a reset.
type RatesSummary struct {
	WindowSeconds          float64  `json:"window_seconds"`
	LookupsPerSecond       float64  `json:"lookups_per_s"`
	HitRatio               *float64 `json:"hit_ratio"`
	StoreBytesPerSecond    float64  `json:"store_bytes_per_s"`
	RetrieveBytesPerSecond float64  `json:"retrieve_bytes_per_s"`
	EvictionsPerSecond     float64  `json:"evictions_per_s"`
	TokensSavedPerSecond   float64  `json:"tokens_saved_per_s"`
}

// RatesSeries are the server's series. HitRatio is null for a second
// without lookups.
type RatesSeries struct {
	LookupsPerSecond       []float64   `json:"lookups_per_s"`
	HitRatio               ratioSeries `json:"hit_ratio"`
	StoreBytesPerSecond    []float64   `json:"store_bytes_per_s"`
	RetrieveBytesPerSecond []float64   `json:"retrieve_bytes_per_s"`
	EvictionsPerSecond     []float64   `json:"evictions_per_s"`
	PoolUsedBytes          []float64   `json:"pool_used_bytes"`
	TokensSavedPerSecond   []float64   `json:"tokens_saved_per_s"`
}

// LatencyStatus is one request kind's requests per second and per-second
// p50/p99 in seconds (0 for a second without requests); only kinds seen in
// the window are listed.
type LatencyStatus struct {
	RequestsPerSecond []float64 `json:"requests_per_s"`
	P50Seconds        []float64 `json:"p50_seconds"`
	P99Seconds        []float64 `json:"p99_seconds"`
}

// ContextRatesStatus is one context's last minute: lookups and hit ratio of
// its model (model and world size), its own store and retrieve bytes, as
// means over the window (null hit ratio without lookups). Only the server
// and the request kinds carry whole series: a context list of up to
// --max-instances entries stays small.
type ContextRatesStatus struct {
	InstanceID             int64    `json:"instance_id"`
	LookupsPerSecond       float64  `json:"lookups_per_s"`
	HitRatio               *float64 `json:"hit_ratio"`
	StoreBytesPerSecond    float64  `json:"store_bytes_per_s"`
	RetrieveBytesPerSecond float64  `json:"retrieve_bytes_per_s"`
	TokensSaved            int64    `json:"tokens_saved"`
	TokensSavedLastHour    int64    `json:"tokens_saved_last_hour"`
}

// TokensSavedStatus is the prefill tokens served from cache (hit chunks ×
// chunk size): since Since (the start or the last reset) and in the last
// hour (of that).
type TokensSavedStatus struct {
	Total    int64      `json:"total"`
	LastHour int64      `json:"last_hour"`
	Since    *time.Time `json:"since,omitempty"`
}

// ratioSeries marshals NaN (no lookups that second) as null.
type ratioSeries []float64

func (r ratioSeries) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 2+8*len(r))
	b = append(b, '[')
	for i, v := range r {
		if i > 0 {
			b = append(b, ',')
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			b = append(b, "null"...)
			continue
		}
		b = strconv.AppendFloat(b, v, 'g', 4, 64)
	}
	return append(b, ']'), nil
}

// tail is the newest RatesWindow points of w (never nil: [] in JSON).
func tail(w series.Window) []float64 {
	f := w.Fine
	return append([]float64{}, f[max(0, len(f)-RatesWindow):]...)
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func ratesStatus(s engine.Snapshot) (RatesStatus, TokensSavedStatus) {
	r := s.Rates
	sv := r.Server
	out := RatesStatus{
		WindowSeconds: RatesWindow,
		StepSeconds:   series.FineStep.Seconds(),
		Server: RatesSeries{
			LookupsPerSecond:       tail(sv.Lookups),
			HitRatio:               series.Ratio(tail(sv.HitChunks), tail(sv.AskedChunks)),
			StoreBytesPerSecond:    tail(sv.StoreBytes),
			RetrieveBytesPerSecond: tail(sv.RetrieveBytes),
			EvictionsPerSecond:     tail(sv.Evictions),
			PoolUsedBytes:          tail(sv.PoolUsed),
			TokensSavedPerSecond:   tail(sv.TokensSaved),
		},
		Latency:  map[string]LatencyStatus{},
		Contexts: make([]ContextRatesStatus, 0, len(r.Contexts)),
	}
	srv := out.Server
	out.LastMinute = RatesSummary{
		WindowSeconds:          float64(len(srv.LookupsPerSecond)) * out.StepSeconds,
		LookupsPerSecond:       mean(srv.LookupsPerSecond),
		StoreBytesPerSecond:    mean(srv.StoreBytesPerSecond),
		RetrieveBytesPerSecond: mean(srv.RetrieveBytesPerSecond),
		EvictionsPerSecond:     mean(srv.EvictionsPerSecond),
		TokensSavedPerSecond:   mean(srv.TokensSavedPerSecond),
	}
	if h, ok := series.SumRatio(sv.HitChunks.Fine, sv.AskedChunks.Fine, RatesWindow); ok {
		out.LastMinute.HitRatio = &h
	}
	for name, l := range r.Latency {
		rate := tail(l.Rate)
		if mean(rate) == 0 {
			continue
		}
		out.Latency[name] = LatencyStatus{RequestsPerSecond: rate, P50Seconds: tail(l.P50), P99Seconds: tail(l.P99)}
	}
	for _, c := range s.Contexts {
		cr, ok := r.Contexts[c.InstanceID]
		if !ok {
			continue
		}
		cs := ContextRatesStatus{
			InstanceID:             c.InstanceID,
			LookupsPerSecond:       mean(tail(cr.Lookups)),
			StoreBytesPerSecond:    mean(tail(cr.StoreBytes)),
			RetrieveBytesPerSecond: mean(tail(cr.RetrieveBytes)),
			TokensSaved:            cr.TokensSavedTotal,
			TokensSavedLastHour:    int64(math.Round(cr.TokensSavedHour)),
		}
		if h, ok := series.SumRatio(cr.HitChunks.Fine, cr.AskedChunks.Fine, RatesWindow); ok {
			cs.HitRatio = &h
		}
		out.Contexts = append(out.Contexts, cs)
	}
	return out, TokensSavedStatus{Total: sv.TokensSavedTotal, LastHour: int64(math.Round(sv.TokensSavedHour)), Since: timePtr(s.Stats.Since)}
}
