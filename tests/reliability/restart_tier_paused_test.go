package reliability

import (
	"testing"
	"time"

	"kvdock/core/testkit/redisserver"
	"kvdock/tests/harness"
)

// TestHostileRestartWithRedisPausedIsNotHeld: a Redis tier whose server
// stops answering (SIGSTOP) with writes queued and in flight must not hold
// a stop for a restart: the write in flight is cut when the stop cancels
// it, the clients' close is bounded, a reconnect probe ends with the stop.
// Each stop (SIGTERM, the pool kept) ends within 1.5 s, the new process
// answers within 1.9 s of the stop's start (a worker's timeout is 2 s),
// adopts the pool, and every L1 chunk hits. The writes still queued are
// dropped (the chunks stay in the kept L1).
func TestHostileRestartWithRedisPausedIsNotHeld(t *testing.T) {
	r := redisserver.Start(t, redisserver.Options{})
	srv := harness.StartKeeping(t, false, "--chunk-size", "16", "--l2-adapter",
		tierAdapter(t, map[string]any{"type": "resp", "host": "127.0.0.1", "port": r.Port}))
	w := tierWorker(t, srv, 1, "resp-paused", harness.WorkerHidden)
	storePrompt(t, w, 0, 2)
	waitTierIdle(t, srv)
	r.Pause()
	for seed := 1; seed <= 20; seed++ {
		storePrompt(t, w, seed, 2)
	}
	if d := tier0(t, srv).QueueDepth; d == 0 {
		t.Fatal("nothing queued for the paused tier")
	}
	// The first stop has a connected tier with a write in flight; the
	// second a tier that found its server silent at start and probes it.
	for i := range 2 {
		if i > 0 {
			storePrompt(t, w, 100, 2)
		}
		var stopped time.Duration
		start := time.Now()
		took := srv.RestartTermWith(t, func() { stopped = time.Since(start) })
		rs := srv.LastRestart(t)
		t.Logf("stop %d with the tier's server paused: %v; back after %v (server gap %.0f ms)", i,
			stopped.Round(time.Millisecond), took.Round(time.Millisecond), rs.GapMs)
		if !rs.Adopted {
			t.Fatalf("restart %d: pool not adopted: %+v", i, rs)
		}
		if stopped > 1500*time.Millisecond {
			t.Errorf("stop %d took %v with the tier's server paused: the tier held it", i, stopped)
		}
		// The new process opens its tiers before it serves: a silent
		// server must not hold it past a worker's timeout (upstream's SHM
		// worker raises after 2 s; waiting out the whole dial timeout
		// leaves 2.3-2.5 s).
		if rs.GapMs > 1900 {
			t.Errorf("restart %d: %.0f ms without answers with the tier's server paused", i, rs.GapMs)
		}
	}
	for seed := 0; seed <= 20; seed++ {
		if good, wrong := checkPrompt(t, w, seed, 2); good != 2 || wrong != 0 {
			t.Fatalf("prompt %d after the restarts: %d good, %d wrong chunks", seed, good, wrong)
		}
	}
}
