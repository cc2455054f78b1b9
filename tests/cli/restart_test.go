package cli

import (
	"bytes"
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"kvdock/core/rpc/client"
	"kvdock/tests/harness"
	"kvdock/transfer/worker"
)

// `kvdock ctl restart` asks the server (POST /restart, token) to restart in
// place keeping its pool: the same pid runs the binary again, adopts the
// pool and the registration, and the worker, without registering again and
// on the same connection, reads the bytes it stored. Without the token it
// is refused (exit 1, nothing restarted); without a terminal it needs --yes.
func TestCtlRestartKeepsTheCache(t *testing.T) {
	const token = "restart-token"
	state := filepath.Join(t.TempDir(), "state")
	srv := harness.Start(t, "--http-token", token, "--state-dir", state)
	pid := srv.PID()
	ctx := context.Background()
	c, err := client.Dial(srv.Endpoint, harness.Profile(t, srv.Protocol), client.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w, err := worker.Register(ctx, c, worker.Config{InstanceID: 41, Model: "restart-model", Layers: 2, Hidden: 16, Dtype: "float32"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	n := w.Layout().Bytes
	toks := make([]uint32, 2*w.ChunkTokens())
	for i := range toks {
		toks[i] = uint32(i * 7)
	}
	chunk := func(j int) []byte { return bytes.Repeat([]byte{byte(j + 1)}, int(n)) }
	if res, err := w.Store(ctx, w.Key(toks, 2, "s"), [][]byte{chunk(0), chunk(1)}); err != nil || !res.Committed {
		t.Fatalf("store: %+v %v", res, err)
	}

	port := "--http-port=" + strconv.Itoa(srv.HTTPPort)
	if code, _, stderr := kvdock(t, []string{"KVDOCK_HTTP_TOKEN=" + token}, "ctl", port, "restart"); code != 2 || !strings.Contains(stderr, "--yes") {
		t.Fatalf("without a terminal or --yes: exit %d, %q", code, stderr)
	}
	if code, _, stderr := kvdock(t, nil, "ctl", port, "--yes", "restart"); code != 1 || !strings.Contains(stderr, "KVDOCK_HTTP_TOKEN") {
		t.Fatalf("without the token: exit %d, %q", code, stderr)
	}
	code, out, stderr := kvdock(t, []string{"KVDOCK_HTTP_TOKEN=" + token}, "ctl", port, "--yes", "restart")
	if code != 0 || !strings.Contains(out, "restarted: adopted 2 objects") || !strings.Contains(out, "1 contexts") {
		t.Fatalf("restart: exit %d\nout %q\nstderr %q\nserver:\n%s", code, out, stderr, srv.Output())
	}
	if srv.PID() != pid {
		t.Fatalf("pid changed: %d -> %d", pid, srv.PID())
	}
	sched := worker.Scheduler{C: c}
	hits, err := sched.Hits(ctx, w.LookupKey(toks, "r"), 1)
	if err != nil || hits != 2 {
		t.Fatalf("after restart: %d hits (%v)\n%s", hits, err, srv.Output())
	}
	wrong := 0
	got, err := w.Retrieve(ctx, w.Key(toks, hits, "r"), func(j int, b []byte) {
		if !bytes.Equal(b, chunk(j)) {
			wrong++
		}
	})
	if err != nil || got != 2 || wrong != 0 {
		t.Fatalf("retrieve after restart: %d chunks, %d wrong, %v", got, wrong, err)
	}
	if !strings.Contains(srv.Output(), "restarting in place") {
		t.Fatalf("no restart line in the log:\n%s", srv.Output())
	}
}
