package restart

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"kvdock/tests/harness"
)

// restartProfile is one kind of LMCache worker that lives across a kvdock
// restart: the server flags it needs and the workers it runs.
type restartProfile struct {
	name    string
	flags   []string
	workers []map[string]any
	modes   string
}

var restartProfiles = []restartProfile{
	{name: "nongpu-v1", flags: []string{"--chunk-size", "16"},
		workers: []map[string]any{{"instance_id": 7001}, {"instance_id": 7002, "pickle": true}}, modes: "[shm pickle]"},
	{name: "engine-driven", flags: []string{"--chunk-size", "16", "--protocol", "engine-driven"},
		workers: []map[string]any{{"instance_id": 7101}}, modes: "[shm]"},
}

// startRestartWorkers runs py/restart_worker.py against srv with prof's
// workers (registered once, here) and checks their modes and segment.
func startRestartWorkers(t *testing.T, srv *harness.Server, prof restartProfile, prompts int, timeout time.Duration) *harness.RestartWorker {
	t.Helper()
	p, err := json.Marshal(map[string]any{"profile": prof.name, "workers": prof.workers, "prompts": prompts, "chunks": 2,
		"timeout": timeout.Seconds()})
	if err != nil {
		t.Fatal(err)
	}
	w := harness.StartRestartWorker(t, srv.Endpoint, string(p))
	r := w.Report()
	if fmt.Sprint(r.Modes) != prof.modes || r.ShmName != srv.Segment {
		t.Fatalf("workers: modes %v on %q, want %s on %s", r.Modes, r.ShmName, prof.modes, srv.Segment)
	}
	return w
}

// restartWay is one way to restart kvdock while the workers keep running.
type restartWay struct {
	name string
	do   func(t *testing.T, srv *harness.Server) time.Duration
}

func restartWays(token string) []restartWay {
	ways := []restartWay{
		{"SIGTERM and the same command line", func(t *testing.T, srv *harness.Server) time.Duration { return srv.RestartTerm(t) }},
		{"SIGUSR2", func(t *testing.T, srv *harness.Server) time.Duration { return srv.RestartSignal(t) }},
	}
	if token != "" {
		ways = append(ways, restartWay{"kvdock ctl restart", func(t *testing.T, srv *harness.Server) time.Duration {
			return srv.RestartBy(t, func() error {
				out, err := harness.Run(t, []string{"KVDOCK_HTTP_TOKEN=" + token}, "ctl", "--http-port", strconv.Itoa(srv.HTTPPort), "restart", "--yes")
				if err != nil {
					return fmt.Errorf("kvdock ctl restart: %w\n%s", err, out)
				}
				return nil
			})
		}})
	}
	return ways
}

// checkAdopted requires the last start to have adopted exactly chunks
// objects and contexts registrations, under the segment it had.
func checkAdopted(t *testing.T, srv *harness.Server, way string, chunks, contexts int) {
	t.Helper()
	rs := srv.LastRestart(t)
	if !rs.Adopted || rs.AdoptedObjects != int64(chunks) || rs.AdoptedContexts != int64(contexts) || rs.AdoptedBytes <= 0 {
		t.Fatalf("after %s: restart %+v, want %d objects and %d contexts adopted\n%s", way, rs, chunks, contexts, srv.Output())
	}
	if name := srv.ShmName(t); name != srv.Segment {
		t.Fatalf("after %s: advertises %q, want the adopted %s", way, name, srv.Segment)
	}
}

// Workers of each era (seed nongpu-v1 over SHM and pickle, engine-driven
// over SHM) store prompts; kvdock restarts by each way in turn (SIGTERM with
// --l1-keep-on-exit then the same command line, SIGUSR2, and kvdock ctl
// restart) under a named and an auto segment. Without registering again,
// after every restart each stored prompt hits in full and comes back
// identical, and new stores commit.
func TestRestartKeepsCacheForRunningWorkers(t *testing.T) {
	const prompts, token = 6, "restart-token"
	for _, prof := range restartProfiles {
		for _, auto := range []bool{false, true} {
			naming := map[bool]string{false: "named", true: "auto"}[auto]
			t.Run(prof.name+"/"+naming, func(t *testing.T) {
				flags := prof.flags
				tok := ""
				if prof.name == "nongpu-v1" && !auto {
					tok = token
					flags = append(append([]string{}, flags...), "--http-token", token)
				}
				srv := harness.StartKeeping(t, auto, flags...)
				w := startRestartWorkers(t, srv, prof, prompts, 10*time.Second)
				batch := prompts * len(prof.workers)
				w.StoreAll("before", batch)
				for i, way := range restartWays(tok) {
					gap := way.do(t, srv)
					checkAdopted(t, srv, way.name, 2*batch*(i+1), len(prof.workers))
					n := w.CheckAll(way.name)
					w.StoreAll(fmt.Sprint("after", i), batch)
					t.Logf("%s: back in %v, %d prompts identical, %d more committed; %+v", way.name, gap.Round(time.Millisecond), n, batch, srv.LastRestart(t))
				}
				w.CheckAll("the last store")
			})
		}
	}
}

// Workers store a new prompt and retrieve a stored one in turn, without
// pause (requests time out after 3 s, ten times the gap), while kvdock
// restarts (SIGTERM with --l1-keep-on-exit then the same command line, and
// SIGUSR2): no request is refused, no stored prompt misses, no byte
// differs. The target for unanswered requests is 0; the figure is logged
// with each failure, and bounded here by the one request the workers (one
// Python thread: one request at a time) have in flight at the restart.
func TestRestartUnderLoadLosesNoRequest(t *testing.T) {
	for _, prof := range restartProfiles {
		t.Run(prof.name, func(t *testing.T) {
			srv := harness.StartKeeping(t, false, prof.flags...)
			w := startRestartWorkers(t, srv, prof, 4, 3*time.Second)
			w.StoreAll("before", 4*len(prof.workers))
			for _, way := range restartWays("") {
				if r := w.Ask("loop"); !r.Looping {
					t.Fatalf("loop did not start: %+v", r)
				}
				time.Sleep(time.Second)
				gap := way.do(t, srv)
				time.Sleep(time.Second)
				r := w.Ask("stop")
				t.Logf("%s (back in %v): %d iterations in %.1fs, %d requests: %d unanswered, %d refused, %d missed, %d wrong; slowest answer %.3fs",
					way.name, gap.Round(time.Millisecond), r.Iterations, r.Seconds, r.Requests, r.Timeouts, r.Refused, r.Missed, r.Wrong, r.SlowestS)
				if r.Iterations == 0 || r.Committed == 0 {
					t.Fatalf("%s: the loop did no work: %+v", way.name, r)
				}
				if n := r.Refused + r.Missed + r.Wrong; n != 0 {
					t.Errorf("%s: %d requests refused, missed or wrong; first failures %+v", way.name, n, r.Failures)
				}
				if r.Timeouts > 1 {
					t.Errorf("%s: %d requests unanswered, more than the one in flight: %+v", way.name, r.Timeouts, r.Failures)
				} else if r.Timeouts > 0 {
					t.Logf("%s: the request in flight at the restart went unanswered (target 0): %+v", way.name, r.Failures)
				}
			}
			w.CheckAll("the loops")
		})
	}
}
