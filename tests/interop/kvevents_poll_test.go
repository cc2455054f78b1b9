package interop

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"kvdock/core/keys"
	"kvdock/core/protocol"
	"kvdock/core/testkit/httpjson"
	"kvdock/tests/harness"
	goworker "kvdock/transfer/worker"
)

// pollResult is what py/kv_events_poll.py prints.
type pollResult struct {
	Error       string                        `json:"error"`
	Mode        string                        `json:"mode"`
	Paged       [][]uint64                    `json:"paged"`
	Hostile     map[string]bool               `json:"hostile"`
	Index       map[string][2]json.RawMessage `json:"index"`
	Incarnation int64                         `json:"incarnation"`
	Cursor      uint64                        `json:"cursor"`
	Resyncs     map[string]int                `json:"resyncs"`
	Records     int                           `json:"records"`
	LostSeen    int                           `json:"lost_seen"`
	Skipped     int                           `json:"skipped"`
}

func runPoller(t *testing.T, srv *harness.Server, params map[string]any) pollResult {
	t.Helper()
	p := map[string]any{"profile": "engine-driven-v2", "model": "poll-m", "dtype": "float32", "layers": 2,
		"hidden": 1024, "mla": false, "world": 1, "chunk": 16, "instance_id": 4701}
	for k, v := range params {
		p[k] = v
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	out := harness.RunPython(t, 120*time.Second, "py/kv_events_poll.py", srv.Endpoint, string(b))
	var res pollResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &res); err != nil {
		t.Fatalf("poller output %q: %v", out, err)
	}
	if res.Error != "" {
		t.Fatalf("poller (%v): %s\n%s", params["phase"], res.Error, srv.Output())
	}
	return res
}

// pollPrompts are prompts of 2 to 5 chunks of 16 tokens, half of them
// extending an earlier prompt's prefix.
func pollPrompts(seed uint64, n int) [][]uint32 {
	rng := rand.New(rand.NewPCG(seed, 47))
	var prompts [][]uint32
	for range n {
		var toks []uint32
		if len(prompts) > 0 && rng.IntN(2) == 0 {
			base := prompts[rng.IntN(len(prompts))]
			toks = append(toks, base[:16*(1+rng.IntN(len(base)/16))]...)
		}
		for m := 16 * (2 + rng.IntN(4)); len(toks) < m; {
			toks = append(toks, rng.Uint32N(50000))
		}
		prompts = append(prompts, toks[:len(toks)/16*16])
	}
	return prompts
}

// settle waits until the pool is below its eviction watermark (the
// eviction loop done) and returns the status.
func settle(t *testing.T, srv *harness.Server) kvEventsStatus {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var st kvEventsStatus
		httpjson.Get(t, srv.StatusURL(), &st)
		if st.Pool.UsageRatio <= st.Pool.Watermark {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("not settled: %+v", st)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, bounded by the deadline
	}
}

// chunkRecord is what a poller should hold for one chunk: its tokens and
// its parent's hash (hex, "" for a prompt's first).
type chunkRecord struct {
	tokens []uint32
	parent string
}

// lookupChunks asks LOOKUP how many leading chunks of each prompt hit and
// returns those chunks, named by kvdock's chunk hash (BLAKE3 chain).
func lookupChunks(t *testing.T, srv *harness.Server, model string, prompts [][]uint32) map[string]chunkRecord {
	t.Helper()
	ctx := context.Background()
	hasher, err := keys.NewHasher(16, "blake3")
	if err != nil {
		t.Fatal(err)
	}
	sched := goworker.Scheduler{C: srv.Dial(t, "engine-driven-v2")}
	want := map[string]chunkRecord{}
	for p, toks := range prompts {
		k := protocol.Key{ModelName: model, WorldSize: 1, TokenIDs: toks, End: len(toks), RequestID: fmt.Sprintf("l-%d", p)}
		n, err := sched.Hits(ctx, k, 1)
		if err != nil {
			t.Fatal(err)
		}
		free := k
		free.End = n * 16
		if err := sched.FreeLookupLocks(ctx, free, 1); err != nil {
			t.Fatal(err)
		}
		hs := hasher.Hashes(toks[:n*16])
		for i, h := range hs {
			r := chunkRecord{tokens: toks[i*16 : (i+1)*16]}
			if i > 0 {
				r.parent = hex.EncodeToString(hs[i-1][:])
			}
			want[hex.EncodeToString(h[:])] = r
		}
	}
	return want
}

// TestKVEventsPollPython: an LMCache-style worker (pyzmq, msgpack, torch)
// on the engine-driven-v2 table finds kv_events in GET_EXPERIMENTAL,
// stores prompts with shared prefixes into a pool that evicts, and polls
// POLL_KV_EVENTS as LMCache's connector does. The chunks its index holds,
// with their tokens and parents, equal the chunks LOOKUP hits; seqs start
// at 1 and page from cursor 0; hostile polls (wrong types, a negative
// cursor, zero or huge max_events, a cursor in the future, an unknown
// model) get no answer or LMCache's, and change nothing.
func TestKVEventsPollPython(t *testing.T) {
	srv := harness.Start(t, "--protocol", "engine-driven-v2", "--chunk-size", "16")
	prompts := pollPrompts(1, 120) // about 400 chunks of 256 KiB into 64 MiB
	state := filepath.Join(t.TempDir(), "state.json")
	r := runPoller(t, srv, map[string]any{"phase": "store", "prompts": prompts, "state": state,
		"paged_from_zero": true, "page": 5})
	if r.Mode != "shm" || len(r.Paged) != 2 || !slices.Equal(r.Paged[0], []uint64{1}) || !slices.Equal(r.Paged[1], []uint64{2}) {
		t.Fatalf("store phase: mode %s, pages from cursor 0 %v", r.Mode, r.Paged)
	}
	st := settle(t, srv)
	if st.Pool.Evictions == 0 || !st.KVEvents.Log.Enabled || st.KVEvents.Enabled {
		t.Fatalf("status %+v", st)
	}
	r = runPoller(t, srv, map[string]any{"phase": "poll", "state": state, "hostile": true})
	for _, name := range []string{"cursor_str", "model_int", "max_none", "two_args", "negative_cursor", "zero_max",
		"future_cursor", "huge_max", "unknown_model", "unchanged"} {
		if !r.Hostile[name] {
			t.Errorf("hostile poll %s: %v", name, r.Hostile)
		}
	}
	if r.Resyncs["events_lost"]+r.Resyncs["server_restart"] != 0 || r.Skipped != 0 {
		t.Errorf("resyncs %v, skipped %d without a loss", r.Resyncs, r.Skipped)
	}
	want := lookupChunks(t, srv, "poll-m", prompts)
	if len(want) == 0 || len(r.Index) != len(want) {
		t.Fatalf("poller indexes %d chunks, LOOKUP hits %d", len(r.Index), len(want))
	}
	for h, rec := range r.Index {
		w, ok := want[h]
		if !ok {
			t.Fatalf("poller indexes %s, which LOOKUP does not hit", h[:8])
		}
		var toks []uint32
		var parent *string
		if json.Unmarshal(rec[0], &toks) != nil || json.Unmarshal(rec[1], &parent) != nil {
			t.Fatalf("index entry %s: %s", h[:8], rec)
		}
		if !slices.Equal(toks, w.tokens) || (parent == nil) != (w.parent == "") || parent != nil && *parent != w.parent {
			t.Fatalf("chunk %s: tokens/parent differ from the prompt's", h[:8])
		}
	}
	st = settle(t, srv)
	t.Logf("%d records read, %d chunks indexed = LOOKUP hits, %d evictions, log %+v", r.Records, len(r.Index),
		st.Pool.Evictions, st.KVEvents.Log)
	if l := st.KVEvents.Log; l.Capacity != 32768 || l.Depth == 0 || uint64(l.Depth) != l.NextSeq-1 ||
		l.Incarnation != r.Incarnation || l.LostAnswers == 0 || l.Polls < 10 {
		t.Errorf("log status %+v", l)
	}
}

// TestKVEventsPollLostPython: with a log of 16 records, a poller that
// reads nothing while ~90 records pass is told lost, withdraws what it
// held and keeps only what follows (a subset of the chunks LOOKUP hits);
// a restarted server is a new incarnation, on which the poller withdraws
// everything.
func TestKVEventsPollLostPython(t *testing.T) {
	srv := harness.Start(t, "--protocol", "engine-driven-v2", "--chunk-size", "16", "--kv-event-log-size", "16")
	prompts := pollPrompts(2, 30)
	state := filepath.Join(t.TempDir(), "state.json")
	runPoller(t, srv, map[string]any{"phase": "store", "prompts": prompts, "state": state, "poll_every": 0})
	settle(t, srv)
	r := runPoller(t, srv, map[string]any{"phase": "poll", "state": state})
	if r.LostSeen != 1 || r.Resyncs["events_lost"] != 1 || len(r.Index) == 0 || len(r.Index) > 16 {
		t.Fatalf("after overflow: lost %d, resyncs %v, %d indexed", r.LostSeen, r.Resyncs, len(r.Index))
	}
	want := lookupChunks(t, srv, "poll-m", prompts)
	for h := range r.Index {
		if _, ok := want[h]; !ok {
			t.Fatalf("poller indexes %s, which LOOKUP does not hit", h[:8])
		}
	}
	var st kvEventsStatus
	httpjson.Get(t, srv.StatusURL(), &st)
	t.Logf("lost after %d records into a log of 16: %d indexed of %d LOOKUP hits, %d removals skipped, log %+v",
		st.KVEvents.Log.NextSeq-1, len(r.Index), len(want), r.Skipped, st.KVEvents.Log)
	if l := st.KVEvents.Log; l.Depth != 16 || l.Trimmed == 0 || l.LostAnswers != 1 {
		t.Errorf("log status %+v", l)
	}
	srv.Stop(t)

	next := harness.Start(t, "--protocol", "engine-driven-v2", "--chunk-size", "16", "--kv-event-log-size", "16")
	r2 := runPoller(t, next, map[string]any{"phase": "poll", "state": state})
	if r2.Resyncs["server_restart"] != 1 || len(r2.Index) != 0 || r2.Incarnation == r.Incarnation {
		t.Fatalf("after a restart: resyncs %v, %d indexed, incarnation %d then %d", r2.Resyncs, len(r2.Index),
			r.Incarnation, r2.Incarnation)
	}
}

// TestKVEventsPollRestartPython: a restart in place that adopts the pool
// (SIGUSR2, the same pid) starts a new log under a new incarnation: the
// poller withdraws what it announced, and rebuilds from the new log, whose
// first records re-announce the adopted pool, exactly the chunks LOOKUP
// hits in it.
func TestKVEventsPollRestartPython(t *testing.T) {
	srv := harness.StartKeeping(t, false, "--protocol", "engine-driven-v2", "--chunk-size", "16")
	prompts := pollPrompts(3, 20)
	state := filepath.Join(t.TempDir(), "state.json")
	runPoller(t, srv, map[string]any{"phase": "store", "prompts": prompts, "state": state})
	before := runPoller(t, srv, map[string]any{"phase": "poll", "state": state})
	if len(before.Index) == 0 || before.Resyncs["server_restart"] != 0 {
		t.Fatalf("before the restart: %d indexed, resyncs %v", len(before.Index), before.Resyncs)
	}
	pid := srv.PID()
	srv.RestartSignal(t)
	after := runPoller(t, srv, map[string]any{"phase": "poll", "state": state})
	if after.Resyncs["server_restart"] != 1 || after.Incarnation == before.Incarnation {
		t.Fatalf("after the restart (pid %d then %d): resyncs %v, incarnation %d then %d", pid, srv.PID(),
			after.Resyncs, before.Incarnation, after.Incarnation)
	}
	want := lookupChunks(t, srv, "poll-m", prompts)
	if len(want) == 0 {
		t.Fatal("the adopted pool hits nothing")
	}
	for h := range after.Index {
		if _, ok := want[h]; !ok {
			t.Fatalf("poller indexes %s, which LOOKUP does not hit", h[:8])
		}
	}
	if len(after.Index) != len(want) {
		t.Fatalf("after the restart the poller holds %d chunks, LOOKUP hits %d: the adopted pool was not re-announced whole", len(after.Index), len(want))
	}
	t.Logf("restart: %d chunks indexed before, %d after (LOOKUP hits %d in the adopted pool)",
		len(before.Index), len(after.Index), len(want))
}
