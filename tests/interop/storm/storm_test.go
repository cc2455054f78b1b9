// Package storm restarts kvdock 50 times, SIGUSR2 and SIGTERM with the
// same command line in turn, under three upstream-like Python workers
// (py/restart_worker.py) that store, look up and retrieve without pause, in
// SHM mode and in pickle mode: none registers again, nothing is refused or
// served wrong. docs/RESTART.md gives the figures.
package storm

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"kvdock/tests/harness"
)

// stormRestarts is how many times TestRestartStormUpstreamWorkers restarts
// kvdock in each mode (STORM_RESTARTS overrides it).
func stormRestarts(t *testing.T) int {
	if v := os.Getenv("STORM_RESTARTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("STORM_RESTARTS=%q: want a positive count", v)
		}
		return n
	}
	return 50
}

// Three Python worker processes, each one LMCache worker as upstream's
// non-GPU code drives it (an SHM PREPARE_STORE that raises on a reply not
// come within 2 s, upstream's mq_timeout; a pickle store that answers
// false or nothing; each its own DEALERs, one request at a time), loop
// store → LOOKUP → retrieve without pause (the first 2,000 stores each, so
// the pool holds about 12,000 chunks) while kvdock restarts 50 times,
// SIGUSR2 and SIGTERM + the same command line in turn, 0.5 s apart. No
// worker registers again. In SHM mode and in pickle mode (the seed's own
// --shm-name ""): none is refused, no committed prompt misses, no byte
// differs, every prompt committed reads back identical at the end, and no
// lock is left held but a timed-out request's. Timeouts (an exception in the engine) are counted
// and bounded: at most one in four restarts, for the race a worker's
// descheduled libzmq I/O thread can lose (docs/RESTART.md, "No request
// lost").
func TestRestartStormUpstreamWorkers(t *testing.T) {
	for _, mode := range []struct {
		name   string
		pickle bool
	}{{"shm", false}, {"pickle", true}} {
		t.Run(mode.name, func(t *testing.T) {
			flags := []string{"--chunk-size", "16", "--l1-size-gb", "0.25"}
			var srv *harness.Server
			if mode.pickle {
				srv = harness.StartKeepingPickle(t, flags...)
			} else {
				srv = harness.StartKeeping(t, false, flags...)
			}
			const procs = 3
			ws := make([]*harness.RestartWorker, procs)
			for i := range ws {
				p, err := json.Marshal(map[string]any{"profile": "nongpu-v1", "prompts": 2, "chunks": 2, "timeout": 2.0,
					"rid_prefix": fmt.Sprintf("p%d-", i), "store_limit": 2000, "workers": []map[string]any{{"instance_id": 7301 + i, "pickle": mode.pickle}}})
				if err != nil {
					t.Fatal(err)
				}
				ws[i] = harness.StartRestartWorker(t, srv.Endpoint, string(p))
				if r := ws[i].Report(); !r.Ready {
					t.Fatalf("worker %d: %+v", i, r)
				}
			}
			for i, w := range ws {
				w.StoreAll(fmt.Sprint("before", i), 2)
			}
			for _, w := range ws {
				if r := w.Ask("loop"); !r.Looping {
					t.Fatalf("loop did not start: %+v", r)
				}
			}
			n := stormRestarts(t)
			var slowest time.Duration
			var parked, late, carried int64
			for i := range n {
				time.Sleep(500 * time.Millisecond)
				var took time.Duration
				if i%2 == 0 {
					took = srv.RestartSignal(t)
				} else {
					took = srv.RestartTerm(t)
				}
				slowest = max(slowest, took)
				rs := srv.LastRestart(t)
				if !rs.Adopted || rs.AdoptedContexts != procs {
					t.Fatalf("restart %d: %+v", i, rs)
				}
				parked, late, carried = parked+rs.HandoverParked, late+rs.HandoverLost, carried+rs.Transfers
			}
			time.Sleep(500 * time.Millisecond)
			var total harness.RestartReport
			for i, w := range ws {
				r := w.Ask("stop")
				t.Logf("worker %d: %d iterations, %d requests in %.1fs: %d timed out, %d refused, %d missed, %d wrong; slowest answer %.3fs",
					i, r.Iterations, r.Requests, r.Seconds, r.Timeouts, r.Refused, r.Missed, r.Wrong, r.SlowestS)
				if r.Iterations == 0 || r.Committed == 0 {
					t.Errorf("worker %d did no work through the restarts: %+v", i, r)
				}
				if r.Refused+r.Missed+r.Wrong != 0 {
					t.Errorf("worker %d: %d refused, %d missed, %d wrong; first failures %+v",
						i, r.Refused, r.Missed, r.Wrong, r.Failures)
				}
				if r.Timeouts > 0 {
					t.Logf("worker %d: %d timed out (target 0): %+v", i, r.Timeouts, r.Failures)
				}
				total.Requests += r.Requests
				total.Timeouts += r.Timeouts
			}
			t.Logf("%s: %d restarts (slowest back after %v), %d requests, %d timed out; the handovers parked and answered %d, carried %d transfers, read %d after their last answers",
				mode.name, n, slowest.Round(time.Millisecond), total.Requests, total.Timeouts, parked, carried, late)
			if parked == 0 {
				t.Errorf("no handover parked a request over %d restarts under load: the workers were not looping", n)
			}
			// A request can still time out in one way: its worker's libzmq
			// I/O thread, descheduled between the last answer and the end
			// of the connection, lets the worker send down the closing
			// connection (the old process reads and counts such a request
			// while it can). Measured on the 2-core machine: SHM 1-4 and
			// pickle 1-5 of 150 worker restarts, quiet or loaded.
			if limit := max(1, n/4); total.Timeouts > limit {
				t.Errorf("%d requests timed out over %d restarts (%d counted as arriving after a handover's last answer), more than %d",
					total.Timeouts, n, late, limit)
			}
			if t.Failed() {
				for _, l := range strings.Split(srv.Output(), "\n") {
					if strings.Contains(l, "hand") || strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
						t.Log(l)
					}
				}
			}
			for i, w := range ws {
				w.CheckAll(fmt.Sprintf("the storm (worker %d)", i))
			}
			// Every transfer has ended: nothing stays locked, but what a
			// timed-out request's transfer or lookup took (2 chunks each,
			// held to their TTL: its worker went on without it).
			allowed := 2 * 2 * total.Timeouts
			deadline := time.Now().Add(15 * time.Second)
			for {
				wl, rl, err := lockedObjects(srv)
				if err == nil && wl+rl <= allowed {
					if wl+rl > 0 {
						t.Logf("after the storm: %d write-locked and %d read-locked objects left by %d timed-out requests", wl, rl, total.Timeouts)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after the storm: %d write-locked and %d read-locked objects left (%v), %d timed-out requests allow %d",
						wl, rl, err, total.Timeouts, allowed)
				}
				time.Sleep(100 * time.Millisecond) // polling a condition, bounded by the deadline
			}
		})
	}
}

// lockedObjects reads the pool's write- and read-locked object counts.
func lockedObjects(srv *harness.Server) (write, read int, err error) {
	hc := http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/status", srv.HTTPPort))
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	var st struct {
		Pool struct {
			WriteLocked int `json:"write_locked"`
			ReadLocked  int `json:"read_locked"`
		} `json:"pool"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return 0, 0, err
	}
	return st.Pool.WriteLocked, st.Pool.ReadLocked, nil
}
