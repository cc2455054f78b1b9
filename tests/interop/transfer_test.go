// Package interop drives the real kvdock binary through the real wire with
// the libraries LMCache workers use (pyzmq, msgpack, torch under
// /usr/bin/python3): frames, profiles, bad input, SHM and pickle transfers.
package interop

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvdock/tests/harness"
)

// worker runs one scenario of py/lmcache_worker.py (an emulated LMCache
// non-GPU worker: pyzmq, msgpack, torch) against srv and decodes its JSON.
func worker(t *testing.T, srv *harness.Server, scenario string, params map[string]any) map[string]any {
	t.Helper()
	return workerWith(t, harness.Python, srv, scenario, params)
}

// workerWith is worker under another interpreter.
func workerWith(t *testing.T, python string, srv *harness.Server, scenario string, params map[string]any) map[string]any {
	t.Helper()
	p, err := json.Marshal(params)
	if err != nil {
		t.Fatal(err)
	}
	out := harness.RunPythonWith(t, python, 120*time.Second, "py/lmcache_worker.py", srv.Endpoint, scenario, string(p))
	var res map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &res); err != nil {
		t.Fatalf("worker output %q: %v", out, err)
	}
	return res
}

func modes(res map[string]any) string {
	return fmt.Sprint(res["modes"])
}

func TestSHMRoundTripDtypesAndLayouts(t *testing.T) {
	srv := harness.Start(t, "--chunk-size", "16")
	for _, tc := range []struct {
		dtype string
		mla   bool
		world int
	}{
		{"float16", false, 1},
		{"bfloat16", false, 1},
		{"float32", false, 1},
		{"bfloat16", true, 1},
		{"float16", false, 2},
		{"float32", true, 2},
	} {
		t.Run(fmt.Sprintf("%s_mla=%v_world=%d", tc.dtype, tc.mla, tc.world), func(t *testing.T) {
			res := worker(t, srv, "roundtrip", map[string]any{
				"model": fmt.Sprintf("m-%s-%v-%d", tc.dtype, tc.mla, tc.world), "dtype": tc.dtype, "mla": tc.mla,
				"world": tc.world, "layers": 2, "hidden": 32, "chunks": 3,
			})
			want := strings.TrimSpace(strings.Repeat("shm ", tc.world))
			if modes(res) != "["+want+"]" {
				t.Fatalf("worker modes %v, want all shm", res["modes"])
			}
			if res["shm_name"] != srv.Segment {
				t.Fatalf("advertised %v, want %s", res["shm_name"], srv.Segment)
			}
			if _, err := os.Stat(filepath.Join("/dev/shm", srv.Segment)); err != nil {
				t.Fatalf("segment gone after the worker exited: %v", err)
			}
		})
	}
}

func TestPickleRoundTripWithSHMOff(t *testing.T) {
	srv := harness.Start(t, "--chunk-size", "16", "--shm-name", "")
	for _, dtype := range []string{"float16", "bfloat16", "float32"} {
		t.Run(dtype, func(t *testing.T) {
			res := worker(t, srv, "roundtrip", map[string]any{
				"model": "pk-" + dtype, "dtype": dtype, "layers": 2, "hidden": 16, "chunks": 2, "world": 2,
			})
			if modes(res) != "[pickle pickle]" || res["shm_name"] != "" || res["pool_size"] != float64(0) {
				t.Fatalf("with --shm-name \"\": %v", res)
			}
		})
	}
}

func TestMixedSHMAndPickleWorkersShareChunks(t *testing.T) {
	srv := harness.Start(t, "--chunk-size", "16")
	res := worker(t, srv, "mixed", map[string]any{"model": "mixed", "dtype": "bfloat16", "layers": 2, "hidden": 16})
	if modes(res) != "[pickle shm]" {
		t.Fatalf("modes %v", res["modes"])
	}
	// kvdock noticed the pickle worker's fallback and says so.
	if !strings.Contains(srv.Output(), "fell back") {
		t.Fatalf("no fallback in the log:\n%s", srv.Output())
	}
}

func TestMaliciousPicklesRejected(t *testing.T) {
	srv := harness.Start(t, "--chunk-size", "16", "--shm-name", "")
	marker := filepath.Join(t.TempDir(), "pwned")
	worker(t, srv, "malicious", map[string]any{"model": "evil", "marker": marker})
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a malicious pickle ran code in kvdock")
	}
	// os.system pickles as posix.system.
	if !strings.Contains(srv.Output(), "global posix.system not allowed") {
		t.Fatalf("the rejection does not name the global:\n%s", srv.Output())
	}
}
