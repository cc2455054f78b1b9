package interop

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"kvdock/tests/harness"
)

// TestWorkerToolHelp: py/lmcache_worker.py is documented as a tool
// (docs/DEVELOPMENT.md): --help names every scenario and the flags a user
// picks a run with.
func TestWorkerToolHelp(t *testing.T) {
	out := harness.RunPython(t, 60*time.Second, "py/lmcache_worker.py", "--help")
	for _, want := range []string{
		"usage: lmcache_worker.py", "ENDPOINT", "SCENARIO", "JSON_PARAMS",
		"--dtype", "--world", "--chunks", "--mla", "--pickle", "--profile",
		"roundtrip", "mixed", "register", "tier_store", "tier_check",
	} {
		if !strings.Contains(strings.ToUpper(out), strings.ToUpper(want)) {
			t.Errorf("--help lacks %q:\n%s", want, out)
		}
	}
}

// TestWorkerToolFlagsRun: one short run with the documented flags (no JSON)
// against the real binary: two pickle workers of a bfloat16 MLA model on an
// SHM server store and read back their chunks.
func TestWorkerToolFlagsRun(t *testing.T) {
	srv := harness.Start(t, "--chunk-size", "16")
	out := harness.RunPython(t, 120*time.Second, "py/lmcache_worker.py", srv.Endpoint, "roundtrip",
		"--model", "tool-run", "--dtype", "bfloat16", "--mla", "--world", "2", "--chunks", "2", "--pickle")
	var res map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &res); err != nil {
		t.Fatalf("worker output %q: %v", out, err)
	}
	if modes(res) != "[pickle pickle]" || res["shm_name"] != srv.Segment {
		t.Fatalf("--pickle on an SHM server: %v (segment %s)", res, srv.Segment)
	}
}
