package interop

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"kvdock/core/keys"
	"kvdock/core/kvevents"
	"kvdock/core/testkit/httpjson"
	"kvdock/tests/harness"
	goworker "kvdock/transfer/worker"
)

// A Python subscriber on pyzmq and msgpack (vLLM's own stack), modelled on
// vLLM's example subscriber, rebuilds from replay alone the set of chunks
// LOOKUP hits, in both encodings and both replay forms, after stores with
// shared prefixes and evictions.
func TestKVEventsReplayPython(t *testing.T) {
	for i, form := range []struct {
		encoding, replay string
		block            int // --kv-events-block-size; 0 = the chunk size
	}{{"map", "current", 0}, {"array", "legacy", 0}, {"map", "current", 4}} {
		t.Run(fmt.Sprintf("%s-%s-%d", form.encoding, form.replay, form.block), func(t *testing.T) {
			ps := eventsPorts(t, 47270+10*i, 47280+10*i, 2) // bindable now (see eventsPorts)
			pub, rep := ps[0], ps[1]
			srv := harness.Start(t, "--chunk-size", "16",
				"--kv-events-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", pub),
				"--kv-events-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", rep),
				"--kv-events-encoding", form.encoding, "--kv-events-replay-format", form.replay,
				"--kv-events-pod", "pypod", "--kv-events-block-size", fmt.Sprint(form.block))
			ctx := context.Background()
			w, err := goworker.Register(ctx, srv.Dial(t, "nongpu-v1"), goworker.Config{InstanceID: 3701,
				Model: "events-py", Layers: 2, Hidden: 1024, Dtype: "float32"})
			if err != nil {
				t.Fatalf("register: %v\n%s", err, srv.Output())
			}
			defer w.Close()
			rng := rand.New(rand.NewPCG(uint64(i), 37))
			chunk := make([]byte, w.Layout().Bytes)
			var prompts [][]uint32
			for p := range 120 { // about 400 chunks into a pool of 256
				var toks []uint32
				if len(prompts) > 0 && rng.IntN(2) == 0 {
					base := prompts[rng.IntN(len(prompts))]
					toks = append(toks, base[:16*(1+rng.IntN(len(base)/16))]...)
				}
				for n := 16 * (2 + rng.IntN(4)); len(toks) < n; {
					toks = append(toks, rng.Uint32N(50000))
				}
				toks = toks[:len(toks)/16*16]
				chunks := make([][]byte, len(toks)/16)
				for c := range chunks {
					chunks[c] = chunk
				}
				if _, err := w.Store(ctx, w.Key(toks, len(chunks), fmt.Sprintf("s-%d", p)), chunks); err != nil {
					t.Fatal(err)
				}
				prompts = append(prompts, toks)
			}
			// Settled: nothing queued, the pool below the eviction watermark.
			deadline := time.Now().Add(15 * time.Second)
			for {
				var st kvEventsStatus
				httpjson.Get(t, srv.StatusURL(), &st)
				if st.KVEvents.Queued == 0 && st.KVEvents.NextSeq == st.KVEvents.Sent && st.Pool.UsageRatio <= st.Pool.Watermark {
					if st.Pool.Evictions == 0 {
						t.Fatalf("no evictions: %+v", st)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("not settled: %+v", st)
				}
				time.Sleep(20 * time.Millisecond) // polling a condition, bounded by the deadline
			}
			// The router's blocks: a quarter chunk names its blocks as a
			// server with that chunk size would.
			block := 16
			if form.block != 0 {
				block = form.block
			}
			hasher, err := keys.NewHasher(block, "blake3")
			if err != nil {
				t.Fatal(err)
			}
			sched := goworker.Scheduler{C: srv.Dial(t, "nongpu-v1")}
			want := map[uint64]bool{}
			for p, toks := range prompts {
				id := fmt.Sprintf("l-%d", p)
				n, err := sched.Hits(ctx, w.LookupKey(toks, id), 1)
				if err != nil {
					t.Fatal(err)
				}
				free := w.LookupKey(toks, id)
				free.End = n * 16
				if err := sched.FreeLookupLocks(ctx, free, 1); err != nil {
					t.Fatal(err)
				}
				for _, h := range hasher.Hashes(toks[:n*16]) {
					want[kvevents.WireHash(h)] = true
				}
			}
			out := harness.RunPython(t, 60*time.Second, "py/kv_events_replay.py", fmt.Sprintf("tcp://127.0.0.1:%d", rep), form.replay)
			var res struct {
				Models  map[string][]uint64 `json:"models"`
				Batches int                 `json:"batches"`
				Dropped int                 `json:"dropped"`
				Errors  []string            `json:"errors"`
			}
			if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &res); err != nil {
				t.Fatalf("subscriber output %q: %v", out, err)
			}
			model := "events-py"
			if form.replay == "legacy" {
				model = "(all)" // legacy replay frames carry no topic
			}
			got := res.Models[model]
			if len(res.Errors) != 0 || res.Dropped != 0 || res.Batches == 0 {
				t.Errorf("subscriber: %d batches, %d dropped, errors %v", res.Batches, res.Dropped, res.Errors)
			}
			if len(got) != len(want) {
				t.Fatalf("subscriber indexes %d chunks, LOOKUP hits %d", len(got), len(want))
			}
			for _, h := range got {
				if !want[h] {
					t.Fatalf("subscriber indexes %x, which LOOKUP does not hit", h)
				}
			}
			if len(want) == 0 {
				t.Fatal("nothing hit")
			}
		})
	}
}
