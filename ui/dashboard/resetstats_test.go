package dashboard

import (
	"testing"
	"time"

	"kvdock/core/engine"
)

// resettingEngine is the fake engine that can reset its statistics.
type resettingEngine struct {
	*fakeEngine
	resets []engine.ClearOrigin
}

func (r *resettingEngine) ResetStats(by engine.ClearOrigin) (time.Time, error) {
	r.resets = append(r.resets, by)
	return t0, nil
}

// Z asks first; n keeps the statistics, y resets them as the dashboard's
// and says so. An engine that cannot reset says that instead.
func TestResetStatsKey(t *testing.T) {
	eng := &resettingEngine{fakeEngine: newFakeEngine(t)}
	m := newTestModel(t, eng.fakeEngine, 120, 40)
	m.eng = eng
	press(t, m, "Z")
	mustContain(t, screen(m), "RESET STATISTICS?", "tokens saved, miss breakdown and what-if start again")
	press(t, m, "n")
	mustContain(t, screen(m), "statistics kept")
	if len(eng.resets) != 0 {
		t.Fatalf("n reset the statistics: %v", eng.resets)
	}
	press(t, m, "Z")
	_, cmd := m.Update(keyMsg("y"))
	if cmd == nil {
		t.Fatal("y sent nothing to the engine")
	}
	m.Update(cmd())
	if len(eng.resets) != 1 || eng.resets[0] != engine.ClearByDashboard {
		t.Fatalf("resets %v, want one by the dashboard", eng.resets)
	}
	mustContain(t, screen(m), "statistics reset")

	plain := newTestModel(t, newFakeEngine(t), 120, 40)
	press(t, plain, "Z")
	press(t, plain, "y")
	mustContain(t, screen(plain), "cannot reset its statistics")
}
