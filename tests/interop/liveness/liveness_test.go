// Package liveness drives real Python workers (py/liveness_worker.py) that
// die, go idle or reuse an instance id while kvdock serves: a SIGKILLed
// worker is reaped and its reservation freed, an idle seed worker is removed
// by kvdock ctl, and a reused id never sees the old worker's pending data.
// docs/LIVENESS.md gives the settings and figures.
package liveness

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"kvdock/core/testkit/promseries"
	"kvdock/tests/harness"
	"kvdock/ui/httpapi"
)

// startLiveWorker runs py/liveness_worker.py in role with params.
func startLiveWorker(t *testing.T, srv *harness.Server, role string, params map[string]any) *harness.PyWorker {
	t.Helper()
	p, err := json.Marshal(params)
	if err != nil {
		t.Fatal(err)
	}
	return harness.StartPyWorker(t, "../py/liveness_worker.py", srv.Endpoint, role, string(p))
}

// waitStatus polls /status until cond holds (60 s at most).
func waitStatus(t *testing.T, srv *harness.Server, what string, cond func(httpapi.Status) bool) httpapi.Status {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st := srv.Status(t)
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 60 s; last status contexts %+v transfer %+v pool used %d", what, st.Contexts, st.Transfer, st.Pool.UsedBytes)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A worker of the engine-driven profile (PING carries its id) is SIGKILLed
// while it holds a reservation it wrote into: the reaper drops it, the
// reservation is never published and keeps its bytes until its write TTL
// (a dropped worker may still be copying), then the pool returns to its
// baseline, and a later request naming it is answered as an unregistered
// instance's.
func TestLivenessKilledWorkerIsReaped(t *testing.T) {
	srv := harness.Start(t, "--protocol", "engine-driven", "--l1-write-ttl-seconds", "6",
		"--worker-reap-timeout-seconds", "1", "--worker-registration-grace-seconds", "1")
	params := map[string]any{"profile": "engine-driven", "instance_id": 5151}
	w := startLiveWorker(t, srv, "hold", params)
	if r := w.Next(); r["ready"] != true {
		t.Fatalf("worker: %v", r)
	}
	st := srv.Status(t)
	if wl := st.WorkerLiveness; !wl.Enabled || wl.ReapTimeoutSeconds != 1 || wl.TrackedInstances != 1 {
		t.Fatalf("worker_liveness %+v", wl)
	}
	c, ok := harness.ContextStatus(st, 5151)
	if !ok || c.State != "active" || c.Peer == "" || st.Transfer.PendingWrites != 1 || st.Pool.WriteLocked != 1 {
		t.Fatalf("before the kill: context %+v, transfer %+v, write-locked %d", c, st.Transfer, st.Pool.WriteLocked)
	}
	baseline := st.Pool.UsedBytes - c.ChunkBytes // the stored chunk stays; the reservation must go
	killed := time.Now()
	w.Kill()

	st = waitStatus(t, srv, "reaped", func(s httpapi.Status) bool {
		c, ok := harness.ContextStatus(s, 5151)
		return ok && c.State == "reaped"
	})
	// Reported, not asserted: timeout 1 s, scans every 250 ms.
	t.Logf("reaped %s after SIGKILL (reap timeout 1 s); pool used %d bytes = baseline", time.Since(killed).Round(10*time.Millisecond), st.Pool.UsedBytes)
	if st.Transfer.PendingWrites != 0 || st.Transfer.Reaped != 1 || st.Pool.Objects != 1 {
		t.Fatalf("after the reap: transfer %+v, objects %d", st.Transfer, st.Pool.Objects)
	}
	st = waitStatus(t, srv, "the reaped reservation's write TTL", func(s httpapi.Status) bool {
		return s.Pool.WriteLocked == 0 && s.Pool.UsedBytes == baseline
	})
	if st.Pool.Objects != 1 {
		t.Fatalf("after the write TTL: objects %d", st.Pool.Objects)
	}
	if len(st.RegisteredNonCudaInstanceIDs) != 0 {
		t.Fatalf("reaped instance still registered: %v", st.RegisteredNonCudaInstanceIDs)
	}
	if v := promseries.Value(t, promseries.Scrape(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", srv.HTTPPort)), "kvdock_workers_reaped_total"); v != 1 {
		t.Fatalf("kvdock_workers_reaped_total = %v", v)
	}
	if !strings.Contains(srv.Output(), "reaped") {
		t.Fatal("no reap in the log")
	}
	// The reaped id and an id nobody registered get the same answer.
	probe := func(id int) string {
		out := harness.RunPython(t, 60*time.Second, "../py/liveness_worker.py", srv.Endpoint, "probe",
			fmt.Sprintf(`{"profile": "engine-driven", "instance_id": %d, "chunk": 256}`, id))
		var m map[string]any
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(m["answer"])
	}
	// Both get PREPARE_STORE's failure reply at once: no slots.
	if reaped, never := probe(5151), probe(999); reaped != never || reaped != "{'context': {}}" {
		t.Fatalf("reaped instance answered %q, unregistered %q", reaped, never)
	}
}

// A seed-era (nongpu-v1) worker that sits idle holding a reservation is
// never reaped, whatever the reap settings: its PING cannot name it. It is
// shown idle, then removed by `kvdock ctl unregister`, which abandons its
// reservation; it then registers again and works.
func TestLivenessSeedIdleWorkerRemovedByCtl(t *testing.T) {
	srv := harness.Start(t, "--worker-idle-seconds", "1", "--l1-write-ttl-seconds", "12",
		"--worker-reap-timeout-seconds", "1", "--worker-registration-grace-seconds", "1")
	w := startLiveWorker(t, srv, "hold", map[string]any{"instance_id": 6161})
	if r := w.Next(); r["ready"] != true {
		t.Fatalf("worker: %v", r)
	}
	// Idle, and still registered well past reap timeout + scan interval.
	st := waitStatus(t, srv, "idle for 3 s", func(s httpapi.Status) bool {
		c, ok := harness.ContextStatus(s, 6161)
		return ok && c.State == "idle" && c.LastSeenSeconds >= 3
	})
	if len(st.RegisteredNonCudaInstanceIDs) != 1 || st.Transfer.PendingWrites != 1 || st.Transfer.Reaped != 0 {
		t.Fatalf("idle seed worker: ids %v transfer %+v", st.RegisteredNonCudaInstanceIDs, st.Transfer)
	}
	used := st.Pool.UsedBytes

	cmd := exec.Command(harness.Binary(t), "ctl", "--port", fmt.Sprint(srv.Port), "--http-port", fmt.Sprint(srv.HTTPPort),
		"unregister", "6161", "--yes")
	cmd.Env = append(os.Environ(), "KVDOCK_CONFIG=")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "instance 6161 removed") {
		t.Fatalf("kvdock ctl unregister: %v\n%s", err, out)
	}
	st = srv.Status(t)
	c, _ := harness.ContextStatus(st, 6161)
	chunk := c.ChunkBytes
	if c.State != "removed" || st.Transfer.PendingWrites != 0 || st.Transfer.Removed != 1 {
		t.Fatalf("after ctl unregister: context %+v transfer %+v", c, st.Transfer)
	}
	// The removed worker may still be copying: its slot goes back at the
	// write TTL, not before.
	waitStatus(t, srv, "the removed reservation's write TTL", func(s httpapi.Status) bool {
		return s.Pool.UsedBytes == used-chunk
	})
	// Unknown ids: a clear refusal, nothing changes.
	cmd = exec.Command(harness.Binary(t), "ctl", "--port", fmt.Sprint(srv.Port), "--http-port", fmt.Sprint(srv.HTTPPort),
		"unregister", "6161", "--yes")
	cmd.Env = append(os.Environ(), "KVDOCK_CONFIG=")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "not registered") {
		t.Fatalf("second unregister: %v\n%s", err, out)
	}

	w.Send("again")
	r := w.Next()
	if r["answered_while_removed"] != "{'context': {}}" || r["store_after_register"] != true {
		t.Fatalf("worker after removal: %v", r)
	}
	if st := srv.Status(t); len(st.RegisteredNonCudaInstanceIDs) != 1 {
		t.Fatalf("re-registration: %v", st.RegisteredNonCudaInstanceIDs)
	}
}

// An instance id registered again from a new ZMQ peer while the old worker
// holds a reservation it wrote into: the new worker never sees that data
// (lookup and retrieve miss; its commit of that key publishes nothing).
func TestLivenessReusedIDNeverSeesOldPendingData(t *testing.T) {
	for _, profile := range []string{"nongpu-v1", "engine-driven"} {
		t.Run(profile, func(t *testing.T) {
			srv := harness.Start(t, "--protocol", profile)
			params := map[string]any{"profile": profile, "instance_id": 7171}
			old := startLiveWorker(t, srv, "hold", params)
			if r := old.Next(); r["ready"] != true {
				t.Fatalf("old worker: %v", r)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			p, _ := json.Marshal(params)
			out, err := exec.CommandContext(ctx, harness.Python, "../py/liveness_worker.py", srv.Endpoint, "reuse", string(p)).Output()
			if err != nil {
				t.Fatalf("reuse worker: %v\n%s", err, out)
			}
			var r map[string]any
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatalf("reuse worker said %q: %v", out, err)
			}
			if r["lookup_hits"] != 0.0 || r["retrieved"] != false || r["commit"] != false || r["lookup_hits_after_commit"] != 0.0 {
				t.Fatalf("the new worker saw the old one's pending data: %v", r)
			}
			st := srv.Status(t)
			// The old worker's reservation is abandoned: never published,
			// its bytes kept (doomed) until its write TTL.
			if st.Transfer.Reused != 1 || st.Transfer.PendingWrites != 0 || st.Pool.WriteLocked != st.Pool.DoomedObjects {
				t.Fatalf("after reuse: transfer %+v write-locked %d, doomed %d", st.Transfer, st.Pool.WriteLocked, st.Pool.DoomedObjects)
			}
			log := srv.Output()
			if !strings.Contains(log, "taken as a new worker") {
				t.Fatalf("reuse not logged:\n%s", log)
			}
		})
	}
}
