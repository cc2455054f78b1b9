package interop

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"kvdock/core/testkit/httpjson"
	"kvdock/tests/harness"
)

// hybrid runs one scenario of py/hybrid_worker.py (an emulated LMCache
// engine-driven worker of a hybrid-attention model) against srv.
func hybrid(t *testing.T, srv *harness.Server, scenario string, params map[string]any) map[string]any {
	t.Helper()
	p, err := json.Marshal(params)
	if err != nil {
		t.Fatal(err)
	}
	out := harness.RunPythonWith(t, harness.Python, 120*time.Second, "py/hybrid_worker.py", srv.Endpoint, scenario, string(p))
	var res map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &res); err != nil {
		t.Fatalf("worker output %q: %v", out, err)
	}
	return res
}

// twoGroups is a hybrid model whose groups differ in every figure: an
// attention-like group (float16, 2 layers, hidden 16, 4-token blocks) and a
// state-like group (float32, 1 layer, hidden 48, 8-token blocks).
func twoGroups() []map[string]any {
	return []map[string]any{
		{"block_size": 4, "num_layers": 2, "hidden_dim_size": 16, "dtype_str": "float16", "use_mla": false, "tokens_per_block": 4},
		{"block_size": 8, "num_layers": 1, "hidden_dim_size": 48, "dtype_str": "float32", "use_mla": false, "tokens_per_block": 8},
	}
}

// TestHybridGroupsRoundTrip: a two-group model stores and retrieves over
// the engine-driven wire with identical bytes (torch.equal per tensor), by
// COMMIT_STORE_GROUP pickles on a server without SHM, by per-group SHM
// slots on a server with a segment, and by pickles on that server too (the
// engine-driven worker of that era never uses SHM for several groups: its
// first group commit switches it to PICKLE, as a plain worker's fallback).
func TestHybridGroupsRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		pickle bool
		mode   string
	}{
		{"pickle", []string{"--shm-name", ""}, false, "pickle"},
		{"shm", nil, false, "shm"},
		{"pickle_worker_shm_server", nil, true, "pickle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := harness.Start(t, append([]string{"--chunk-size", "16", "--protocol", "engine-driven"}, tc.args...)...)
			res := hybrid(t, srv, "roundtrip", map[string]any{"model": "hy-" + tc.name, "groups": twoGroups(), "chunks": 3, "force_pickle": tc.pickle})
			if res["mode"] != tc.mode || res["hits"] != float64(3) {
				t.Fatalf("worker: %v", res)
			}
			shapes := res["shapes"].([]any)
			if len(shapes) != 2 || fmt.Sprint(shapes[0]) == fmt.Sprint(shapes[1]) {
				t.Fatalf("group shapes %v", shapes)
			}
			if !strings.Contains(srv.Output(), "2 groups: [2 2 16 16] float16 | [2 1 16 48] float32") {
				t.Fatalf("registration log does not show both groups:\n%s", srv.Output())
			}
		})
	}
}

// TestHybridGroupsHostile: group index out of range, negative or huge,
// a group's data of another layout or chunk count, 17 groups and a
// re-register with other groups: each is refused or answered false and the
// server keeps serving; group 1 stored alone is never a hit, and after
// group 0 the chunks come back exactly. Other groups for the same model
// register beside it, and the prompt misses while they hold none of it.
func TestHybridGroupsHostile(t *testing.T) {
	srv := harness.Start(t, "--chunk-size", "16", "--protocol", "engine-driven", "--shm-name", "")
	res := hybrid(t, srv, "hostile", map[string]any{"model": "hy-hostile", "groups": twoGroups()})
	for _, name := range []string{"group 2", "group -1", "group 2**40"} {
		if res[name] != "no answer" {
			t.Errorf("%s: %v, want refused (no answer in this profile)", name, res[name])
		}
	}
	for _, name := range []string{"group 0 data as group 1", "one chunk short", "truncated shape"} {
		if res[name] != "False" {
			t.Errorf("%s: %v, want False", name, res[name])
		}
	}
	// Request errors are logged once a second per request name, so the log
	// shows the first out-of-range group; /status counts all three.
	out := srv.Output()
	for _, want := range []string{"out of range: the instance registered 2 group(s)", "at most 16 KV groups"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q", want)
		}
	}
	var st struct {
		Requests struct {
			ByType map[string]struct {
				Error int64 `json:"error"`
			} `json:"by_type"`
		} `json:"requests"`
	}
	httpjson.Get(t, srv.StatusURL(), &st)
	if n := st.Requests.ByType["COMMIT_STORE_GROUP"].Error; n < 3 {
		t.Errorf("COMMIT_STORE_GROUP errors %d, want at least 3 (group 2, -1 and 2**40 refused)", n)
	}
}
