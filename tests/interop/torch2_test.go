//go:build torch2

package interop

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvdock/tests/harness"
)

// The torch 2.x variants: the same emulated LMCache worker, run by the
// /usr/bin/python3 of a Debian trixie root (torch 2.6) against a kvdock
// built on the host. `task test:torch2` (scripts/torch2-env.sh) sets
// KVDOCK_TORCH2_PYTHON and builds with -tags torch2; CI does not build the
// trixie root, so these tests are not compiled there.

// torch2Python returns the torch 2.x interpreter; without it the test fails.
func torch2Python(t *testing.T) string {
	t.Helper()
	py := os.Getenv("KVDOCK_TORCH2_PYTHON")
	if py == "" {
		t.Fatal("KVDOCK_TORCH2_PYTHON not set: run `task test:torch2`, which builds the torch 2.x root and sets it")
	}
	return py
}

// worker2 runs a scenario under torch 2.x and checks the worker really had it.
func worker2(t *testing.T, py string, srv *harness.Server, scenario string, params map[string]any) map[string]any {
	t.Helper()
	res := harness.LMCacheWorker(t, py, srv, scenario, params)
	if v, _ := res["torch"].(string); !strings.HasPrefix(v, "2.") {
		t.Fatalf("worker ran torch %v, want 2.x", res["torch"])
	}
	return res
}

// layoutDtypes are every dtype a registered layout may name (core/layout),
// float8 included: what a torch 2.x worker can send.
var layoutDtypes = []string{"float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2",
	"int8", "uint8", "int16", "int32", "int64", "bool"}

func TestTorch2SHMRoundTrip(t *testing.T) {
	py := torch2Python(t)
	srv := harness.Start(t, "--chunk-size", "16")
	for _, tc := range []struct {
		dtype string
		mla   bool
		world int
	}{
		{"bfloat16", false, 1},
		{"float8_e4m3fn", false, 1},
		{"float8_e5m2", true, 1},
		{"float16", false, 2},
		{"float32", true, 2},
	} {
		t.Run(fmt.Sprintf("%s_mla=%v_world=%d", tc.dtype, tc.mla, tc.world), func(t *testing.T) {
			res := worker2(t, py, srv, "roundtrip", map[string]any{
				"model": fmt.Sprintf("t2-%s-%v-%d", tc.dtype, tc.mla, tc.world), "dtype": tc.dtype, "mla": tc.mla,
				"world": tc.world, "layers": 2, "hidden": 32, "chunks": 3,
			})
			want := strings.TrimSpace(strings.Repeat("shm ", tc.world))
			if modes(res) != "["+want+"]" || res["shm_name"] != srv.Segment {
				t.Fatalf("torch 2 worker modes %v on %v, want all shm on %s", res["modes"], res["shm_name"], srv.Segment)
			}
		})
	}
}

// TestTorch2PickleRoundTrip: torch 2.x workers pickle every layout dtype
// (float8 in the _rebuild_tensor_v3 form), kvdock decodes and stores them and
// its pickled replies load in torch 2.x with identical bytes.
func TestTorch2PickleRoundTrip(t *testing.T) {
	py := torch2Python(t)
	srv := harness.Start(t, "--chunk-size", "16", "--shm-name", "")
	for _, dtype := range layoutDtypes {
		t.Run(dtype, func(t *testing.T) {
			res := worker2(t, py, srv, "roundtrip", map[string]any{
				"model": "t2pk-" + dtype, "dtype": dtype, "layers": 2, "hidden": 16, "chunks": 2, "world": 2,
			})
			if modes(res) != "[pickle pickle]" || res["shm_name"] != "" {
				t.Fatalf("torch 2 workers with --shm-name \"\": %v", res)
			}
		})
	}
	t.Run("mla_float8", func(t *testing.T) {
		res := worker2(t, py, srv, "roundtrip", map[string]any{
			"model": "t2pk-mla", "dtype": "float8_e4m3fn", "mla": true, "layers": 3, "hidden": 24, "chunks": 3,
		})
		if modes(res) != "[pickle]" {
			t.Fatalf("modes %v", res["modes"])
		}
	})
}

// TestTorch2MixedSHMAndPickle: a torch 2.x SHM worker and a torch 2.x pickle
// worker read each other's float8 chunks.
func TestTorch2MixedSHMAndPickle(t *testing.T) {
	py := torch2Python(t)
	srv := harness.Start(t, "--chunk-size", "16")
	for _, dtype := range []string{"bfloat16", "float8_e5m2"} {
		res := worker2(t, py, srv, "mixed", map[string]any{"model": "t2mixed-" + dtype, "dtype": dtype, "layers": 2, "hidden": 16})
		if modes(res) != "[pickle shm]" {
			t.Fatalf("%s: modes %v", dtype, res["modes"])
		}
	}
}

// TestTorch2MaliciousPicklesRejected: the torch 1.13 payloads pickled by
// torch 2.x, then payloads in the forms torch 2.x adds (_rebuild_from_type_v2,
// a call where _rebuild_tensor_v3's dtype goes, _rebuild_parameter, a
// container whose saved object is a call), each shown to run code under torch
// 2.x first: kvdock refuses all, runs nothing, stores nothing, keeps serving.
func TestTorch2MaliciousPicklesRejected(t *testing.T) {
	py := torch2Python(t)
	srv := harness.Start(t, "--chunk-size", "16", "--shm-name", "")
	dir := t.TempDir()
	marker := filepath.Join(dir, "pwned")
	worker2(t, py, srv, "malicious", map[string]any{"model": "t2evil", "marker": marker})
	res := worker2(t, py, srv, "malicious_torch2", map[string]any{"model": "t2evil2", "marker": marker, "live_dir": dir})
	if live, _ := res["live"].([]any); len(live) != 5 {
		t.Fatalf("worker proved %d payloads live, want 5: %v", len(live), res)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a malicious torch 2 pickle ran code in kvdock")
	}
	if out := srv.Output(); !strings.Contains(out, "global posix.system not allowed") {
		t.Fatalf("the rejection does not name the global:\n%s", out)
	}
}
