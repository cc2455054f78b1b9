package dashboard

import (
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"

	"kvdock/core/hostmem"
	"kvdock/core/misses"
	"kvdock/core/tierstate"
)

func TestMissText(t *testing.T) {
	if got := missText(misses.Counts{}, 80); got != "none" {
		t.Fatalf("no misses: %q", got)
	}
	c := misses.Counts{misses.Refused: 2, misses.Evicted: 1500, misses.OtherLayout: 30, misses.Expired: 1, misses.Cleared: 1}
	wide := missText(c, 200)
	if wide != "1534 chunks: 1500 evicted · 30 other layout · 2 refused · 1 expired · 1 cleared" {
		t.Fatalf("wide: %q", wide)
	}
	narrow := missText(c, 50)
	if len(narrow) > 50 || !strings.HasPrefix(narrow, "1534 chunks: 1500 evicted") || !strings.HasSuffix(narrow, "more") {
		t.Fatalf("narrow: %q", narrow)
	}
	// Too narrow for anything but the largest reason: it still shows it.
	if got := missText(c, 5); !strings.Contains(got, "evicted") {
		t.Fatalf("tiny: %q", got)
	}
}

func TestPoolAndGPUPanesShowHostRAMAndNUMA(t *testing.T) {
	f := newFakeEngine(t)
	f.snap.Host = hostmem.Host{Memory: hostmem.Memory{Total: 64 << 30, Available: 10 << 30}, Nodes: 2,
		Pool: hostmem.Placement{Pages: []int64{1, 3}}}
	f.snap.Misses.TierMissed = 12
	// Without an L2 tier there was nothing to miss there: not said.
	if pool := ansi.Strip(strings.Join(newTestModel(t, f, 120, 40).pool.lines(120), "\n")); strings.Contains(pool, "missed L2") {
		t.Fatalf("pool pane without a tier says the lookups missed L2:\n%s", pool)
	}
	f.snap.Tiers = []tierstate.Tier{{Index: 0, Type: "fs", State: tierstate.Up}}
	m := newTestModel(t, f, 120, 40)
	pool := ansi.Strip(strings.Join(m.pool.lines(120), "\n"))
	for _, want := range []string{"Host RAM  10.0 GiB available / 64.0 GiB · NUMA N0 25% N1 75%", "(12 missed L2 too)"} {
		if !strings.Contains(pool, want) {
			t.Fatalf("pool pane lacks %q:\n%s", want, pool)
		}
	}
	if gpu := ansi.Strip(strings.Join(m.gpu.lines(120), "\n")); !strings.Contains(gpu, "NUMA N0 25% N1 75%") {
		t.Fatalf("GPU pane lacks the host line:\n%s", gpu)
	}
	f.snap.GPU.Available = false
	m = newTestModel(t, f, 120, 40)
	if gpu := strings.Join(m.gpu.lines(120), "\n"); !strings.Contains(gpu, "Host RAM") {
		t.Fatalf("GPU pane without NVML lacks the host line:\n%s", gpu)
	}
	// A context whose lookups never missed says so.
	if got := m.pc.contextMissLine("Qwen/Qwen2-0.5B", 1, 120); !strings.Contains(got, "none") {
		t.Fatalf("context line %q", got)
	}
}
