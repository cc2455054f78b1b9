// Package promseries picks one series out of a parsed Prometheus metric
// family by its labels, for tests that check exported metrics.
package promseries

import dto "github.com/prometheus/client_model/go"

// Match returns the first series of f whose labels include every
// name/value pair of labels (name, value, name, value, …).
func Match(f *dto.MetricFamily, labels ...string) (*dto.Metric, bool) {
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if have[labels[i]] != labels[i+1] {
				continue next
			}
		}
		return m, true
	}
	return nil, false
}
