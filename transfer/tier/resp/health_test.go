package resp

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"kvdock/core/testkit/fakeresp"
	"kvdock/core/testkit/redisserver"
	"kvdock/core/tierstate"
)

// idleDownLimit is how soon a server that dies while nothing touches the
// tier must show: the health PING runs every healthEvery.
const idleDownLimit = 10 * time.Second

// TestIdleTierDownWhenServerKilled: a server killed while no call touches
// the tier turns it down within seconds, with the reason, and it comes back
// up by itself once the server listens again.
func TestIdleTierDownWhenServerKilled(t *testing.T) {
	tr, s := startTier(t)
	if err := tr.Put(context.Background(), key(1), value(1, 1024)); err != nil {
		t.Fatal(err)
	}
	// Idle: the start-up adoption of this host's index and the write's
	// index update are done, so only the health check can notice the kill.
	time.Sleep(2 * healthEvery)
	killed := time.Now()
	s.Kill()
	st := waitState(t, tr, tierstate.Down, idleDownLimit)
	took := time.Since(killed)
	if !strings.Contains(st.Reason, "health check") {
		t.Fatalf("down reason %q does not say the health check found it", st.Reason)
	}
	s.Restart()
	waitState(t, tr, tierstate.Up, stateLimit)
	t.Logf("idle tier down %v after SIGKILL (reason %q), up again after the restart", took.Round(time.Millisecond), st.Reason)
}

// TestIdleTierDownWhenServerSilent: a server that stops answering without
// closing the connection (a partition, a hung process) turns an idle tier
// down once a health PING has gone unanswered for pingPatience.
func TestIdleTierDownWhenServerSilent(t *testing.T) {
	var silent atomic.Bool
	hold := make(chan struct{})
	n := fakeresp.Start(t, func(cmd []string) []byte {
		if cmd[0] == "PING" && silent.Load() {
			<-hold
		}
		if r := fakeresp.Basic(cmd); r != nil {
			return r
		}
		return fakeresp.Err("ERR unexpected " + cmd[0])
	})
	// Before the node's cleanup, which waits for its handlers.
	t.Cleanup(func() { close(hold) })
	tr, _ := open(t, fakeCfg(n))
	time.Sleep(2 * healthEvery) // healthy PINGs keep it up
	if st := tr.Stats(); st.State != tierstate.Up {
		t.Fatalf("a server answering PING: %s (%q)", st.State, st.Reason)
	}
	silenced := time.Now()
	silent.Store(true)
	st := waitState(t, tr, tierstate.Down, idleDownLimit)
	if !strings.Contains(st.Reason, "no answer to a PING") {
		t.Fatalf("down reason %q does not say the PING went unanswered", st.Reason)
	}
	t.Logf("silent server: down after %v (%q)", time.Since(silenced).Round(time.Millisecond), st.Reason)
}

// TestHostileSilentServerAtStartDoesNotHoldOpen: a server that accepts
// connections but answers nothing (SIGSTOP) makes Open wait startWait, not
// the dial timeout: kvdock serves once its tiers are open, and a restart
// must answer inside a worker's 2 s timeout. The tier starts down with the
// reason and comes up by itself once the server answers.
func TestHostileSilentServerAtStartDoesNotHoldOpen(t *testing.T) {
	s := redisserver.Start(t, redisserver.Options{})
	s.Pause()
	start := time.Now()
	tr, _ := open(t, standaloneCfg(s))
	took := time.Since(start)
	st := tr.Stats()
	t.Logf("Open with the server paused: %v, %s (%q)", took.Round(time.Millisecond), st.State, st.Reason)
	if took > startWait+time.Second {
		t.Errorf("Open took %v with the server silent: the dial held it (bound %v)", took, startWait)
	}
	if st.State != tierstate.Down || !strings.Contains(st.Reason, "no answer within") {
		t.Fatalf("tier %s (%q) after a silent start, want down with the reason", st.State, st.Reason)
	}
	s.Resume()
	waitState(t, tr, tierstate.Up, stateLimit)
}
