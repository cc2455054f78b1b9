package dashboard

import (
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"

	"kvdock/core/whatif"
)

func TestWhatIfPoolPane(t *testing.T) {
	f := newFakeEngine(t)
	m := newTestModel(t, f, 160, 48)
	m.goPane(panePool)
	v := goldenView(m)
	for _, want := range []string{"2× pool: hit ratio 41 % → 63 %", "½× pool: 41 % → 30 %", "[1×]", "× pool (1.0 GiB now)", "63%"} {
		if !strings.Contains(v, want) {
			t.Errorf("160x48 pool pane lacks %q:\n%s", want, v)
		}
	}
	// No room for the chart: the headline alone, and it fits the width.
	lines := m.pc.whatIfLines(80, whatIfChartRows-1)
	if len(lines) != 2 || !strings.Contains(lines[1], "2× pool: hit ratio 41 % → 63 %") {
		t.Errorf("short pane: %q", lines)
	}
	// One row left: the headline without its blank line; none: nothing.
	if got := m.pc.whatIfLines(80, 1); len(got) != 1 || !strings.Contains(got[0], "2× pool: hit ratio 41 % → 63 %") {
		t.Errorf("one row left: %q, want the headline", got)
	}
	if got := m.pc.whatIfLines(80, 0); got != nil {
		t.Errorf("no row left: %q, want nothing", got)
	}
	// A noop pool evicts nothing: the curve says it models LRU.
	m.pc.snap.Pool.Policy = "noop"
	if l := m.pc.whatIfLines(160, 2); !strings.Contains(l[1], "modelled with LRU eviction; this pool's policy is noop") {
		t.Errorf("noop pool: %q", l)
	}
	// Before traffic: says so in words, no chart of zeros.
	f.snap.WhatIf = whatif.Curve{}
	m = newTestModel(t, f, 160, 48)
	m.goPane(panePool)
	if v := goldenView(m); !strings.Contains(v, "no lookups seen yet") || strings.Contains(v, "[1×]") {
		t.Errorf("no traffic:\n%s", v)
	}
}

// TestWhatIfPolicyCurves: with both policies' curves, the headline and
// the bars are the configured policy's, named, with what the other policy
// would hit at this size when the two differ.
func TestWhatIfPolicyCurves(t *testing.T) {
	f := newFakeEngine(t)
	for _, p := range f.snap.WhatIf.Points {
		p.HitRatio = min(1, p.HitRatio+0.07) // prefix hits more on this traffic
		f.snap.WhatIf.Prefix = append(f.snap.WhatIf.Prefix, p)
	}
	for _, c := range []struct {
		policy string
		want   []string
	}{
		{"LRU", []string{"2× pool: hit ratio 41 % → 63 %", "LRU eviction; prefix-aware at this size: 41 % → 48 %", " 63% "}},
		{"prefix", []string{"2× pool: hit ratio 48 % → 70 %", "prefix eviction; with LRU at this size: 48 % → 41 %", " 70% "}},
	} {
		f.snap.Pool.Policy = c.policy
		m := newTestModel(t, f, 160, 48)
		text := ansi.Strip(strings.Join(m.pc.whatIfLines(160, whatIfChartRows), "\n"))
		for _, w := range c.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s pool: what-if lacks %q:\n%s", c.policy, w, text)
			}
		}
	}
	// Curves that agree at this size: the policy alone.
	f.snap.WhatIf.Prefix = f.snap.WhatIf.Points
	f.snap.Pool.Policy = "prefix"
	m := newTestModel(t, f, 160, 48)
	if l := ansi.Strip(m.pc.whatIfLines(160, 2)[1]); !strings.HasSuffix(l, "½× pool: 41 % → 30 %   prefix eviction") {
		t.Errorf("curves that agree: %q", l)
	}
}

func TestBarGlyph(t *testing.T) {
	for _, c := range []struct {
		f    float64
		want string
	}{{-1, " "}, {0, " "}, {0.5, "▄"}, {1, "█"}, {3, "█"}} {
		if got := barGlyph(c.f); got != c.want {
			t.Errorf("barGlyph(%v) = %q, want %q", c.f, got, c.want)
		}
	}
}
