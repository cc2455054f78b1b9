package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// newTestProgress is a progress without its loop: render is driven by hand.
func newTestProgress(tty bool) *progress {
	return &progress{tty: tty, start: time.Unix(1000, 0), every: time.Second, heartbeat: 10 * time.Second}
}

// TestProgressPlainLinesPerPhaseAtMostOneASecond: off a terminal, a line
// when the phase changes (not per round), a heartbeat within a long phase,
// never two within a second, and no control characters.
func TestProgressPlainLinesPerPhaseAtMostOneASecond(t *testing.T) {
	p := newTestProgress(false)
	at := func(s float64) time.Time { return p.start.Add(time.Duration(s * float64(time.Second))) }
	if out := p.render(at(0)); out != "" {
		t.Fatalf("no phase yet, rendered %q", out)
	}
	p.setPhase("shm: store/retrieve", "round 1, store")
	p.add(1_500_000_000)
	out := p.render(at(0.5))
	if out != "kvdock bench: shm: store/retrieve · 0.5 s · 1.500 GB moved\n" {
		t.Fatalf("first line %q", out)
	}
	p.setPhase("shm: store/retrieve", "round 2, retrieve")
	for _, s := range []float64{1.6, 5, 10.4} {
		if out := p.render(at(s)); out != "" {
			t.Errorf("same phase at %.1f s: %q (a round is not a phase)", s, out)
		}
	}
	if out := p.render(at(10.6)); !strings.Contains(out, "10.6 s") {
		t.Errorf("heartbeat after 10 s: %q", out)
	}
	p.setPhase("shm: small requests", "NOOP, LOOKUP+STATUS")
	if out := p.render(at(11)); out != "" {
		t.Errorf("a new phase within a second of the last line: %q", out)
	}
	out = p.render(at(11.7))
	if !strings.Contains(out, "small requests ·") || strings.ContainsAny(out, "\r\x1b") || strings.Count(out, "\n") != 1 {
		t.Errorf("new phase line %q", out)
	}
}

// TestProgressTerminalRedrawsAndErases: on a terminal the line is redrawn
// in place with the round, and erased when the run ends.
func TestProgressTerminalRedrawsAndErases(t *testing.T) {
	p := newTestProgress(true)
	p.cols = 60
	p.setPhase("pickle: store/retrieve", "round 3/5, store")
	now := time.Now()
	out := p.render(now)
	if !strings.HasPrefix(out, "\r\x1b[K") || !strings.Contains(out, "round 3/5, store") || strings.Contains(out, "\n") {
		t.Errorf("terminal line %q", out)
	}
	if n := len([]rune(strings.TrimPrefix(out, "\r\x1b[K"))); n > 59 {
		t.Errorf("terminal line of %d columns on a 60-column terminal (it would wrap): %q", n, out)
	}
	if again := p.render(now.Add(minRedraw / 2)); again != "" {
		t.Errorf("redrawn within %v: %q", minRedraw/2, again)
	}
	var b bytes.Buffer
	live := newProgress(&b, true)
	live.setPhase("references", "")
	live.close()
	if !strings.HasSuffix(b.String(), "\r\x1b[K") {
		t.Errorf("line not erased at the end: %q", b.String())
	}
	var nilp *progress // --json: every method is a no-op
	nilp.setPhase("x", "y")
	nilp.add(1)
	nilp.close()
}
