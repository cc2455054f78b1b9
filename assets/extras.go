package assets

import _ "embed"

//go:embed grafana-dashboard.json
var grafanaDashboard []byte

//go:embed kvdock.service
var systemdUnit []byte

// GrafanaDashboard returns a Grafana dashboard (JSON model) over kvdock's
// /metrics: pool usage, hit ratio, request rate by type, latency p50/p99,
// transfer bytes by mode, contexts by mode, bad input and GPU memory. The
// slice is a copy.
func GrafanaDashboard() []byte {
	return append([]byte(nil), grafanaDashboard...)
}

// SystemdUnit returns the systemd unit for headless mode
// (ExecStart=/usr/local/bin/kvdock --headless). The slice is a copy.
func SystemdUnit() []byte {
	return append([]byte(nil), systemdUnit...)
}
