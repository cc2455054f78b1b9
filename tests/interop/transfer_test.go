// Package interop drives the real kvdock binary through the real wire with
// the libraries LMCache workers use (pyzmq, msgpack, torch under
// /usr/bin/python3): frames, profiles, bad input, SHM and pickle transfers.
package interop

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvdock/core/protocol"
	"kvdock/core/testkit/httpjson"
	"kvdock/tests/harness"
)

// worker runs one scenario of py/lmcache_worker.py against srv
// (harness.LMCacheWorker).
func worker(t *testing.T, srv *harness.Server, scenario string, params map[string]any) map[string]any {
	t.Helper()
	return harness.LMCacheWorker(t, harness.Python, srv, scenario, params)
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

// TestWorkersOnAWarmCacheReceiveWhatIsCounted: on a cache another SHM
// worker warmed, a new pickle worker (one that could not attach the
// segment, indistinguishable from an SHM one until it stores) and a new
// SHM worker each retrieve the stored prompt three times and receive its
// bytes; each is counted exactly the chunks it received.
func TestWorkersOnAWarmCacheReceiveWhatIsCounted(t *testing.T) {
	srv := harness.Start(t, "--chunk-size", "16")
	res := worker(t, srv, "warm", map[string]any{"model": "warm", "dtype": "float16", "layers": 2, "hidden": 16, "chunks": 2, "rounds": 3})
	if modes(res) != "[pickle shm]" {
		t.Fatalf("modes %v", res["modes"])
	}
	got, _ := res["received"].(map[string]any)
	if got["pickle"] != float64(6) || got["shm"] != float64(6) {
		t.Fatalf("chunks received %v, want 6 each", got)
	}
	st := srv.Status(t)
	for _, id := range []int64{2102, 2103} {
		c, ok := harness.ContextStatus(st, id)
		if !ok {
			t.Fatalf("instance %d not in /status", id)
		}
		if c.HitChunks != 6 || c.Retrieves != 3 {
			t.Errorf("instance %d counted %d hit chunks in %d retrieves, received 6 in 3", id, c.HitChunks, c.Retrieves)
		}
	}
}

// TestMaliciousPicklesRejected: pickles that would run code under Python's
// loader are refused (not answered, as the seed profile drops errors),
// counted as COMMIT_STORE handler errors, store nothing, and the log names
// the forbidden global.
func TestMaliciousPicklesRejected(t *testing.T) {
	srv := harness.Start(t, "--chunk-size", "16", "--shm-name", "")
	before := poolAndCounts(t, srv)
	res := worker(t, srv, "malicious", map[string]any{"model": "evil", "marker": filepath.Join(t.TempDir(), "pwned")})
	after := poolAndCounts(t, srv)
	answers, _ := res["answers"].([]any)
	if len(answers) == 0 {
		t.Fatalf("worker sent no malicious commit: %v", res)
	}
	for i, a := range answers {
		if a != "no answer" {
			t.Errorf("malicious commit %d answered %v: want it refused (errors are not answered in nongpu-v1)", i, a)
		}
	}
	n := int64(len(answers))
	if d := after.commitErrors - before.commitErrors; d != n {
		t.Errorf("COMMIT_STORE errors grew by %d for %d malicious commits", d, n)
	}
	if d := after.handlerErrors - before.handlerErrors; d != n {
		t.Errorf("bad_input %s grew by %d for %d malicious commits", protocol.KindHandlerErr, d, n)
	}
	if after.commitOK != before.commitOK || after.objects != before.objects || after.liveBytes != before.liveBytes || after.storedBytes != before.storedBytes {
		t.Errorf("a malicious commit stored something: before %+v, after %+v", before, after)
	}
	// os.system pickles as posix.system.
	if !strings.Contains(srv.Output(), "global posix.system not allowed") {
		t.Fatalf("the rejection does not name the global:\n%s", srv.Output())
	}
}

// storeCounts is what a store changes on the server, from /status.
type storeCounts struct {
	objects                int
	liveBytes, storedBytes int64
	commitOK, commitErrors int64
	handlerErrors          int64
}

func poolAndCounts(t *testing.T, srv *harness.Server) storeCounts {
	t.Helper()
	var st struct {
		Pool struct {
			Objects   int   `json:"objects"`
			LiveBytes int64 `json:"live_bytes"`
		} `json:"pool"`
		Contexts []struct {
			BytesIn int64 `json:"bytes_in"`
		} `json:"contexts"`
		Requests struct {
			ByType map[string]struct {
				OK    int64 `json:"ok"`
				Error int64 `json:"error"`
			} `json:"by_type"`
			BadInput map[string]int64 `json:"bad_input"`
		} `json:"requests"`
	}
	httpjson.Get(t, srv.StatusURL(), &st)
	c := storeCounts{objects: st.Pool.Objects, liveBytes: st.Pool.LiveBytes,
		commitOK: st.Requests.ByType[protocol.CommitStore].OK, commitErrors: st.Requests.ByType[protocol.CommitStore].Error,
		handlerErrors: st.Requests.BadInput[protocol.KindHandlerErr]}
	for _, x := range st.Contexts {
		c.storedBytes += x.BytesIn
	}
	return c
}
