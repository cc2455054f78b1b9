package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"kvdock/core/layout"
	"kvdock/core/protocol"
	"kvdock/core/testkit/poll"
	"kvdock/core/testkit/promseries"
	"kvdock/core/testkit/redisserver"
	"kvdock/tests/harness"
	"kvdock/transfer/tier"
	"kvdock/transfer/tier/resp"
	"kvdock/transfer/worker"
	"kvdock/ui/httpapi"
)

// The tier fault tests, against the real
// binary: each ends with 0 wrong bytes and kvdock still serving.

func tierAdapter(t *testing.T, a map[string]any) string {
	t.Helper()
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tier0 is the first tier of srv's /status.
func tier0(t *testing.T, srv *harness.Server) httpapi.TierStatus {
	t.Helper()
	st := srv.Status(t)
	if len(st.Tiers) != 1 {
		t.Fatalf("/status tiers: %+v", st.Tiers)
	}
	return st.Tiers[0]
}

// waitTierIdle waits until srv's tier queue is empty (everything queued is
// written, failed or dropped).
func waitTierIdle(t *testing.T, srv *harness.Server) {
	t.Helper()
	poll.Until(t, 30*time.Second, "tier queue empty", func() bool { return tier0(t, srv).QueueDepth == 0 })
}

// tierWorker registers a Go worker of model with hidden size h (chunk bytes
// follow) on a fresh connection to srv.
func tierWorker(t *testing.T, srv *harness.Server, id int64, model string, h int) *harness.GoWorker {
	t.Helper()
	c := srv.Dial(t, "nongpu-v1")
	wk, err := worker.Register(context.Background(), c, worker.Config{
		InstanceID: id, Model: model, Layers: harness.WorkerLayers, Hidden: h, Dtype: "float32",
	})
	if err != nil {
		t.Fatal(err)
	}
	w := &harness.GoWorker{W: wk, C: c, ID: id, Model: model, Chunk: wk.ChunkTokens(),
		ChunkBytes: int(wk.Layout().Bytes), Shm: wk.Segment(), SegName: wk.ShmName(), PoolSize: wk.PoolSize()}
	t.Cleanup(w.Close)
	return w
}

// promptOf is prompt seed's tokens and data, n chunks.
func promptOf(w *harness.GoWorker, seed, n int) ([]uint32, [][]byte) {
	toks := harness.Tokens(seed, n, w.Chunk)
	data := make([][]byte, n)
	for i := range data {
		data[i] = harness.ChunkData(seed, i, w.ChunkBytes)
	}
	return toks, data
}

// storePrompt stores prompt seed (n chunks), failing the test on an error.
func storePrompt(t *testing.T, w *harness.GoWorker, seed, n int) {
	t.Helper()
	toks, data := promptOf(w, seed, n)
	if _, err := w.Store(context.Background(), toks, data, fmt.Sprintf("s-%d", seed)); err != nil {
		t.Fatalf("store prompt %d: %v", seed, err)
	}
}

// checkPrompt looks prompt seed up and retrieves its hit prefix; it returns
// the chunks with the right bytes and the ones with wrong bytes.
func checkPrompt(t *testing.T, w *harness.GoWorker, seed, n int) (good, wrong int) {
	t.Helper()
	good, wrong, err := tryPrompt(context.Background(), w, seed, n)
	if err != nil {
		t.Fatal(err)
	}
	return good, wrong
}

// tryPrompt is checkPrompt for goroutines other than the test's.
func tryPrompt(ctx context.Context, w *harness.GoWorker, seed, n int) (good, wrong int, err error) {
	toks, data := promptOf(w, seed, n)
	req := fmt.Sprintf("c-%d-%d", seed, time.Now().UnixNano())
	hits, err := harness.LookupKeep(ctx, w.C, w.Model, toks, req)
	if err != nil {
		return 0, 0, fmt.Errorf("lookup prompt %d: %w", seed, err)
	}
	defer func() { _, _ = w.C.Call(ctx, protocol.EndSession, req) }()
	if hits == 0 {
		return 0, 0, nil
	}
	var got [][]byte
	if _, err := w.Worker().Retrieve(ctx, w.Key(toks, hits, req), func(_ int, chunk []byte) {
		got = append(got, bytes.Clone(chunk))
	}); err != nil {
		return 0, 0, fmt.Errorf("retrieve prompt %d: %w", seed, err)
	}
	for i, g := range got {
		if bytes.Equal(g, data[i]) {
			good++
		} else {
			wrong++
		}
	}
	return good, wrong, nil
}

// stillServing stores and reads back a fresh prompt through L1.
func stillServing(t *testing.T, w *harness.GoWorker, seed int) {
	t.Helper()
	storePrompt(t, w, seed, 2)
	if good, wrong := checkPrompt(t, w, seed, 2); good != 2 || wrong != 0 {
		t.Fatalf("kvdock not serving L1: %d good, %d wrong of 2", good, wrong)
	}
}

// TestTierRESPServerKilledAndRestarted: redis-server is SIGKILLed while
// workers store and read; the tier goes down with the reason, lookups of
// chunks only the tier could have do not hang, L1 keeps serving the right
// bytes, and after redis-server is back the tier comes up by itself and
// takes writes again.
func TestTierRESPServerKilledAndRestarted(t *testing.T) {
	r := redisserver.Start(t, redisserver.Options{})
	srv := harness.Start(t, "--chunk-size", "16", "--l2-adapter",
		tierAdapter(t, map[string]any{"type": "resp", "host": "127.0.0.1", "port": r.Port}))
	w := tierWorker(t, srv, 1, "resp-kill", harness.WorkerHidden)
	for seed := range 5 {
		storePrompt(t, w, seed, 2)
	}
	waitTierIdle(t, srv)
	if n := len(redisKeys(t, r)); n != 10 {
		t.Fatalf("redis holds %d chunks, want 10", n)
	}

	// Traffic on a second worker while redis-server dies under it.
	tw := tierWorker(t, srv, 2, "resp-kill", harness.WorkerHidden)
	var wrong, good atomic.Int64
	stop := make(chan struct{})
	traffic := make(chan error, 1)
	go func() {
		traffic <- func() error {
			ctx := context.Background()
			for seed := 100; ; seed++ {
				select {
				case <-stop:
					return nil
				default:
				}
				toks, data := promptOf(tw, seed, 2)
				if _, err := tw.Store(ctx, toks, data, fmt.Sprintf("s-%d", seed)); err != nil {
					return fmt.Errorf("store prompt %d: %w", seed, err)
				}
				g, b, err := tryPrompt(ctx, tw, seed, 2)
				if err != nil {
					return err
				}
				good.Add(int64(g))
				wrong.Add(int64(b))
			}
		}()
	}()
	r.Kill()
	poll.Until(t, 15*time.Second, "resp tier down", func() bool { return tier0(t, srv).State == "down" })
	down := tier0(t, srv)
	if down.Reason == "" {
		t.Fatalf("tier down without a reason: %+v", down)
	}
	// A prompt never stored: the tier is down, the lookup answers 0 hits
	// well within the load timeout (2 s).
	start := time.Now()
	if h, err := harness.Lookup(context.Background(), w.C, w.Model, harness.Tokens(999, 2, w.Chunk), "never"); err != nil || h != 0 {
		t.Fatalf("lookup with the tier down: %d hits, %v", h, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("lookup with the tier down took %v", d)
	}
	stillServing(t, w, 200)

	r.Restart()
	poll.Until(t, 30*time.Second, "resp tier up again", func() bool { return tier0(t, srv).State == "up" })
	close(stop)
	if err := <-traffic; err != nil {
		t.Fatalf("traffic across the kill: %v", err)
	}
	if wrong.Load() != 0 || good.Load() == 0 {
		t.Fatalf("traffic across the kill: %d good, %d wrong chunks", good.Load(), wrong.Load())
	}
	// Writes reach the restarted (empty) server again.
	storePrompt(t, w, 300, 2)
	waitTierIdle(t, srv)
	if n, err := r.Do(t.Context(), "DBSIZE"); err != nil || n == "0" {
		t.Fatalf("redis holds %q keys (%v) after the tier came back: writes do not reach it", n, err)
	}
	stillServing(t, w, 301)
	// The events pane tells the story: down with the reason, then up (the
	// watcher reports within a tick of /status).
	poll.Until(t, 10*time.Second, "tier down and up again in the events", func() bool {
		var sawDown, sawUp bool
		for _, e := range srv.Status(t).Events {
			if e.Kind == "tier" {
				sawDown = sawDown || strings.Contains(e.Message, "is down (")
				sawUp = sawUp || (sawDown && strings.Contains(e.Message, "is up"))
			}
		}
		return sawUp
	})

	t.Logf("down reason: %q; traffic: %d good chunks", down.Reason, good.Load())
}

// TestTierFSCorruptFileIsAMiss: a byte flipped by hand in each chunk file
// (payload end, middle, header) makes each chunk a miss, counted as
// corrupt, never served; the files are removed.
func TestTierFSCorruptFileIsAMiss(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--chunk-size", "16", "--l2-adapter",
		tierAdapter(t, map[string]any{"type": "fs", "base_path": dir, "max_capacity_gb": 1})}
	a := harness.Start(t, args...)
	w := tierWorker(t, a, 1, "fs-corrupt", harness.WorkerHidden)
	for seed := range 3 {
		storePrompt(t, w, seed, 1)
	}
	waitTierIdle(t, a)
	a.Stop(t)

	files := chunkFiles(t, dir)
	if len(files) != 3 {
		t.Fatalf("%d chunk files, want 3: %v", len(files), files)
	}
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		at := []int{len(b) - 1, len(b) / 2, 5}[i]
		b[at] ^= 0x40
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	b := harness.Start(t, args...)
	w = tierWorker(t, b, 1, "fs-corrupt", harness.WorkerHidden)
	for seed := range 3 {
		if good, wrong := checkPrompt(t, w, seed, 1); good != 0 || wrong != 0 {
			t.Fatalf("corrupt prompt %d: %d good, %d wrong chunks served", seed, good, wrong)
		}
	}
	ts := tier0(t, b)
	if ts.Corrupt != 3 {
		t.Fatalf("corrupt count %d, want 3: %+v", ts.Corrupt, ts)
	}
	if left := chunkFiles(t, dir); len(left) != 0 {
		t.Errorf("corrupt files left in the tier: %v", left)
	}
	stillServing(t, w, 10)
}

// chunkFiles lists the fs tier's chunk files (shard directories, no lock,
// no staged writes).
func chunkFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	shards, err := filepath.Glob(filepath.Join(dir, "[0-9a-f][0-9a-f]", "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range shards {
		if !strings.HasPrefix(filepath.Base(f), ".") {
			out = append(out, f)
		}
	}
	return out
}

// TestTierRESPTwoLayoutsShareOneRedis: two hosts register the same model
// name with other layouts (hidden 16 and 32, the same chunk size) and store
// the same prompt into one redis. Their keys differ by the layout
// fingerprint, so both hosts' values survive side by side, and a fresh host
// of either layout gets hits with its own bytes, nothing rejected.
func TestTierRESPTwoLayoutsShareOneRedis(t *testing.T) {
	r := redisserver.Start(t, redisserver.Options{})
	args := []string{"--chunk-size", "16", "--l2-adapter",
		tierAdapter(t, map[string]any{"type": "resp", "host": "127.0.0.1", "port": r.Port})}
	for _, h := range []int{harness.WorkerHidden, 2 * harness.WorkerHidden} {
		srv := harness.Start(t, args...)
		w := tierWorker(t, srv, 1, "resp-layouts", h)
		storePrompt(t, w, 1, 2) // the same tokens and model for both
		waitTierIdle(t, srv)
	}
	if n := len(redisKeys(t, r)); n != 4 {
		t.Fatalf("redis holds %d chunks, want 4: the two layouts overwrote each other", n)
	}
	for _, h := range []int{harness.WorkerHidden, 2 * harness.WorkerHidden} {
		srv := harness.Start(t, args...)
		w := tierWorker(t, srv, 1, "resp-layouts", h)
		if good, wrong := checkPrompt(t, w, 1, 2); good != 2 || wrong != 0 {
			t.Fatalf("hidden %d: %d good, %d wrong of 2 chunks from the shared tier", h, good, wrong)
		}
		if ts := tier0(t, srv); ts.Corrupt != 0 || ts.Hits != 2 {
			t.Fatalf("hidden %d: tier %+v, want 2 hits and nothing corrupt", h, ts)
		}
	}
	if n := len(redisKeys(t, r)); n != 4 {
		t.Fatalf("redis holds %d chunks after the reads, want 4", n)
	}
}

// TestTierRESPForeignLayoutIsAMiss: under the real redis keys of a stored
// prompt, one value is replaced by hand with an intact value of another
// layout (hidden 32 instead of 16, encoded under our key) and one value has
// its last payload byte flipped (SETRANGE). A host with the first layout
// serves neither and counts both as corrupt; it deletes the flipped value
// (damaged under our key: ours) and leaves the foreign one (not ours).
func TestTierRESPForeignLayoutIsAMiss(t *testing.T) {
	r := redisserver.Start(t, redisserver.Options{})
	args := []string{"--chunk-size", "16", "--l2-adapter",
		tierAdapter(t, map[string]any{"type": "resp", "host": "127.0.0.1", "port": r.Port})}
	own := harness.Start(t, args...)
	ow := tierWorker(t, own, 1, "resp-foreign", harness.WorkerHidden)
	storePrompt(t, ow, 3, 2)
	waitTierIdle(t, own)
	stored := redisKeys(t, r)
	if len(stored) != 2 {
		t.Fatalf("redis holds %v, want prompt 3's 2 keys", stored)
	}
	var forged, flipped string
	for k := range stored {
		if forged == "" {
			forged = k
		} else {
			flipped = k
		}
	}

	// The foreign value: another layout's tensor, header and checksum
	// intact, under our real key.
	lay := ow.W.Layout()
	other, err := layout.New(harness.WorkerLayers, ow.Chunk, 2*harness.WorkerHidden, lay.Dtype, false)
	if err != nil {
		t.Fatal(err)
	}
	name, ok := strings.CutPrefix(forged, resp.DefaultKeyPrefix)
	if !ok {
		t.Fatalf("redis key %q lacks the prefix %q", forged, resp.DefaultKeyPrefix)
	}
	if want := "@" + tier.Fingerprint(lay); !strings.Contains(name, want) {
		t.Fatalf("tier key %q does not carry the layout fingerprint %s", name, want)
	}
	foreign, err := tier.Encode(name, other, bytes.Repeat([]byte{0x5A}, int(other.Bytes)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Do(t.Context(), "SET", forged, string(foreign)); err != nil {
		t.Fatal(err)
	}
	n, err := r.Do(t.Context(), "STRLEN", flipped)
	if err != nil {
		t.Fatal(err)
	}
	last, err := r.Do(t.Context(), "GETRANGE", flipped, "-1", "-1")
	if err != nil || len(last) != 1 {
		t.Fatalf("GETRANGE %s: %q %v", flipped, last, err)
	}
	at, _ := strconv.Atoi(n)
	if _, err := r.Do(t.Context(), "SETRANGE", flipped, strconv.Itoa(at-1), string([]byte{last[0] ^ 0x01})); err != nil {
		t.Fatal(err)
	}

	reader := harness.Start(t, args...)
	rw := tierWorker(t, reader, 1, "resp-foreign", harness.WorkerHidden)
	if good, wrong := checkPrompt(t, rw, 3, 2); good != 0 || wrong != 0 {
		t.Fatalf("forged and flipped values: %d good, %d wrong chunks served", good, wrong)
	}
	// Both chunks' loads run (the lookup loads a prefix's chunks at once).
	if ts := tier0(t, reader); ts.Corrupt != 2 || ts.Hits != 0 {
		t.Fatalf("tier %+v, want the 2 values counted as corrupt and no hit", ts)
	}
	left := redisKeys(t, r)
	if left[flipped] {
		t.Fatalf("the flipped value (ours, damaged) was not deleted: %v", left)
	}
	if got, err := r.Do(t.Context(), "GET", forged); err != nil || got != string(foreign) {
		t.Fatalf("the foreign value (intact, not ours) was deleted or changed: %v", err)
	}
	stillServing(t, rw, 2)
}

// redisKeys lists r's keys (redis-cli --scan).
func redisKeys(t *testing.T, r *redisserver.Server) map[string]bool {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "redis-cli", "-p", strconv.Itoa(r.Port), "--scan").Output()
	if err != nil {
		t.Fatalf("redis-cli --scan: %v", err)
	}
	keys := map[string]bool{}
	for _, k := range strings.Fields(string(out)) {
		// The tier's list of its own values (its share) holds no chunk.
		if !strings.Contains(k, "kvdock:index:") {
			keys[k] = true
		}
	}
	return keys
}

// TestTierKvdockKilledDuringWrites: kvdock is SIGKILLed while a worker
// streams stores and its fs tier writes them; the restarted kvdock (same
// base_path: the lock died with the process) serves only whole chunks with
// the right bytes, and no staged write is left behind.
func TestTierKvdockKilledDuringWrites(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--chunk-size", "256", "--l2-adapter",
		tierAdapter(t, map[string]any{"type": "fs", "base_path": dir, "max_capacity_gb": 1})}
	a := harness.Start(t, args...)
	const h, n = 256, 4 // 512 KiB chunks, 2 MiB prompts
	w := tierWorker(t, a, 1, "fs-kill", h)
	// The stores run until the kill breaks the connection: prompts
	// 0..stored-1 were acknowledged.
	var stored atomic.Int64
	storing := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		defer close(storing)
		for seed := 0; seed < 200; seed++ {
			toks, data := promptOf(w, seed, n)
			if _, err := w.Store(ctx, toks, data, fmt.Sprintf("s-%d", seed)); err != nil {
				return
			}
			stored.Add(1)
		}
	}()
	// Kill once chunks are in the tier and more are queued behind them.
	var before httpapi.TierStatus
	poll.Until(t, 30*time.Second, "tier writes under way", func() bool {
		before = tier0(t, a)
		return before.Objects >= 4 && before.QueueDepth > 0
	})

	a.Kill()
	cancel() // the store in flight has no server to answer it
	<-storing
	staged, _ := filepath.Glob(filepath.Join(dir, "*", ".kvdock-tmp-*"))
	t.Logf("killed after %d prompts stored, %d chunks in the tier, %d queued, %d staged writes", stored.Load(), before.Objects, before.QueueDepth, len(staged))

	b := harness.Start(t, args...)
	w = tierWorker(t, b, 1, "fs-kill", h)
	var good, wrong int
	for seed := range int(stored.Load()) + 1 {
		g, bad := checkPrompt(t, w, seed, n)
		good += g
		wrong += bad
	}
	if wrong != 0 {
		t.Fatalf("after the kill: %d wrong chunks served (%d good)", wrong, good)
	}
	ts := tier0(t, b)
	// A chunk written after an unwritten one of its prompt is not a prefix
	// hit, so good may be a little under what the tier holds.
	if good == 0 || int64(good) > ts.Objects || ts.Loads == 0 || ts.Corrupt != 0 {
		t.Fatalf("after the kill: %d good chunks (%d were in the tier before it), tier %+v", good, before.Objects, ts)
	}
	if staged, _ := filepath.Glob(filepath.Join(dir, "*", ".kvdock-tmp-*")); len(staged) != 0 {
		t.Errorf("staged writes left after the restart: %v", staged)
	}
	stillServing(t, w, 500)
	t.Logf("after the kill: %d chunks back from the tier, all whole", good)
}

// TestTierFSFilesystemFull: the fs tier's filesystem (a 4 MiB tmpfs) fills
// up; writes beyond it are dropped and counted, the tier says why, and L1
// keeps every chunk with the right bytes.
func TestTierFSFilesystemFull(t *testing.T) {
	if os.Geteuid() != 0 {
		msg := "mounting a tmpfs needs root"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	srv := harness.Start(t, "--chunk-size", "256", "--l2-adapter",
		tierAdapter(t, map[string]any{"type": "fs", "base_path": dir, "max_capacity_gb": 1}))
	const h, prompts, n = 64, 16, 2 // 128 KiB chunks: 4 MiB in all, more than fits with the directories
	w := tierWorker(t, srv, 1, "fs-full", h)
	for seed := range prompts {
		storePrompt(t, w, seed, n)
	}
	waitTierIdle(t, srv)
	ts := tier0(t, srv)
	if ts.DroppedWrites == 0 {
		t.Fatalf("filesystem full but no write counted as dropped: %+v", ts)
	}
	if ts.State == "up" || ts.Reason == "" {
		t.Errorf("filesystem full but the tier says %q (%q)", ts.State, ts.Reason)
	}
	for seed := range prompts {
		if good, wrong := checkPrompt(t, w, seed, n); good != n || wrong != 0 {
			t.Fatalf("L1 after the tier filled: prompt %d: %d good, %d wrong of %d", seed, good, wrong, n)
		}
	}
	stillServing(t, w, 100)
	waitTierIdle(t, srv)
	ts = tier0(t, srv)
	if v := promseries.Value(t, promseries.Scrape(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", srv.HTTPPort)), "kvdock_tier_dropped_writes_total", "index", "0", "type", "fs"); v != float64(ts.DroppedWrites) {
		t.Errorf("/metrics dropped writes %v, /status %d", v, ts.DroppedWrites)
	}
	poll.Until(t, 10*time.Second, "the fs tier's degraded state in the events", func() bool {
		for _, e := range srv.Status(t).Events {
			if e.Kind == "tier" && strings.Contains(e.Message, "is degraded (no space left") {
				return true
			}
		}
		return false
	})

	t.Logf("full tier: %d objects, %d dropped writes, %s (%s)", ts.Objects, ts.DroppedWrites, ts.State, ts.Reason)
}
