// Package promseries picks one series out of a parsed Prometheus metric
// family by its labels, for tests that check exported metrics.
package promseries

import (
	"io"
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

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

// Parse parses a text exposition; the test fails when it does not parse.
func Parse(t testing.TB, body io.Reader) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(body)
	if err != nil {
		t.Fatalf("the metrics do not parse: %v", err)
	}
	return fams
}

// Scrape GETs the exposition at url (a server's /metrics) and parses it.
func Scrape(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s", url, resp.Status)
	}
	return Parse(t, resp.Body)
}

// Value is the value of the first series of name whose labels include
// labels (as for Match): a counter's, a gauge's or an untyped sample's
// value, a histogram's sample count. The test fails when there is none.
func Value(t testing.TB, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("metric %s missing", name)
	}
	m, _ := Match(f, labels...)
	switch {
	case m == nil:
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	t.Fatalf("metric %s has no series with labels %v", name, labels)
	return 0
}
