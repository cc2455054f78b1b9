package interop

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"kvdock/tests/harness"
)

type eraCase struct {
	Era             string `json:"era"`
	First           string `json:"first"`
	Steps           []string
	Error           string `json:"error"`
	Death           any    `json:"death"`
	FirstAnswer     any    `json:"first_answer"`
	GetExperimental []any  `json:"get_experimental"`
	ChunkSize       any    `json:"chunk_size"`
	SeedHits        any    `json:"seed_hits"`
}

func runEraClients(t *testing.T, endpoint string, cases []map[string]any) []eraCase {
	t.Helper()
	b, err := json.Marshal(map[string]any{"model": "era-m", "dtype": "float16", "layers": 2, "hidden": 16,
		"chunk": 16, "instance_id": 500, "seed": 11, "cases": cases})
	if err != nil {
		t.Fatal(err)
	}
	out := harness.RunPython(t, 240*time.Second, "py/era_client.py", endpoint, string(b))
	var res []eraCase
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &res); err != nil {
		t.Fatalf("era_client output %q: %v", out, err)
	}
	if len(res) != len(cases) {
		t.Fatalf("%d results for %d cases", len(res), len(cases))
	}
	return res
}

// checkEraWorker: the worker flow after the first message completed with
// no reply its client could not decode, identical bytes, the chunk size,
// and GET_EXPERIMENTAL (where the era has it) answered at once, with no
// names but kv_events where the era's table serves POLL_KV_EVENTS.
func checkEraWorker(t *testing.T, what string, r eraCase) {
	t.Helper()
	if r.Error != "" || r.Death != nil || len(r.Steps) != 5 {
		t.Errorf("%s: %+v", what, r)
		return
	}
	if fmt.Sprint(r.ChunkSize) != "16" {
		t.Errorf("%s: chunk size %v", what, r.ChunkSize)
	}
	if strings.HasPrefix(r.Era, "engine-driven-v2") || r.Era == "rpc-messages" {
		// The KV event poll channel (log on by default) is named to the
		// one table that serves POLL_KV_EVENTS.
		want := "[]"
		if r.Era == "engine-driven-v2" {
			want = "[kv_events]"
		}
		if len(r.GetExperimental) != 2 || fmt.Sprint(r.GetExperimental[0]) != want {
			t.Errorf("%s: GET_EXPERIMENTAL %v", what, r.GetExperimental)
		} else if s, _ := r.GetExperimental[1].(float64); s > 0.5 {
			t.Errorf("%s: GET_EXPERIMENTAL answered after %.3fs", what, s)
		}
	}
}

var autoEras = []string{"nongpu-v1", "nongpu-v2", "engine-driven", "engine-driven-v2-early", "engine-driven-v2", "rpc-messages"}

// TestAutoEraFirstMessages: one --protocol auto server;
// for every era a client that decodes replies as that era's upstream
// client does (a mistyped reply stops its receive loop) sends NOOP, CLEAR,
// PING or GET_CHUNK_SIZE as its very first message, then works as a
// worker on the same socket. No reply may stop its loop, its other
// requests complete, and a seeded chunk is gone only where CLEAR was not a
// guess (the era's CLEAR fits no other table's reading).
func TestAutoEraFirstMessages(t *testing.T) {
	srv := harness.Start(t, "--protocol", "auto", "--chunk-size", "16")
	var cases []map[string]any
	for i, era := range autoEras {
		for j, first := range []string{"NOOP", "CLEAR", "PING", "GET_CHUNK_SIZE"} {
			cases = append(cases, map[string]any{"era": era, "first": first, "seed": 100 + 10*i + j*2,
				"instance_id": 1000 + 10*i + 2*j})
		}
	}
	// CLEAR runs where its reading is not a guess: nongpu-v1's 15 [] and
	// nongpu-v2's ... fit one table or read as CLEAR in every candidate.
	clears := map[string]bool{"nongpu-v1": true, "engine-driven-v2-early": true, "engine-driven-v2": true, "rpc-messages": true}
	for _, r := range runEraClients(t, srv.Endpoint, cases) {
		what := r.Era + " first " + r.First
		t.Logf("%s: first answer %v", what, r.FirstAnswer)
		checkEraWorker(t, what, r)
		want := "1"
		if r.First == "CLEAR" && clears[r.Era] {
			want = "0"
		}
		if fmt.Sprint(r.SeedHits) != want {
			t.Errorf("%s: seeded chunk hits %v after, want %s", what, r.SeedHits, want)
		}
		if r.First == "GET_CHUNK_SIZE" && r.Era != "nongpu-v1" && r.Era != "nongpu-v2" && fmt.Sprint(r.FirstAnswer) != "16" {
			t.Errorf("%s: first GET_CHUNK_SIZE answered %v", what, r.FirstAnswer)
		}
	}
}

// TestAutoEraGetExperimentalAt40: the engine-driven-v2
// numbering with GET_EXPERIMENTAL at 40 registers, stores, retrieves
// identical bytes and gets its experimental answer at once, under its own
// profile and under auto.
func TestAutoEraGetExperimentalAt40(t *testing.T) {
	for _, proto := range []string{"engine-driven-v2-early", "auto"} {
		srv := harness.Start(t, "--protocol", proto, "--chunk-size", "16")
		r := runEraClients(t, srv.Endpoint, []map[string]any{{"era": "engine-driven-v2-early"}})[0]
		checkEraWorker(t, "--protocol "+proto, r)
		if proto == "auto" && !strings.Contains(srv.Output(), "profile=engine-driven-v2-early evidence=") {
			t.Errorf("no detection of engine-driven-v2-early in the log")
		}
		if strings.Contains(srv.Output(), "unknown_type") {
			t.Errorf("--protocol %s: an unknown type was logged", proto)
		}
	}
}
