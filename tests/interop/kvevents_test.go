package interop

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gozmq "github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"

	"kvdock/core/engine"
	"kvdock/core/keys"
	"kvdock/core/kvevents"
	"kvdock/core/protocol"
	"kvdock/core/testkit/httpjson"
	"kvdock/core/testkit/poll"
	"kvdock/core/testkit/redisserver"
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

	mu          sync.Mutex
	next        uint64                     // the next seq to apply
	known       map[string]map[uint64]bool // model -> announced hashes (medium CPU)
	storage     map[string]map[uint64]bool // model -> announced hashes (medium STORAGE)
	broken      []string                   // rule breaks: must stay empty
	dropped     int                        // stored events with an unknown parent
	storageSeen int                        // STORAGE events applied
	stored      int                        // blocks BlockStored announced, over every medium
	removed     int                        // blocks BlockRemoved removed
	replays     int
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
	for _, e := range evs {
		m, ok := e.(map[string]any)
		if !ok {
			x.breakf("batch %d: event %T", seq, e)
			continue
		}
		// An index per medium, each with its own rules (llm-d keeps the
		// medium of each entry).
		media := map[any]map[string]map[uint64]bool{"CPU": x.known, "STORAGE": x.storage}
		byModel := media[m["medium"]]
		if byModel == nil {
			x.breakf("batch %d: medium %v", seq, m["medium"])
			continue
		}
		if m["medium"] == "STORAGE" {
			x.storageSeen++
		}
		idx := byModel[model]
		if idx == nil {
			idx = map[uint64]bool{}
			byModel[model] = idx
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
				x.stored++
			}
		case "BlockRemoved":
			for _, h := range hs {
				if !idx[h] {
					x.breakf("batch %d: removal of %x, never announced or removed already", seq, h)
				}
				delete(idx, h)
				x.removed++
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

// applied is how many blocks the stream announced and removed; x.mu is held.
func (x *routerIndex) applied() (stored, removed int) { return x.stored, x.removed }

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
	Tiers []struct {
		QueueDepth int `json:"queue_depth"`
	} `json:"tiers"`
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
// prefixes, evictions under pressure, unregisters and registrations again
// of workers, and a clear, while a router subscribes
// with go-zeromq (llm-d's ZMQ library). After each phase, for every stored
// prompt, the leading chunks the router's index holds equal the hits
// LOOKUP answers: 0 divergence, and no event breaks a rule. With an fs
// tier written behind, the leading chunks held in CPU or STORAGE equal
// them: through the L1 clear (the tier still answers) and a clear of the
// tier (nothing left).
func TestKVEventsIndexEqualsLookup(t *testing.T) {
	// Ports of this test's own range (FreePort's picks are free only
	// until the harness picks its own) that libzmq can bind now.
	for _, withTier := range []bool{false, true} {
		t.Run(map[bool]string{false: "l1", true: "fs tier"}[withTier], func(t *testing.T) {
			ps := eventsPorts(t, 47200, 47230, 2)
			kvEventsIndexEqualsLookup(t, ps[0], ps[1], withTier)
		})
	}
}

// eventsRun is a kvdock driven through randomized stores while a router
// subscribes: the workers, the prompts stored and the router's index.
type eventsRun struct {
	t       *testing.T
	ctx     context.Context
	srv     *harness.Server
	x       *routerIndex
	ws      [][]*goworker.Worker
	cfgs    [][]goworker.Config
	down    [][]bool // the ranks unregistered now, per group (their group stores nothing)
	sched   goworker.Scheduler
	hasher  *keys.Hasher
	rng     *rand.Rand
	prompts []eventsPrompt
	chunk   []byte
	// unregisters counts the churn's unregisters.
	unregisters int
}

type eventsPrompt struct {
	g      []*goworker.Worker
	tokens []uint32
}

// subscribe starts a router on kvdock's PUB and replay endpoints; with
// replay it first rebuilds from the replay buffer (a router that comes up
// after a restart). It stops with ctx.
func subscribe(t *testing.T, ctx context.Context, pub, rep int, replay bool) *routerIndex {
	t.Helper()
	sub := gozmq.NewSub(ctx)
	t.Cleanup(func() { sub.Close() })
	if err := sub.Dial(fmt.Sprintf("tcp://127.0.0.1:%d", pub)); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(gozmq.OptionSubscribe, "kv@eventspod@"); err != nil {
		t.Fatal(err)
	}
	dealer := gozmq.NewDealer(ctx)
	t.Cleanup(func() { dealer.Close() })
	if err := dealer.Dial(fmt.Sprintf("tcp://127.0.0.1:%d", rep)); err != nil {
		t.Fatal(err)
	}
	x := &routerIndex{t: t, replay: dealer, known: map[string]map[uint64]bool{}, storage: map[string]map[uint64]bool{}}
	if replay {
		x.mu.Lock()
		err := x.fill(^uint64(0))
		x.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	go x.run(ctx, sub)
	return x
}

// eventsArgs are the flags of a server publishing on pub and replaying on rep.
func eventsArgs(pub, rep int) []string {
	return []string{"--chunk-size", "16",
		"--kv-events-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", pub),
		"--kv-events-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", rep),
		"--kv-events-pod", "eventspod"}
}

// newEventsRun registers the workers: 256 KiB chunks (16 tokens, 2 layers,
// hidden 1024, float32), so the 64 MiB pool holds 256 of them. Three
// models: one SHM worker, one pickle worker, and two SHM ranks of a world
// size 2 (a chunk is whole once both ranks committed it).
func newEventsRun(t *testing.T, ctx context.Context, srv *harness.Server, x *routerIndex) *eventsRun {
	r := &eventsRun{t: t, ctx: ctx, srv: srv, x: x, rng: rand.New(rand.NewPCG(36, 36))}
	for i, g := range []struct {
		pickle    bool
		worldSize int
	}{{false, 1}, {true, 1}, {false, 2}} {
		var cfgs []goworker.Config
		for rank := range g.worldSize {
			cfgs = append(cfgs, goworker.Config{InstanceID: int64(3601 + 10*i + rank),
				Model: fmt.Sprintf("events-model-%d", i), WorldSize: g.worldSize, WorkerID: rank,
				Layers: 2, Hidden: 1024, Dtype: "float32", Pickle: g.pickle})
		}
		r.cfgs = append(r.cfgs, cfgs)
		r.ws = append(r.ws, make([]*goworker.Worker, g.worldSize))
		r.down = append(r.down, make([]bool, g.worldSize))
		for rank := range g.worldSize {
			r.register(i, rank)
		}
	}
	r.sched = goworker.Scheduler{C: srv.Dial(t, "nongpu-v1")}
	var err error
	if r.hasher, err = keys.NewHasher(16, "blake3"); err != nil {
		t.Fatal(err)
	}
	r.chunk = make([]byte, r.ws[0][0].Layout().Bytes)
	return r
}

// register registers rank of group i (again: a worker of the same model,
// layout and instance id).
func (r *eventsRun) register(i, rank int) {
	t := r.t
	w, err := goworker.Register(r.ctx, r.srv.Dial(t, "nongpu-v1"), r.cfgs[i][rank])
	if err != nil {
		t.Fatalf("register: %v\n%s", err, r.srv.Output())
	}
	t.Cleanup(func() { w.Close() })
	r.ws[i][rank], r.down[i][rank] = w, false
}

// isDown reports whether a rank of group i is unregistered.
func (r *eventsRun) isDown(i int) bool { return slices.Contains(r.down[i], true) }

// churn unregisters and registers again workers, n times at random, and
// stores between: a group's last worker unregistered (LOOKUP answers 0 for
// its prompts, whose chunks stay in the pool), one rank of the world size
// 2 model alone (its layout stays registered through the other rank:
// LOOKUP still counts), the ranks down registered again (their chunks
// count again). After each step the index equals LOOKUP's hits.
func (r *eventsRun) churn(n int) {
	t, rng := r.t, r.rng
	for step := range n {
		i := rng.IntN(len(r.ws))
		switch {
		case r.isDown(i):
			for rank, d := range r.down[i] {
				if d {
					r.register(i, rank)
				}
			}
		default:
			ranks := len(r.ws[i])
			if ranks > 1 && rng.IntN(2) == 0 {
				ranks = 1 // one rank of two: nothing changes for LOOKUP
			}
			for rank := range ranks {
				w := r.ws[i][rank]
				if err := w.Unregister(r.ctx); err != nil {
					t.Fatal(err)
				}
				w.Close()
				r.down[i][rank] = true
			}
			r.unregisters++
		}
		r.store(3, 0)
		r.check(fmt.Sprintf("churn %d (group %d down %v)", step, i, r.down[i]))
	}
}

// store stores n prompts of 2..6 chunks; half of them extend an earlier
// prompt's first chunks, so prefixes are shared and parents held.
// ranks, when not 0, stores with that many ranks of the group only. A
// group with a rank unregistered stores nothing.
func (r *eventsRun) store(n, ranks int) {
	t, rng := r.t, r.rng
	for range n {
		gi := rng.IntN(len(r.ws))
		if ranks > 0 {
			gi = 2
		}
		if r.isDown(gi) {
			continue
		}
		g := r.ws[gi]
		var toks []uint32
		if len(r.prompts) > 0 && rng.IntN(2) == 0 && ranks == 0 {
			base := r.prompts[rng.IntN(len(r.prompts))]
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
			chunks[i] = r.chunk
		}
		for rank, w := range g {
			if ranks > 0 && rank >= ranks {
				break
			}
			res, err := w.Store(r.ctx, w.Key(toks, len(chunks), fmt.Sprintf("store-%d", len(r.prompts))), chunks)
			if err != nil {
				t.Fatalf("store: %v\n%s", err, r.srv.Output())
			}
			if !res.Committed && !res.Skipped {
				t.Logf("store %d: %s, %d chunks: %+v", len(r.prompts), w.Mode(), len(chunks), res)
			}
		}
		r.prompts = append(r.prompts, eventsPrompt{g: g, tokens: toks})
	}
}

// caughtUp waits until the router applied every batch kvdock made.
func (r *eventsRun) caughtUp(phase string) {
	t := r.t
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var st kvEventsStatus
		httpjson.Get(t, r.srv.StatusURL(), &st)
		r.x.mu.Lock()
		next := r.x.next
		r.x.mu.Unlock()
		// The eviction loop runs on its own above the watermark: the
		// pool must be below it, or an eviction could land between
		// the index read and the lookups. The tier's writes behind must
		// have landed too.
		queued := 0
		for _, tr := range st.Tiers {
			queued += tr.QueueDepth
		}
		if st.KVEvents.Queued == 0 && queued == 0 && next == st.KVEvents.NextSeq && st.Pool.UsageRatio <= st.Pool.Watermark {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: router at seq %d, kvdock at %d (queued %d)", phase, next, st.KVEvents.NextSeq, st.KVEvents.Queued)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, bounded by the deadline
	}
}

// check asserts, once the router caught up, that for every prompt stored
// the leading chunks the index holds (CPU or STORAGE) equal LOOKUP's hits,
// and that no event broke a rule; it returns the hits.
func (r *eventsRun) check(phase string) (hits int) {
	t, x := r.t, r.x
	t.Helper()
	r.caughtUp(phase)
	// Lookups do not change the set, so the index is read as it stands.
	x.mu.Lock()
	defer x.mu.Unlock()
	for i, p := range r.prompts {
		w, tp := p.g[0], len(p.g)
		lookup := func(attempt int) int {
			id := fmt.Sprintf("lookup-%s-%d-%d", phase, i, attempt)
			n, err := r.sched.Hits(r.ctx, w.LookupKey(p.tokens, id), tp)
			if err != nil {
				t.Fatalf("%s: lookup: %v", phase, err)
			}
			// The hits stay read-locked until freed: held, they would
			// keep the pool from evicting and later lookups from locking.
			free := w.LookupKey(p.tokens, id)
			free.End = n * 16
			if err := r.sched.FreeLookupLocks(r.ctx, free, tp); err != nil {
				t.Fatal(err)
			}
			if err := r.sched.EndSession(r.ctx, id); err != nil {
				t.Fatal(err)
			}
			return n
		}
		lead := 0
		for _, h := range r.hasher.Hashes(p.tokens) {
			wh := kvevents.WireHash(h)
			if !x.known[w.Model()][wh] && !x.storage[w.Model()][wh] {
				break
			}
			lead++
		}
		n := lookup(0)
		// A LOOKUP counts a tier's chunks only once loaded into L1 within
		// its tier phase's time; on a loaded host a load can miss it (seen
		// once in CI: 2 of 6 leading chunks, the other 4 in STORAGE). Such
		// a miss passes when asked again (the load landed meanwhile); a
		// divergence of the index does not.
		for attempt := 1; n < lead && attempt <= 3; attempt++ {
			t.Logf("%s: prompt %d: LOOKUP hit %d of the %d leading chunks; asking again", phase, i, n, lead)
			time.Sleep(250 * time.Millisecond) // a slow tier load's time to land; the assertion below bounds it
			n = lookup(attempt)
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

func kvEventsIndexEqualsLookup(t *testing.T, pub, rep int, withTier bool) {
	args := eventsArgs(pub, rep)
	if withTier {
		// 1 GiB: the tier keeps every chunk, so L1's evictions leave them there.
		args = append(args, "--l2-adapter", fmt.Sprintf(`{"type": "fs", "base_path": %q, "max_capacity_gb": 1}`, t.TempDir()))
	}
	srv := harness.Start(t, args...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	x := subscribe(t, ctx, pub, rep, false)
	r := newEventsRun(t, ctx, srv, x)
	r.store(30, 0)
	if hits := r.check("stored"); hits == 0 {
		t.Fatal("nothing hit after the first stores")
	}
	// Fresh prompts of the world size 2 model stored by one rank of two:
	// neither a hit nor announced.
	before := len(r.prompts)
	r.store(3, 1)
	r.check("one rank of two")
	x.mu.Lock()
	for _, p := range r.prompts[before:] {
		for _, h := range r.hasher.Hashes(p.tokens) {
			if wh := kvevents.WireHash(h); x.known[p.g[0].Model()][wh] || x.storage[p.g[0].Model()][wh] {
				t.Errorf("a chunk one rank of two committed is announced")
			}
		}
	}
	x.mu.Unlock()
	r.store(120, 0) // about 500 chunks into a pool of 256: evictions
	var st kvEventsStatus
	httpjson.Get(t, srv.StatusURL(), &st)
	if st.Pool.Evictions == 0 {
		t.Errorf("no evictions under pressure: %+v", st)
	}
	r.check("evicted")
	// Workers unregister and register again: LOOKUP stops counting a
	// model's chunks when its last worker goes and counts them again when
	// one registers the layout again; the index follows.
	r.churn(8)
	if r.unregisters == 0 {
		t.Fatal("the churn unregistered nothing")
	}
	for i := range r.ws {
		for rank, d := range r.down[i] {
			if d {
				r.register(i, rank)
			}
		}
	}
	r.check("registered again")
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/clear-cache", srv.HTTPPort), "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if withTier {
		// The tier still holds every chunk: LOOKUP hits them there, and
		// the index holds them in STORAGE.
		if hits := r.check("L1 cleared"); hits == 0 {
			t.Errorf("no hits from the tier after a clear of L1")
		}
		req, _ := http.NewRequest(http.MethodDelete, fmt.Sprintf("http://127.0.0.1:%d/cache/objects?tier=all", srv.HTTPPort), nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if hits := r.check("cleared"); hits != 0 {
		t.Errorf("hits after a clear: %d", hits)
	}
	x.mu.Lock()
	for _, byModel := range []map[string]map[uint64]bool{x.known, x.storage} {
		for m, idx := range byModel {
			if len(idx) != 0 {
				t.Errorf("model %s: %d blocks still indexed after the clear", m, len(idx))
			}
		}
	}
	if withTier && x.storageSeen == 0 {
		t.Errorf("no STORAGE event seen with an fs tier written behind")
	}
	x.mu.Unlock()
	r.store(20, 0)
	r.check("stored again")
	httpjson.Get(t, srv.StatusURL(), &st)
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
	r.caughtUp("replay")
	y := &routerIndex{t: t, replay: x.replay, known: map[string]map[uint64]bool{}, storage: map[string]map[uint64]bool{}}
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := y.fill(^uint64(0)); err != nil {
		t.Fatal(err)
	}
	if y.next != x.next || len(y.broken) != 0 {
		t.Errorf("replay: next seq %d (live %d), broken %v", y.next, x.next, y.broken)
	}
	sameIndex(t, "replay", x, y)
	t.Logf("%d prompts, %d batches, %d gap replays, %d STORAGE events", len(r.prompts), st.KVEvents.NextSeq, x.replays, x.storageSeen)
}

// TestHostileKVEventsUnregister: an UNREGISTER kvdock does not act on
// removes nothing: one naming an instance never registered, and one
// naming a live worker's instance from another connection (refused while
// its holder is alive). Only the holder's own UNREGISTER of the model's
// last worker removes its chunks, each announced hash once; the other
// models' chunks stay.
func TestHostileKVEventsUnregister(t *testing.T) {
	ps := eventsPorts(t, 47245, 47260, 2)
	srv := harness.Start(t, eventsArgs(ps[0], ps[1])...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	x := subscribe(t, ctx, ps[0], ps[1], false)
	r := newEventsRun(t, ctx, srv, x)
	r.store(20, 0)
	if hits := r.check("stored"); hits == 0 {
		t.Fatal("nothing hit")
	}
	x.mu.Lock()
	_, removed := x.applied()
	x.mu.Unlock()
	w := r.ws[0][0]
	for _, id := range []int64{999999, w.InstanceID()} {
		// From the scheduler's connection: unknown, then foreign.
		if _, err := r.sched.C.Call(ctx, protocol.UnregisterKVCache, id); err != nil {
			t.Fatal(err)
		}
	}
	r.check("hostile unregisters")
	x.mu.Lock()
	_, after := x.applied()
	indexed := len(x.known[w.Model()])
	x.mu.Unlock()
	if after != removed || indexed == 0 {
		t.Fatalf("hostile unregisters removed %d blocks (model 0 indexes %d)", after-removed, indexed)
	}
	if err := w.Unregister(ctx); err != nil {
		t.Fatal(err)
	}
	r.down[0][0] = true
	r.check("unregistered by its holder") // fails on a removal not announced, or twice
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, gone := x.applied(); gone-after != indexed || len(x.known[w.Model()]) != 0 || len(x.known[r.ws[1][0].Model()]) == 0 {
		t.Fatalf("the holder's unregister removed %d blocks of the %d model 0 had; models indexed %d %d",
			gone-after, indexed, len(x.known[w.Model()]), len(x.known[r.ws[1][0].Model()]))
	}
}

// sameIndex fails t unless y indexes what x does, in every medium.
func sameIndex(t *testing.T, what string, x, y *routerIndex) {
	t.Helper()
	for _, pair := range [][2]map[string]map[uint64]bool{{x.known, y.known}, {x.storage, y.storage}} {
		for m, idx := range pair[0] {
			if len(pair[1][m]) != len(idx) {
				t.Errorf("%s: model %s: %d blocks indexed, want %d", what, m, len(pair[1][m]), len(idx))
			}
			for h := range idx {
				if !pair[1][m][h] {
					t.Errorf("%s: model %s lacks %x", what, m, h)
				}
			}
		}
	}
}

// TestKVEventsReannouncedAfterRestart: after a SIGUSR2 restart that adopts
// the pool, the new process's stream starts at seq 0 and its first batches
// re-announce the adopted usable set, parents first and only BlockStored:
// a router that comes up after the restart rebuilds from replay exactly
// the index it had before, which equals LOOKUP's hits; later stores and
// evictions go on from there with 0 divergence.
func TestKVEventsReannouncedAfterRestart(t *testing.T) {
	ps := eventsPorts(t, 47230, 47245, 2)
	pub, rep := ps[0], ps[1]
	srv := harness.StartKeeping(t, false, eventsArgs(pub, rep)...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := subscribe(t, ctx, pub, rep, false)
	r := newEventsRun(t, ctx, srv, before)
	r.store(40, 0)
	r.store(2, 1) // one rank of two: not announced, before or after
	if hits := r.check("before the restart"); hits == 0 {
		t.Fatal("nothing hit before the restart")
	}
	srv.RestartSignal(t)
	if rs := srv.LastRestart(t); !rs.Adopted {
		t.Fatalf("the pool was not adopted: %+v", rs)
	}
	// What the new process published before anything new happened: the
	// re-announcement alone.
	var st kvEventsStatus
	httpjson.Get(t, srv.StatusURL(), &st)
	after := subscribe(t, ctx, pub, rep, true)
	after.mu.Lock()
	stored, removed := after.applied()
	next := after.next
	after.mu.Unlock()
	if next == 0 || next != st.KVEvents.NextSeq || removed != 0 || stored == 0 {
		t.Fatalf("after the restart: replayed up to seq %d (kvdock at %d), %d stored and %d removed events\n%s",
			next, st.KVEvents.NextSeq, stored, removed, srv.Output())
	}
	before.mu.Lock()
	after.mu.Lock()
	sameIndex(t, "re-announced", before, after)
	after.mu.Unlock()
	before.mu.Unlock()
	r.x = after
	r.check("after the restart")
	r.store(100, 0) // past the pool: evictions of adopted chunks too
	r.check("stored after the restart")
	t.Logf("%d prompts, %d batches re-announced %d blocks", len(r.prompts), next, stored)
}

// TestKVEventsTierReannouncedAfterRestart: with an fs tier written behind
// and L1 evicting, a SIGUSR2 restart that adopts the pool re-announces the
// adopted L1 usable set for CPU and the values the tier still holds, which
// the new process adopts, for STORAGE, parents first: a router that comes
// up after the restart rebuilds from replay alone an index whose leading
// chunks held in CPU or STORAGE equal LOOKUP's hits for every prompt, with
// chunks only the tier holds among them; stores, unregisters and
// registrations again go on from there with 0 divergence.
func TestKVEventsTierReannouncedAfterRestart(t *testing.T) {
	t.Run("fs", func(t *testing.T) {
		kvEventsTierReannounced(t, fmt.Sprintf(`{"type": "fs", "base_path": %q, "max_capacity_gb": 1}`, t.TempDir()), nil)
	})
	// The resp tier adopts this host's share in the background: the
	// values it still holds are re-announced as its load reaches them.
	t.Run("resp", func(t *testing.T) {
		rs := redisserver.Start(t, redisserver.Options{})
		kvEventsTierReannounced(t, fmt.Sprintf(`{"type": "resp", "host": "127.0.0.1", "port": %d, "max_capacity_gb": 1}`, rs.Port),
			func(srv *harness.Server) {
				poll.Until(t, 30*time.Second, "the new process's share load ends", func() bool {
					return strings.Count(srv.Output(), "adopted this host's values of earlier runs") >= 2
				})
			})
	})
}

// kvEventsTierReannounced runs TestKVEventsTierReannouncedAfterRestart
// with the tier adapter; loaded, when set, waits after the restart until
// the tier adopted what it keeps.
func kvEventsTierReannounced(t *testing.T, adapter string, loaded func(*harness.Server)) {
	ps := eventsPorts(t, 47230, 47245, 2)
	pub, rep := ps[0], ps[1]
	args := append(eventsArgs(pub, rep), "--l2-adapter", adapter)
	srv := harness.StartKeeping(t, false, args...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := subscribe(t, ctx, pub, rep, false)
	r := newEventsRun(t, ctx, srv, before)
	r.store(120, 0) // about 500 chunks into a pool of 256: the tier keeps what L1 evicts
	if hits := r.check("before the restart"); hits == 0 {
		t.Fatal("nothing hit before the restart")
	}
	srv.RestartSignal(t)
	if rs := srv.LastRestart(t); !rs.Adopted {
		t.Fatalf("the pool was not adopted: %+v", rs)
	}
	if loaded != nil {
		loaded(srv)
	}
	after := subscribe(t, ctx, pub, rep, true)
	r.x = after
	hits := r.check("after the restart") // replay alone, then the stream
	after.mu.Lock()
	cpu, sto, tierOnly := 0, 0, 0
	for _, p := range r.prompts {
		for _, h := range r.hasher.Hashes(p.tokens) {
			wh := kvevents.WireHash(h)
			inCPU, inSto := after.known[p.g[0].Model()][wh], after.storage[p.g[0].Model()][wh]
			if inCPU {
				cpu++
			}
			if inSto {
				sto++
			}
			if inSto && !inCPU {
				tierOnly++
			}
		}
	}
	after.mu.Unlock()
	if hits == 0 || cpu == 0 || tierOnly == 0 {
		t.Fatalf("after the restart: %d hits, %d prompt chunks indexed in CPU, %d in STORAGE, %d in STORAGE alone\n%s",
			hits, cpu, sto, tierOnly, srv.Output())
	}
	r.store(20, 0)
	r.check("stored after the restart")
	r.churn(4)
	t.Logf("%d prompts, %d hits after the restart: %d prompt chunks indexed in CPU, %d in STORAGE (%d there alone)",
		len(r.prompts), hits, cpu, sto, tierOnly)
}

// eventsPorts returns n ports of [from, to) that libzmq can bind now. A
// ZMQ socket binds without SO_REUSEADDR, so a port whose connections a
// server closed in the last minute (TIME_WAIT) is refused to the next
// server; the probe binds the way it does, and the next port is tried.
func eventsPorts(t testing.TB, from, to, n int) []int {
	t.Helper()
	var out []int
	for p := from; p < to && len(out) < n; p++ {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		err = unix.Bind(fd, &unix.SockaddrInet4{Port: p, Addr: [4]byte{127, 0, 0, 1}})
		unix.Close(fd)
		if err == nil {
			out = append(out, p)
		}
	}
	if len(out) < n {
		t.Fatalf("%d of %d ports free in [%d, %d)", len(out), n, from, to)
	}
	return out
}
