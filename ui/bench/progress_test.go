package bench

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"kvdock/ui/httpapi"
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

// TestTargetServable: the skip reasons say what the server is and what to do.
func TestTargetServable(t *testing.T) {
	pickleSrv := &target{}
	if ok, why := pickleSrv.servable("shm"); ok || !strings.Contains(why, "pickle workers only") {
		t.Errorf("pickle server, shm: %v %q", ok, why)
	}
	if ok, _ := pickleSrv.servable("pickle"); !ok {
		t.Error("pickle server, pickle: refused")
	}
	st := &httpapi.Status{Endpoint: "tcp://127.0.0.1:5555", ShmName: "lmcache_l1_pool_x"}
	shmSrv := &target{shmName: "lmcache_l1_pool_x", poolSize: 1 << 30, status: st, statusURL: "http://127.0.0.1:8080/status"}
	for _, m := range []string{"shm", "pickle"} {
		if ok, why := shmSrv.servable(m); !ok {
			t.Errorf("kvdock SHM server, %s: %q", m, why)
		}
	}
	if n, from := shmSrv.pool(); n != 1<<30 || !strings.Contains(from, "advertised") {
		t.Errorf("pool without a capacity in /status: %d %q", n, from)
	}
	if n, _ := pickleSrv.pool(); n != 0 {
		t.Errorf("pickle server without /status: pool %d, want unknown (0)", n)
	}
	st.Pool.CapacityBytes = 2 << 30
	if n, from := shmSrv.pool(); n != 2<<30 || !strings.Contains(from, "/status") {
		t.Errorf("pool from /status: %d %q", n, from)
	}
	if n, from := shmSrv.residentPool(); n != 0 || !strings.Contains(from, "count as overhead") {
		t.Errorf("pool not prefaulted: resident %d %q, want 0", n, from)
	}
	st.Pool.PrefaultedBytes = 2 << 30
	if n, from := shmSrv.residentPool(); n != 2<<30 || !strings.Contains(from, "prefaulted pool") {
		t.Errorf("pool prefaulted: resident %d %q", n, from)
	}
	if why := shmSrv.notThisServer(5555); why != "" {
		t.Errorf("the same server: %q", why)
	}
	if why := shmSrv.notThisServer(5556); !strings.Contains(why, "not of the one on port 5556") {
		t.Errorf("another server's status: %q", why)
	}
	unknown := &target{shmName: "lmcache_l1_pool_x", poolSize: 1 << 30, statusURL: "http://h:1/status", statusErr: errors.New("connection refused")}
	if ok, why := unknown.servable("pickle"); ok || !strings.Contains(why, "connection refused") || !strings.Contains(why, "--http-port") {
		t.Errorf("SHM server without /status, pickle: %v %q", ok, why)
	}
	far := &target{shmName: "lmcache_l1_pool_x", poolSize: 1 << 30, attachErr: errors.New("no such file or directory")}
	if ok, why := far.servable("shm"); ok || !strings.Contains(why, "server's machine") {
		t.Errorf("segment not here, shm: %v %q", ok, why)
	}
	for _, name := range []string{"", "/", "../etc/passwd", "a/b", "..", "x\x00"} {
		if err := canOpenSegment(t.TempDir(), name); err == nil {
			t.Errorf("segment name %q opened", name)
		}
	}
}
