package interop

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"kvdock/tests/harness"
)

type protoResult struct {
	Profile string  `json:"profile"`
	Steps   [][]any `json:"steps"`
	Error   string  `json:"error"`
}

func runProtoWorker(t *testing.T, endpoint string, params map[string]any) protoResult {
	t.Helper()
	b, err := json.Marshal(params)
	if err != nil {
		t.Fatal(err)
	}
	out := harness.RunPython(t, 60*time.Second, "py/proto_worker.py", endpoint, string(b))
	var res protoResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &res); err != nil {
		t.Fatalf("proto_worker output %q: %v", out, err)
	}
	return res
}

// TestProtocolAutoOneWorkerPerTable: one server with --protocol auto, and a
// real pyzmq/msgpack/torch worker of every table (nongpu-v1, nongpu-v2,
// engine-driven, engine-driven-v2, rpc-messages) registering, storing through SHM, retrieving
// identical bytes, clearing (CLEAR [force] where the table has it) so a
// lookup then misses, asking the chunk size and unregistering. Each peer is
// settled on its own table, logged with the evidence.
func TestProtocolAutoOneWorkerPerTable(t *testing.T) {
	srv := harness.Start(t, "--protocol", "auto", "--chunk-size", "16")
	tables := []string{"nongpu-v1", "nongpu-v2", "engine-driven", "engine-driven-v2", "rpc-messages"}
	for i, table := range tables {
		res := runProtoWorker(t, srv.Endpoint, map[string]any{"profile": table, "model": "auto-m",
			"dtype": "bfloat16", "layers": 2, "hidden": 32, "mla": false, "world": 1, "chunk": 16,
			"instance_id": 100 + i, "seed": 7 + i})
		if res.Error != "" || len(res.Steps) != 6 || res.Steps[0][1] != "shm" {
			t.Errorf("%s worker: %+v", table, res)
		}
	}
	out := srv.Output()
	for _, table := range tables {
		if !strings.Contains(out, "protocol auto: peer's table detected") ||
			!strings.Contains(out, fmt.Sprintf("profile=%s evidence=", table)) {
			t.Errorf("no detection of %s in the server log:\n%s", table, out)
		}
	}
}

// TestProtocolExplicitProfiles: each table still works with its explicit
// --protocol, the newest one included.
func TestProtocolExplicitProfiles(t *testing.T) {
	for _, table := range []string{"engine-driven", "engine-driven-v2", "rpc-messages"} {
		t.Run(table, func(t *testing.T) {
			srv := harness.Start(t, "--protocol", table, "--chunk-size", "16")
			res := runProtoWorker(t, srv.Endpoint, map[string]any{"profile": table, "model": "x-" + table,
				"dtype": "float16", "layers": 2, "hidden": 16, "mla": false, "world": 1, "chunk": 16,
				"instance_id": 1, "seed": 3})
			if res.Error != "" || len(res.Steps) != 6 {
				t.Errorf("%s worker: %+v", table, res)
			}
		})
	}
}
