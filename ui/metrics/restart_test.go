package metrics

import (
	"testing"
	"time"

	"kvdock/core/engine"
	"kvdock/core/testkit/promseries"
)

func TestRestartSeries(t *testing.T) {
	m := New()
	src := &fakeSource{}
	m.Watch(src)
	if f := gather(t, m); promseries.Value(t, f, "kvdock_restart_adopted_objects") != 0 || promseries.Value(t, f, "kvdock_restart_gap_seconds") != 0 {
		t.Fatal("a cold start reports a restart")
	}
	src.set(func(s *engine.Snapshot) {
		s.Restart = engine.Restart{Adopted: true, Objects: 48, Gap: 1500 * time.Millisecond}
	})
	f := gather(t, m)
	if got := promseries.Value(t, f, "kvdock_restart_adopted_objects"); got != 48 {
		t.Fatalf("adopted objects %v", got)
	}
	if got := promseries.Value(t, f, "kvdock_restart_gap_seconds"); got != 1.5 {
		t.Fatalf("gap %v", got)
	}
}
