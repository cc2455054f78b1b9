package ctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"kvdock/core/engine"
	"kvdock/core/misses"
	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/core/rpc/client"
	"kvdock/core/testkit/profiles"
	"kvdock/core/tierstate"
	"kvdock/settings"
	"kvdock/ui/ctl"
	"kvdock/ui/httpapi"
)

func statusFreePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	return port
}

// statusServe starts a real engine with --shm-name "" and its HTTP API,
// registers one worker over the wire, and returns the HTTP port.
func statusServe(t *testing.T) int {
	t.Helper()
	empty := ""
	cfg := settings.Default()
	cfg.Server.Host = "127.0.0.1"
	cfg.Server.Port = statusFreePort(t)
	cfg.Server.ChunkSize = 16
	cfg.Server.ShmName = &empty
	cfg.L1.SizeGB = 0.01
	cfg.L1.Prefault = false
	src := map[string]settings.Source{"server.shm_name": {Kind: settings.SourceFlag, Detail: "--shm-name"}}
	eng := engine.New(cfg, engine.Options{Sources: src, Version: "test"})
	ctx, cancel := context.WithCancel(context.Background())
	if err := eng.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	ln, err := httpapi.Listen("127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- httpapi.New(eng, httpapi.Options{}).Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-served
		stop, done := context.WithTimeout(context.Background(), 10*time.Second)
		defer done()
		_ = eng.Stop(stop)
	})

	prof := profiles.Load(t, cfg.Server.Protocol)
	cli, err := client.Dial(fmt.Sprintf("tcp://127.0.0.1:%d", cfg.Server.Port), prof, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Call(context.Background(), protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{
		InstanceID: 42, ModelName: "llama-tiny", WorldSize: 2, BlockSize: 16, NumLayers: 3, HiddenDimSize: 8, DtypeStr: "bfloat16",
	}); err != nil {
		t.Fatal(err)
	}
	return ln.Addr().(*net.TCPAddr).Port
}

func runStatus(args ...string) (int, string, string) {
	return runStatusEnv(nil, args...)
}

func runStatusEnv(environ []string, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := ctl.Status(args, ctl.Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Environ: environ})
	return code, out.String(), errb.String()
}

func TestStatusTable(t *testing.T) {
	port := strconv.Itoa(statusServe(t))
	code, out, errs := runStatus("--http-host", "127.0.0.1", "--http-port", port)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{
		"state", "serving", "endpoint", "tcp://127.0.0.1:", "nongpu-v1",
		`SHM       off, pickle for every worker: --shm-name "" given`,
		"pool", "private segment kvdock_private_pool_",
		"1 worker context(s)",
		"INSTANCE", "MODE", "REASON",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	var row string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "42 ") {
			row = l
		}
	}
	f := strings.Fields(row)
	if len(f) < 11 || f[1] != "llama-tiny" || f[2] != "2" || f[3] != "2x3x16x8" || f[4] != "bfloat16" || f[5] != "PICKLE" || f[6] != "active" || f[8] != "0" {
		t.Errorf("context row = %q", row)
	}
}

func TestStatusJSONAndErrors(t *testing.T) {
	port := strconv.Itoa(statusServe(t))
	code, out, _ := runStatus("--json", "--http-port="+port, "--http-host=0.0.0.0")
	var raw map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &raw) != nil {
		t.Fatalf("--json: exit %d, %q", code, out)
	}
	if ctxs, _ := raw["contexts"].([]any); len(ctxs) != 1 || raw["shm_name"] != "" {
		t.Errorf("--json document = %v", raw)
	}

	dead := strconv.Itoa(statusFreePort(t))
	code, out, errs := runStatus("--http-port", dead, "--timeout", "2s")
	if code != 1 || out != "" || !strings.Contains(errs, "HTTP API does not answer") || !strings.Contains(errs, dead) {
		t.Errorf("unreachable API: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if code, _, errs := runStatus("--http-port", "0"); code != 2 || !strings.Contains(errs, "off") {
		t.Errorf("port 0: exit %d, %q", code, errs)
	}
	if code, _, _ := runStatus("--bogus"); code != 2 {
		t.Errorf("unknown flag: exit %d", code)
	}
	if code, _, _ := runStatus("extra"); code != 2 {
		t.Errorf("extra argument: exit %d", code)
	}
}

func TestStatusEnvDefaults(t *testing.T) {
	port := strconv.Itoa(statusServe(t))
	if code, out, errs := runStatusEnv([]string{"KVDOCK_HTTP_HOST=127.0.0.1", "KVDOCK_HTTP_PORT=" + port}); code != 0 || !strings.Contains(out, "llama-tiny") {
		t.Errorf("env defaults: exit %d, %q %q", code, out, errs)
	}
	if code, _, errs := runStatusEnv([]string{"KVDOCK_HTTP_PORT=eighty"}); code != 2 || !strings.Contains(errs, "KVDOCK_HTTP_PORT") {
		t.Errorf("bad env port: exit %d, %q", code, errs)
	}
}

func TestStatusTiers(t *testing.T) {
	snap := engine.Snapshot{State: engine.Serving, Tiers: []tierstate.Tier{
		{Index: 0, Type: "fs", Target: "/data/l2", State: tierstate.Up, UsedBytes: 1 << 30, CapacityBytes: 10 << 30, Hits: 7, Misses: 3, Corrupt: 1, DroppedWrites: 2},
		{Index: 1, Type: "resp", Target: "redis://redis:6379", State: tierstate.Down, Reason: "connection \x1b[2Jrefused"},
	}}
	var mu sync.Mutex
	port := serveSnapshot(t, &mu, &snap)
	out := runStatusOK(t, port)
	for _, want := range []string{
		"tier 0    fs /data/l2: UP, 1.0 GiB of 10.0 GiB used, 7 hits, 3 misses, 1 corrupt rejected, 2 writes dropped",
		"tier 1    resp redis://redis:6379: DOWN (connection refused), 0 B used",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	mu.Lock()
	snap.Tiers = nil
	mu.Unlock()
	if _, out, _ = runStatus("--http-host", "127.0.0.1", "--http-port", port); !strings.Contains(out, "none (L1 only; --l2-adapter adds one)") {
		t.Errorf("no tiers:\n%s", out)
	}
}

// TestStatusTokensMissesAndDetections: the table says how many prefill
// tokens the cache saved, why lookups missed (largest reason first), and
// under --protocol auto which tables the peers were settled on.
func TestStatusTokensMissesAndDetections(t *testing.T) {
	snap := engine.Snapshot{State: engine.Serving, Protocol: settings.ProtocolAuto,
		Requests: rpc.Stats{Profile: "rpc-messages", Detections: map[string]int64{"rpc-messages": 2, "nongpu-v1": 1},
			AmbiguousDetections: 1},
		Rates: engine.Rates{Server: engine.ServerRates{TokensSavedTotal: 48_500_000, TokensSavedHour: 12_345}},
		Misses: misses.Report{Total: misses.Counts{misses.NeverStored: 1200, misses.Evicted: 340, misses.OtherLayout: 64},
			TierMissed: 5},
	}
	var mu sync.Mutex
	port := serveSnapshot(t, &mu, &snap)
	out := runStatusOK(t, port)
	for _, want := range []string{
		"protocol  auto (default rpc-messages; peers: nongpu-v1 1, rpc-messages 2 (1 by the tie-break)), chunk",
		"saved     12.3 k prefill tokens not recomputed in the last hour, 48.5 M since the start",
		"misses    1604 chunks: 1200 never stored, 340 evicted, 64 other layout (5 missed the L2 tiers too)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	mu.Lock()
	snap = engine.Snapshot{State: engine.Serving, Protocol: "nongpu-v1"}
	mu.Unlock()
	_, out, _ = runStatus("--http-host", "127.0.0.1", "--http-port", port)
	for _, want := range []string{"protocol  nongpu-v1, chunk", "misses    none", "saved     0 prefill tokens not recomputed in the last hour, 0 since the start"} {
		if !strings.Contains(out, want) {
			t.Errorf("idle output lacks %q:\n%s", want, out)
		}
	}
}

// serveSnapshot serves the /status of *snap, read under mu so that a test
// can change it between requests, and returns the server's port.
func serveSnapshot(t *testing.T, mu *sync.Mutex, snap *engine.Snapshot) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		_ = json.NewEncoder(w).Encode(httpapi.NewStatus(*snap))
	}))
	t.Cleanup(srv.Close)
	return strconv.Itoa(srv.Listener.Addr().(*net.TCPAddr).Port)
}

// runStatusOK runs `kvdock status` against port, fails t unless it exits 0,
// and returns its output.
func runStatusOK(t *testing.T, port string) string {
	t.Helper()
	code, out, errs := runStatus("--http-host", "127.0.0.1", "--http-port", port)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	return out
}
