package engine

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"kvdock/core/testkit/poll"
	"kvdock/core/tierstate"
	"kvdock/settings"
	"kvdock/transfer/tier"
	"kvdock/transfer/tier/memtier"
	"kvdock/transfer/worker"
)

// startTiered starts an engine whose l2 adapters are the given in-memory tiers.
func startTiered(t *testing.T, cfg settings.Config, mts ...*memtier.Tier) *Engine {
	t.Helper()
	return startTieredN(t, cfg, len(mts), mts...)
}

// startTieredN starts an engine with n adapters; its opener hands out mts
// in order (later opens, by an apply, take the rest).
func startTieredN(t *testing.T, cfg settings.Config, n int, mts ...*memtier.Tier) *Engine {
	t.Helper()
	cfg.L2.Adapters = nil
	for range n {
		cfg.L2.Adapters = append(cfg.L2.Adapters, settings.Adapter{Type: "mem"})
	}
	next := 0
	e := New(cfg, Options{TierOpeners: map[string]tier.Opener{
		"mem": func(context.Context, settings.Adapter, *slog.Logger) (tier.Backend, error) {
			if next >= len(mts) {
				return nil, errors.New("no test tier left")
			}
			m := mts[next]
			next++
			return m, nil
		},
	}})
	if err := e.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	return e
}

func tierWorker(t *testing.T, e *Engine, port int) (*worker.Worker, worker.Scheduler) {
	t.Helper()
	c := dial(t, port, e.cfg.Server.Protocol)
	w, err := worker.Register(context.Background(), c, worker.Config{
		InstanceID: 1, Model: "org/m", WorldSize: 1, Layers: 2, Hidden: 8, Dtype: "float16",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return w, worker.Scheduler{C: c, Patience: 10 * time.Second}
}

func chunkData(w *worker.Worker, n int, seed byte) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		b := make([]byte, w.Layout().Bytes)
		for j := range b {
			b[j] = byte(j*31) + seed + byte(i)
		}
		out[i] = b
	}
	return out
}

func tokensFor(w *worker.Worker, chunks int, base uint32) []uint32 {
	ts := make([]uint32, chunks*w.ChunkTokens())
	for i := range ts {
		ts[i] = base + uint32(i)
	}
	return ts
}

// Over the wire: store → the chunks reach the tier → clear L1 → LOOKUP
// reports them from the tier → retrieve gives identical bytes.
func TestTierStoreClearLookupRetrieve(t *testing.T) {
	cfg, _ := testConfig(t)
	mt := memtier.New()
	e := startTiered(t, cfg, mt)
	w, sched := tierWorker(t, e, cfg.Server.Port)
	ctx := context.Background()
	toks := tokensFor(w, 3, 1000)
	data := chunkData(w, 3, 7)
	if res, err := w.Store(ctx, w.Key(toks, 3, "s"), data); err != nil || !res.Committed {
		t.Fatalf("store: %+v %v", res, err)
	}
	poll.Until(t, 10*time.Second, "3 chunks in the tier", func() bool { return len(mt.Values()) == 3 })
	if c, err := e.ClearCache(ClearByCtl); err != nil || c.Objects != 3 {
		t.Fatalf("clear: %+v %v", c, err)
	}
	hits, err := sched.Hits(ctx, w.LookupKey(toks, "r"), 1)
	if err != nil || hits != 3 {
		t.Fatalf("LOOKUP after clear = %d, %v; want 3 from the tier", hits, err)
	}
	var got [][]byte
	n, err := w.Retrieve(ctx, w.Key(toks, 3, "r"), func(i int, b []byte) { got = append(got, bytes.Clone(b)) })
	if err != nil || n != 3 {
		t.Fatalf("retrieve = %d, %v", n, err)
	}
	for i := range data {
		if !bytes.Equal(got[i], data[i]) {
			t.Fatalf("chunk %d: retrieved bytes differ from the stored ones", i)
		}
	}
	st := e.Snapshot().Tiers
	if len(st) != 1 || st[0].Loads != 3 || st[0].Type != "mem" || st[0].State != tierstate.Up {
		t.Fatalf("snapshot tiers %+v", st)
	}
	if st := e.Snapshot().Lookup; st.TierHitChunks != 3 {
		t.Fatalf("lookup stats %+v", st)
	}
}

// A hung tier: LOOKUP still answers the L1 hits, within the load timeout.
func TestTierHungLookupAnswersL1Hits(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg.L2.LoadTimeoutSeconds = 0.3
	mt := memtier.New()
	e := startTiered(t, cfg, mt)
	w, sched := tierWorker(t, e, cfg.Server.Port)
	ctx := context.Background()
	toks := tokensFor(w, 3, 5000)
	data := chunkData(w, 3, 1)
	if _, err := w.Store(ctx, w.Key(toks, 3, "s"), data); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "3 chunks in the tier", func() bool { return len(mt.Values()) == 3 })
	if _, err := e.ClearCache(ClearByCtl); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Store(ctx, w.Key(toks, 1, "s2"), data[:1]); err != nil { // chunk 0 back in L1
		t.Fatal(err)
	}
	mt.Block()
	defer mt.Unblock()
	start := time.Now()
	hits, err := sched.Hits(ctx, w.LookupKey(toks, "r"), 1)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("LOOKUP over a hung tier took %v (load timeout 0.3 s)", took)
	}
	if err != nil || hits != 1 {
		t.Fatalf("LOOKUP = %d, %v; want the 1 L1 hit", hits, err)
	}
	if st := e.Snapshot().Tiers[0]; st.LoadTimeouts == 0 && st.Loads != 0 {
		t.Fatalf("tier stats %+v", st)
	}
}

// Tier state changes reach the events pane, with the reason.
func TestTierStateEvents(t *testing.T) {
	cfg, _ := testConfig(t)
	mt := memtier.New()
	e := startTiered(t, cfg, mt)
	mt.SetDown("connection refused")
	poll.Until(t, 10*time.Second, "a tier-down event", func() bool {
		return strings.Contains(lastEvent(e, "tier 0"), "down (connection refused)")
	})

	mt.SetDown("")
	poll.Until(t, 10*time.Second, "a tier-up event", func() bool { return strings.HasSuffix(lastEvent(e, "tier 0"), "is up") })
}

// A store while the queue is off (store_policy none) writes nothing.
func TestTierStorePolicyNone(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg.L2.StorePolicy = tier.StoreNone
	mt := memtier.New()
	e := startTiered(t, cfg, mt)
	w, _ := tierWorker(t, e, cfg.Server.Port)
	if _, err := w.Store(context.Background(), w.Key(tokensFor(w, 2, 9), 2, "s"), chunkData(w, 2, 3)); err != nil {
		t.Fatal(err)
	}
	if err := e.Stop(context.Background()); err != nil { // drains the workers
		t.Fatal(err)
	}
	if n := mt.Puts(); n != 0 {
		t.Fatalf("%d tier writes with store_policy none", n)
	}
}

// Stop closes the backends; a restart that changes l2 swaps them and keeps the pool.
func TestTierClosedOnStopAndSwappedOnApply(t *testing.T) {
	cfg, _ := testConfig(t)
	a, b, c := memtier.New(), memtier.New(), memtier.New()
	e := startTieredN(t, cfg, 2, a, b, c)
	if len(e.Snapshot().Tiers) != 2 {
		t.Fatal("two tiers expected")
	}
	e.mu.Lock()
	cfg2 := e.cfg
	cfg2.L2.Adapters = cfg2.L2.Adapters[:1]
	e.applyTiersLocked(cfg2.L2)
	e.mu.Unlock()
	if got := len(e.Snapshot().Tiers); got != 1 {
		t.Fatalf("%d tiers after the swap, want 1", got)
	}
	for i, m := range []*memtier.Tier{a, b} {
		if err := m.Put(context.Background(), "k", nil); err == nil {
			t.Fatalf("swapped-out backend %d was not closed", i)
		}
	}
	if err := e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(context.Background(), "k", nil); err == nil {
		t.Fatal("Stop did not close the backend")
	}
}

// Stop while a lookup's tier phase hangs on a tier: the phase ends, the
// backends close, Stop returns.
func TestTierStopDuringHungPrefetch(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg.L2.LoadTimeoutSeconds = 60 // only Stop can end the phase
	mt := memtier.New()
	e := startTiered(t, cfg, mt)
	w, sched := tierWorker(t, e, cfg.Server.Port)
	ctx := context.Background()
	toks := tokensFor(w, 2, 77)
	if _, err := w.Store(ctx, w.Key(toks, 2, "s"), chunkData(w, 2, 5)); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "2 chunks in the tier", func() bool { return len(mt.Values()) == 2 })
	if _, err := e.ClearCache(ClearByCtl); err != nil {
		t.Fatal(err)
	}
	entered := mt.Entered(8)
	mt.Block()
	if err := sched.Lookup(ctx, w.LookupKey(toks, "r"), 1); err != nil {
		t.Fatal(err)
	}
	<-entered // the tier phase is inside the tier
	if _, done, err := sched.PrefetchStatus(ctx, "r"); err != nil || done {
		t.Fatalf("status while the tier hangs: done %v, %v; want None", done, err)
	}
	start := time.Now()
	if err := e.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Stop took %v with a hung tier phase", took)
	}
}

// L1 over-subscribed (four prompts of 3/8 of the pool each): every prompt
// is still retrievable, evicted ones from the tier, with identical bytes.
func TestTierEvictedChunksComeBackFromTier(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg.L1.SizeGB = 1.0 / 1024 // 1 MiB: 64 chunks of 16 KiB
	mt := memtier.New()
	e := startTiered(t, cfg, mt)
	w, sched := tierWorker(t, e, cfg.Server.Port)
	ctx := context.Background()
	const prompts, chunks = 4, 24
	var toks [prompts][]uint32
	var data [prompts][][]byte
	for p := range prompts {
		toks[p] = tokensFor(w, chunks, uint32(100000*(p+1)))
		data[p] = chunkData(w, chunks, byte(40*p))
		if res, err := w.Store(ctx, w.Key(toks[p], chunks, "s"), data[p]); err != nil || !res.Committed {
			t.Fatalf("store %d: %+v %v", p, res, err)
		}
		// Write-behind copies a chunk while it is in L1; the test waits so
		// that the next prompt's eviction finds it in the tier.
		poll.Until(t, 10*time.Second, "the prompt in the tier", func() bool { return len(mt.Values()) == (p+1)*chunks })
	}
	if st := e.Snapshot().Pool; st.Evictions == 0 {
		t.Fatalf("nothing was evicted: %+v", st.Stats)
	}
	for p := range prompts {
		req := "r" + string(rune('a'+p))
		hits, err := sched.Hits(ctx, w.LookupKey(toks[p], req), 1)
		if err != nil || hits != chunks {
			t.Fatalf("prompt %d: LOOKUP = %d, %v; want %d", p, hits, err, chunks)
		}
		var got [][]byte
		n, err := w.Retrieve(ctx, w.Key(toks[p], chunks, req), func(i int, b []byte) { got = append(got, bytes.Clone(b)) })
		if err != nil || n != chunks {
			t.Fatalf("prompt %d: retrieve = %d, %v", p, n, err)
		}
		for i := range got {
			if !bytes.Equal(got[i], data[p][i]) {
				t.Fatalf("prompt %d chunk %d: wrong bytes", p, i)
			}
		}
		if err := sched.EndSession(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if st := e.Snapshot().Tiers[0]; st.Loads == 0 || st.Corrupt != 0 {
		t.Fatalf("tier %+v", st)
	}
}
