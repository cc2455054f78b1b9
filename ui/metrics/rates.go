package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"kvdock/core/engine"
	"kvdock/core/series"
)

// lastMinute is the window the rate gauges average over. Prometheus keeps
// history itself (rate() over the counters); these gauges give the figures
// the dashboard shows, for a panel that wants the same numbers.
const lastMinute = 60

// ratesDescs are the tokens-saved counter and the last-minute gauges read
// from the engine's sampled rates.
type ratesDescs struct {
	tokensSaved, tokensHour, hitRatio, lookupsRate, storeRate, retrieveRate, evictRate *prometheus.Desc
}

func newRatesDescs() ratesDescs {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return ratesDescs{
		tokensSaved:  d("kvdock_tokens_saved_total", "Prefill tokens served from cache (LOOKUP hit chunks × chunk size): tokens the workers did not recompute."),
		tokensHour:   d("kvdock_tokens_saved_last_hour", "Prefill tokens served from cache in the last hour."),
		hitRatio:     d("kvdock_hit_ratio_last_minute", "LOOKUP chunks hit ÷ chunks asked over the last minute (0 without lookups)."),
		lookupsRate:  d("kvdock_lookups_per_second_last_minute", "LOOKUP requests per second, mean of the last minute."),
		storeRate:    d("kvdock_store_bytes_per_second_last_minute", "KV bytes stored per second, mean of the last minute."),
		retrieveRate: d("kvdock_retrieve_bytes_per_second_last_minute", "KV bytes served per second, mean of the last minute."),
		evictRate:    d("kvdock_evictions_per_second_last_minute", "L1 evictions per second, mean of the last minute."),
	}
}

func (r ratesDescs) describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{r.tokensSaved, r.tokensHour, r.hitRatio, r.lookupsRate, r.storeRate, r.retrieveRate, r.evictRate} {
		ch <- d
	}
}

// collect emits the rates of s. TokensSavedTotal is already monotonic
// across restarts and rebuilds (the engine accumulates it).
func (r ratesDescs) collect(s engine.Snapshot, ch chan<- prometheus.Metric) {
	sv := s.Rates.Server
	g := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	ch <- prometheus.MustNewConstMetric(r.tokensSaved, prometheus.CounterValue, float64(sv.TokensSavedTotal))
	g(r.tokensHour, sv.TokensSavedHour)
	ratio, _ := series.SumRatio(sv.HitChunks.Fine, sv.AskedChunks.Fine, lastMinute)
	g(r.hitRatio, ratio)
	g(r.lookupsRate, sv.Lookups.Mean(lastMinute))
	g(r.storeRate, sv.StoreBytes.Mean(lastMinute))
	g(r.retrieveRate, sv.RetrieveBytes.Mean(lastMinute))
	g(r.evictRate, sv.Evictions.Mean(lastMinute))
}
