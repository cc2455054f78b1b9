package restart

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvdock/tests/harness"
	goworker "kvdock/transfer/worker"
)

// pickleRestartProfile is the seed's pickle mode (--shm-name ""): nothing
// is advertised, so both seed-era workers pickle, one of them because it
// was told to (as a worker that failed to attach does).
var pickleRestartProfile = restartProfile{name: "nongpu-v1", flags: []string{"--chunk-size", "16"},
	workers: []map[string]any{{"instance_id": 7201}, {"instance_id": 7202, "pickle": true}}, modes: "[pickle pickle]"}

// registerAdvertises registers one more worker (another model, so no
// layout meets the running workers'), returns what REGISTER advertised,
// and unregisters it.
func registerAdvertises(t *testing.T, srv *harness.Server, id int64) (string, int64) {
	t.Helper()
	ctx := context.Background()
	w, err := goworker.Register(ctx, srv.Dial(t, "nongpu-v1"), goworker.Config{InstanceID: id, Model: "probe-model", Layers: 2, Hidden: 16, Dtype: "float32"})
	if err != nil {
		t.Fatalf("REGISTER: %v\n%s", err, srv.Output())
	}
	defer w.Close()
	if err := w.Unregister(ctx); err != nil {
		t.Fatalf("UNREGISTER: %v", err)
	}
	return w.ShmName(), w.PoolSize()
}

// With --shm-name "" and --l1-keep-on-exit, seed-era pickle workers store
// prompts; kvdock restarts by each way in turn (SIGTERM then the same
// command line, SIGUSR2, kvdock ctl restart). The pool lives in the
// endpoint's private segment, which is kept and adopted: after every
// restart /status says adopted, each stored prompt hits in full with
// identical bytes, without registering again, new stores commit, and
// REGISTER still answers {"", 0}: the private segment is never advertised.
func TestRestartKeepsPickleModePool(t *testing.T) {
	const prompts, token = 6, "pickle-restart-token"
	prof := pickleRestartProfile
	srv := harness.StartKeepingPickle(t, append(append([]string{}, prof.flags...), "--http-token", token)...)
	if !strings.HasPrefix(srv.Private, "kvdock_private_pool_") {
		t.Fatalf("pickle-mode pool is not in a private segment (/status pool.private_segment %q)\n%s", srv.Private, srv.Output())
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", srv.Private)); err != nil {
		t.Fatalf("private segment: %v", err)
	}
	w := startRestartWorkers(t, srv, prof, prompts, 10*time.Second)
	batch := prompts * len(prof.workers)
	w.StoreAll("before", batch)
	for i, way := range restartWays(token) {
		gap := way.do(t, srv)
		checkAdopted(t, srv, way.name, 2*batch*(i+1), len(prof.workers))
		if private, reason := srv.PoolStatus(t); private != srv.Private || !strings.Contains(reason, "adopted") {
			t.Fatalf("after %s: pool in %q (%s), want the adopted %s", way.name, private, reason, srv.Private)
		}
		if name, size := registerAdvertises(t, srv, int64(7290+i)); name != "" || size != 0 {
			t.Fatalf("after %s: REGISTER advertised {%q, %d}, want {\"\", 0}", way.name, name, size)
		}
		n := w.CheckAll(way.name)
		w.StoreAll(fmt.Sprint("after", i), batch)
		t.Logf("%s: back in %v, %d prompts identical, %d more committed; %+v", way.name, gap.Round(time.Millisecond), n, batch, srv.LastRestart(t))
	}
	w.CheckAll("the last store")
}
