package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"kvdock/core/engine"
)

// restartDescs are the last restart's series: what this start adopted of
// the previous process's pool and how long no process served.
type restartDescs struct {
	adopted, gap *prometheus.Desc
}

func newRestartDescs() restartDescs {
	return restartDescs{
		adopted: prometheus.NewDesc("kvdock_restart_adopted_objects",
			"Objects this start adopted, readable, from the pool the previous process kept (0 for a cold start).", nil, nil),
		gap: prometheus.NewDesc("kvdock_restart_gap_seconds",
			"Seconds from the previous process's stop of reading requests to this one's bind, for an adopted pool (0 for a cold start).", nil, nil),
	}
}

func (d restartDescs) describe(ch chan<- *prometheus.Desc) {
	ch <- d.adopted
	ch <- d.gap
}

func (d restartDescs) collect(r engine.Restart, gauge func(*prometheus.Desc, float64, ...string)) {
	gauge(d.adopted, float64(r.Objects))
	gauge(d.gap, r.Gap.Seconds())
}
