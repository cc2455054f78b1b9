package interop

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	gozmq "github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"kvdock/core/engine"
	"kvdock/core/keys"
	"kvdock/core/kvevents"
	"kvdock/core/testkit/httpjson"
	"kvdock/tests/harness"
	goworker "kvdock/transfer/worker"
)

// routerIndex is a cache-aware router's view of kvdock, built as llm-d's
// indexer builds it: from the PUB stream, a gap in seq filled by a replay,
// positional or map events, integer hashes, a BlockStored whose parent it
// does not know dropped. It also records every break of the stream's rules.
type routerIndex struct {
	t      *testing.T
	replay gozmq.Socket

	mu      sync.Mutex
	next    uint64                     // the next seq to apply
	known   map[string]map[uint64]bool // model -> announced hashes (medium CPU)
	broken  []string                   // rule breaks: must stay empty
	dropped int                        // stored events with an unknown parent
	replays int
}

func (x *routerIndex) breakf(format string, args ...any) {
	x.broken = append(x.broken, fmt.Sprintf(format, args...))
}

// apply applies batch seq of topic; x.mu is held.
func (x *routerIndex) apply(topic []byte, seq uint64, payload []byte) {
	if seq != x.next {
		x.breakf("applied seq %d, expected %d", seq, x.next)
	}
	x.next = seq + 1
	model, ok := strings.CutPrefix(string(topic), "kv@eventspod@")
	if !ok {
		x.breakf("topic %q", topic)
		return
	}
	var batch []any
	if err := msgpack.Unmarshal(payload, &batch); err != nil || len(batch) != 3 {
		x.breakf("batch %d: %v (%d fields)", seq, err, len(batch))
		return
	}
	if _, ok := batch[0].(float64); !ok {
		x.breakf("batch %d: ts %T", seq, batch[0])
	}
	evs, _ := batch[1].([]any)
	if len(evs) == 0 {
		x.breakf("batch %d: no events", seq)
	}
	idx := x.known[model]
	if idx == nil {
		idx = map[uint64]bool{}
		x.known[model] = idx
	}
	for _, e := range evs {
		m, ok := e.(map[string]any)
		if !ok {
			x.breakf("batch %d: event %T", seq, e)
			continue
		}
		if m["medium"] != "CPU" {
			x.breakf("batch %d: medium %v", seq, m["medium"])
		}
		var hs []uint64
		for _, h := range asList(m["block_hashes"]) {
			v, ok := asUint(h)
			if !ok {
				x.breakf("batch %d: hash %T, not an integer", seq, h)
			}
			hs = append(hs, v)
		}
		switch m["type"] {
		case "BlockStored":
			if n := len(asList(m["token_ids"])); n != len(hs)*16 || m["block_size"] != int8(16) && m["block_size"] != uint8(16) {
				x.breakf("batch %d: %d tokens, block size %v for %d blocks", seq, n, m["block_size"], len(hs))
			}
			if p := m["parent_block_hash"]; p != nil {
				pv, _ := asUint(p)
				if !idx[pv] {
					x.dropped++ // llm-d drops it: kvdock must never send one
					x.breakf("batch %d: block %x before its parent %x", seq, hs[0], pv)
					continue
				}
			}
			for _, h := range hs {
				if idx[h] {
					x.breakf("batch %d: %x announced twice", seq, h)
				}
				idx[h] = true
			}
		case "BlockRemoved":
			for _, h := range hs {
				if !idx[h] {
					x.breakf("batch %d: removal of %x, never announced or removed already", seq, h)
				}
				delete(idx, h)
			}
		default:
			x.breakf("batch %d: event type %v", seq, m["type"])
		}
	}
}

// fill replays [x.next, upto) from the replay ROUTER; x.mu is held.
func (x *routerIndex) fill(upto uint64) error {
	x.replays++
	if err := x.replay.Send(gozmq.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, x.next))); err != nil {
		return fmt.Errorf("replay request: %w", err)
	}
	for {
		msg, err := x.replay.Recv()
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		f := msg.Frames
		if len(f) != 4 || len(f[0]) != 0 || len(f[2]) != 8 {
			return fmt.Errorf("replay frames %d", len(f))
		}
		if len(f[1]) == 0 {
			if binary.BigEndian.Uint64(f[2]) != ^uint64(0) {
				x.breakf("replay end marker %x", f[2])
			}
			return nil
		}
		if seq := binary.BigEndian.Uint64(f[2]); seq >= x.next && seq < upto {
			x.apply(f[1], seq, f[3])
		}
	}
}

// run reads the PUB stream until ctx ends.
func (x *routerIndex) run(ctx context.Context, sub gozmq.Socket) {
	for ctx.Err() == nil {
		msg, err := sub.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			x.mu.Lock()
			x.breakf("PUB message of %d frames", len(msg.Frames))
			x.mu.Unlock()
			continue
		}
		seq := binary.BigEndian.Uint64(msg.Frames[1])
		x.mu.Lock()
		if seq > x.next {
			if err := x.fill(seq); err != nil {
				x.breakf("%v", err)
			}
		}
		if seq >= x.next {
			x.apply(msg.Frames[0], seq, msg.Frames[2])
		}
		x.mu.Unlock()
	}
}

func asList(v any) []any { l, _ := v.([]any); return l }

func asUint(v any) (uint64, bool) {
	switch n := v.(type) {
	case uint64:
		return n, true
	case uint32:
		return uint64(n), true
	case uint16:
		return uint64(n), true
	case uint8:
		return uint64(n), true
	case int64:
		return uint64(n), n >= 0
	case int32:
		return uint64(n), n >= 0
	case int16:
		return uint64(n), n >= 0
	case int8:
		return uint64(n), n >= 0
	}
	return 0, false
}

type kvEventsStatus struct {
	KVEvents struct {
		Enabled bool   `json:"enabled"`
		NextSeq uint64 `json:"next_seq"`
		Queued  int    `json:"queued"`
		Dropped uint64 `json:"dropped"`
		Sent    uint64 `json:"sent"`
		// Log is the POLL_KV_EVENTS log's block (kvevents_poll_test.go).
		Log engine.KVEventLogStatus `json:"log"`
	} `json:"kv_events"`
	Pool struct {
		Evictions  uint64  `json:"evictions"`
		UsageRatio float64 `json:"usage_ratio"`
		Watermark  float64 `json:"trigger_watermark"`
	} `json:"pool"`
}

// TestKVEventsIndexEqualsLookup drives the real binary with a SHM worker and
// a pickle worker (two models) through randomized stores with shared
// prefixes, evictions under pressure and a clear, while a router subscribes
// with go-zeromq (llm-d's ZMQ library). After each phase, for every stored
// prompt, the leading chunks the router's index holds equal the hits
// LOOKUP answers: 0 divergence, and no event breaks a rule.
func TestKVEventsIndexEqualsLookup(t *testing.T) {
	// Fixed ports of this test's own range: FreePort's picks are free only
	// until the harness picks its own.
	pub, rep := 31036, 31037
	srv := harness.Start(t, "--chunk-size", "16",
		"--kv-events-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", pub),
		"--kv-events-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", rep),
		"--kv-events-pod", "eventspod")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := gozmq.NewSub(ctx)
	defer sub.Close()
	if err := sub.Dial(fmt.Sprintf("tcp://127.0.0.1:%d", pub)); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(gozmq.OptionSubscribe, "kv@eventspod@"); err != nil {
		t.Fatal(err)
	}
	dealer := gozmq.NewDealer(ctx)
	defer dealer.Close()
	if err := dealer.Dial(fmt.Sprintf("tcp://127.0.0.1:%d", rep)); err != nil {
		t.Fatal(err)
	}
	x := &routerIndex{t: t, replay: dealer, known: map[string]map[uint64]bool{}}
	go x.run(ctx, sub)

	// 256 KiB chunks (16 tokens, 2 layers, hidden 1024, float32): the
	// 64 MiB pool holds 256 of them. Three models: one SHM worker, one
	// pickle worker, and two SHM ranks of a world size 2 (a chunk is whole
	// once both ranks committed it).
	var ws [][]*goworker.Worker
	for i, g := range []struct {
		pickle    bool
		worldSize int
	}{{false, 1}, {true, 1}, {false, 2}} {
		var group []*goworker.Worker
		for r := range g.worldSize {
			w, err := goworker.Register(ctx, srv.Dial(t, "nongpu-v1"), goworker.Config{InstanceID: int64(3601 + 10*i + r),
				Model: fmt.Sprintf("events-model-%d", i), WorldSize: g.worldSize, WorkerID: r,
				Layers: 2, Hidden: 1024, Dtype: "float32", Pickle: g.pickle})
			if err != nil {
				t.Fatalf("register: %v\n%s", err, srv.Output())
			}
			defer w.Close()
			group = append(group, w)
		}
		ws = append(ws, group)
	}
	sched := goworker.Scheduler{C: srv.Dial(t, "nongpu-v1")}
	hasher, err := keys.NewHasher(16, "blake3")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(36, 36))
	type prompt struct {
		g      []*goworker.Worker
		tokens []uint32
	}
	var prompts []prompt
	chunk := make([]byte, ws[0][0].Layout().Bytes)
	// store stores n prompts of 2..6 chunks; half of them extend an earlier
	// prompt's first chunks, so prefixes are shared and parents held.
	// ranks, when not 0, stores with that many ranks of the group only.
	store := func(n, ranks int) {
		for range n {
			g := ws[rng.IntN(len(ws))]
			if ranks > 0 {
				g = ws[2]
			}
			var toks []uint32
			if len(prompts) > 0 && rng.IntN(2) == 0 && ranks == 0 {
				base := prompts[rng.IntN(len(prompts))]
				if base.g[0] == g[0] {
					toks = append(toks, base.tokens[:16*(1+rng.IntN(len(base.tokens)/16))]...)
				}
			}
			for n := 16 * (2 + rng.IntN(5)); len(toks) < n; {
				toks = append(toks, rng.Uint32N(50000))
			}
			toks = toks[:len(toks)/16*16]
			chunks := make([][]byte, len(toks)/16)
			for i := range chunks {
				chunks[i] = chunk
			}
			for r, w := range g {
				if ranks > 0 && r >= ranks {
					break
				}
				res, err := w.Store(ctx, w.Key(toks, len(chunks), fmt.Sprintf("store-%d", len(prompts))), chunks)
				if err != nil {
					t.Fatalf("store: %v\n%s", err, srv.Output())
				}
				if !res.Committed && !res.Skipped {
					t.Logf("store %d: %s, %d chunks: %+v", len(prompts), w.Mode(), len(chunks), res)
				}
			}
			prompts = append(prompts, prompt{g: g, tokens: toks})
		}
	}
	// caughtUp waits until the router applied every batch kvdock made.
	caughtUp := func(phase string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			var st kvEventsStatus
			httpjson.Get(t, statusURL(srv), &st)
			x.mu.Lock()
			next := x.next
			x.mu.Unlock()
			// The eviction loop runs on its own above the watermark: the
			// pool must be below it, or an eviction could land between
			// the index read and the lookups.
			if st.KVEvents.Queued == 0 && next == st.KVEvents.NextSeq && st.Pool.UsageRatio <= st.Pool.Watermark {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: router at seq %d, kvdock at %d (queued %d)", phase, next, st.KVEvents.NextSeq, st.KVEvents.Queued)
			}
			time.Sleep(20 * time.Millisecond) // polling a condition, bounded by the deadline
		}
	}
	check := func(phase string) (hits int) {
		t.Helper()
		caughtUp(phase)
		// Lookups do not change the set, so the index is read as it stands.
		x.mu.Lock()
		defer x.mu.Unlock()
		for i, p := range prompts {
			id := fmt.Sprintf("lookup-%s-%d", phase, i)
			w, tp := p.g[0], len(p.g)
			n, err := sched.Hits(ctx, w.LookupKey(p.tokens, id), tp)
			if err != nil {
				t.Fatalf("%s: lookup: %v", phase, err)
			}
			// The hits stay read-locked until freed: held, they would keep
			// the pool from evicting and later lookups from locking.
			free := w.LookupKey(p.tokens, id)
			free.End = n * 16
			if err := sched.FreeLookupLocks(ctx, free, tp); err != nil {
				t.Fatal(err)
			}
			if err := sched.EndSession(ctx, id); err != nil {
				t.Fatal(err)
			}
			lead := 0
			for _, h := range hasher.Hashes(p.tokens) {
				if !x.known[w.Model()][kvevents.WireHash(h)] {
					break
				}
				lead++
			}
			if lead != n {
				t.Errorf("%s: prompt %d (%d chunks): router index holds %d leading chunks, LOOKUP hits %d", phase, i, len(p.tokens)/16, lead, n)
			}
			hits += n
		}
		for _, b := range x.broken {
			t.Errorf("%s: %s", phase, b)
		}
		x.broken = nil
		return hits
	}

	store(30, 0)
	if hits := check("stored"); hits == 0 {
		t.Fatal("nothing hit after the first stores")
	}
	// Fresh prompts of the world size 2 model stored by one rank of two:
	// neither a hit nor announced.
	before := len(prompts)
	store(3, 1)
	check("one rank of two")
	x.mu.Lock()
	for _, p := range prompts[before:] {
		for _, h := range hasher.Hashes(p.tokens) {
			if x.known[p.g[0].Model()][kvevents.WireHash(h)] {
				t.Errorf("a chunk one rank of two committed is announced")
			}
		}
	}
	x.mu.Unlock()
	store(120, 0) // about 500 chunks into a pool of 256: evictions
	var st kvEventsStatus
	httpjson.Get(t, statusURL(srv), &st)
	if st.Pool.Evictions == 0 {
		t.Errorf("no evictions under pressure: %+v", st)
	}
	check("evicted")
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/clear-cache", srv.HTTPPort), "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if hits := check("cleared"); hits != 0 {
		t.Errorf("hits after a clear: %d", hits)
	}
	x.mu.Lock()
	for m, idx := range x.known {
		if len(idx) != 0 {
			t.Errorf("model %s: %d blocks still indexed after the clear", m, len(idx))
		}
	}
	x.mu.Unlock()
	store(20, 0)
	check("stored again")
	httpjson.Get(t, statusURL(srv), &st)
	if !st.KVEvents.Enabled || st.KVEvents.Dropped != 0 || st.KVEvents.Sent != st.KVEvents.NextSeq {
		t.Errorf("/status kv_events %+v", st.KVEvents)
	}
	x.mu.Lock()
	dropped := x.dropped
	x.mu.Unlock()
	if dropped != 0 {
		t.Errorf("%d events a router drops (unknown parent)", dropped)
	}
	// A router that starts now rebuilds the same index from replay alone.
	caughtUp("replay")
	y := &routerIndex{t: t, replay: dealer, known: map[string]map[uint64]bool{}}
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := y.fill(^uint64(0)); err != nil {
		t.Fatal(err)
	}
	if y.next != x.next || len(y.broken) != 0 {
		t.Errorf("replay: next seq %d (live %d), broken %v", y.next, x.next, y.broken)
	}
	for m, idx := range x.known {
		if len(y.known[m]) != len(idx) {
			t.Errorf("model %s: replay indexes %d blocks, live %d", m, len(y.known[m]), len(idx))
		}
		for h := range idx {
			if !y.known[m][h] {
				t.Errorf("model %s: replay lacks %x", m, h)
			}
		}
	}
	t.Logf("%d prompts, %d batches, %d gap replays", len(prompts), st.KVEvents.NextSeq, x.replays)
}
