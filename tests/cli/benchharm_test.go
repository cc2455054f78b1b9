package cli

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"kvdock/core/rpc/client"
	"kvdock/core/testkit/poll"
	"kvdock/core/testkit/redisserver"
	"kvdock/tests/harness"
	"kvdock/transfer/worker"
)

// liveDoc is the part of /status a benchmark could leave behind.
type liveDoc struct {
	ActiveSessions int     `json:"active_sessions"`
	Instances      []int64 `json:"registered_non_cuda_instance_ids"`
	Pool           struct {
		Objects     int    `json:"objects"`
		WriteLocked int    `json:"write_locked"`
		ReadLocked  int    `json:"read_locked"`
		LockedBytes int64  `json:"locked_bytes"`
		LockOwners  int    `json:"lock_owners"`
		Doomed      int    `json:"doomed_objects"`
		Evictions   uint64 `json:"evictions"`
		BenchBytes  int64  `json:"bench_bytes"`
	} `json:"pool"`
	Tiers []struct {
		Type       string `json:"type"`
		Objects    int64  `json:"objects"`
		QueueDepth int    `json:"queue_depth"`
		Loads      uint64 `json:"loads"`
	} `json:"tiers"`
}

func liveStatus(t *testing.T, httpPort int) liveDoc {
	t.Helper()
	res, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/status", httpPort))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var d liveDoc
	if err := json.NewDecoder(res.Body).Decode(&d); err != nil {
		t.Fatal(err)
	}
	return d
}

// realWorker is a worker of a real model with its prompts, stored once.
type realWorker struct {
	wk      *worker.Worker
	sched   worker.Scheduler
	prompts [][]uint32
	chunks  int // per prompt
	data    func(p, c int) []byte
}

// hits looks every prompt up and retrieves its hit chunks, checking each
// against what was stored; it returns the hit chunks per prompt and ends
// each session (as a worker does: nothing stays locked).
func (r *realWorker) hits(t *testing.T) []int {
	t.Helper()
	ctx := context.Background()
	out := make([]int, len(r.prompts))
	for p, toks := range r.prompts {
		id := fmt.Sprintf("check-%d-%d", p, time.Now().UnixNano())
		h, err := r.sched.Hits(ctx, r.wk.LookupKey(toks, id), 1)
		if err != nil {
			t.Fatalf("lookup of prompt %d: %v", p, err)
		}
		if h > 0 {
			got, err := r.wk.Retrieve(ctx, r.wk.Key(toks, h, id), func(c int, chunk []byte) {
				if string(chunk) != string(r.data(p, c)) {
					t.Errorf("prompt %d chunk %d: other bytes than stored", p, c)
				}
			})
			if err != nil || got != h {
				t.Fatalf("retrieve of prompt %d: %d of %d chunks, %v", p, got, h, err)
			}
		}
		if err := r.sched.EndSession(ctx, id); err != nil {
			t.Fatal(err)
		}
		out[p] = h
	}
	return out
}

// fsObjects is every file under dir with a digest of its bytes.
func fsObjects(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	m := map[string][32]byte{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		m[path] = sha256.Sum256(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// redisObjects is every key of the server with a digest of its value.
func redisObjects(t *testing.T, addr string) map[string][32]byte {
	t.Helper()
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	names, err := c.Do(ctx, c.B().Keys().Pattern("*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string][32]byte{}
	for _, k := range names {
		// DUMP: a value of any type (chunks are strings, the tier's index
		// is not), serialized.
		v, err := c.Do(ctx, c.B().Dump().Key(k).Build()).AsBytes()
		if err != nil {
			t.Fatalf("DUMP %q: %v", k, err)
		}
		m[k] = sha256.Sum256(v)
	}
	return m
}

func sameObjects(a, b map[string][32]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// newRealWorker registers a worker of a real model (128 KiB chunks: 2 ×
// 2 layers × 16 tokens × 1024 × 2 bytes) and stores prompts of chunks
// chunks each, ending each request's session.
func newRealWorker(t *testing.T, srv *harness.Server, prompts, chunks int) *realWorker {
	t.Helper()
	c, err := client.Dial(srv.Endpoint, harness.Profile(t, srv.Protocol), client.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	wk, err := worker.Register(ctx, c, worker.Config{InstanceID: 11, Model: "real-model", Layers: 2, Hidden: 1024, Dtype: "float16"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = wk.Close() })
	rw := &realWorker{wk: wk, sched: worker.Scheduler{C: c, Poll: time.Millisecond, Patience: 10 * time.Second}, chunks: chunks}
	size := int(wk.Layout().Bytes)
	rw.data = func(p, ch int) []byte {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(p*31 + ch*7 + i/4096)
		}
		return b
	}
	for p := range prompts {
		toks := make([]uint32, rw.chunks*wk.ChunkTokens())
		for i := range toks {
			toks[i] = uint32(100000*p + i + 1)
		}
		rw.prompts = append(rw.prompts, toks)
		data := make([][]byte, rw.chunks)
		for ch := range data {
			data[ch] = rw.data(p, ch)
		}
		id := fmt.Sprintf("real-%d", p)
		if res, err := wk.Store(ctx, wk.Key(toks, rw.chunks, id), data); err != nil || !res.Committed {
			t.Fatalf("store of prompt %d: %+v, %v", p, res, err)
		}
		if err := rw.sched.EndSession(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	return rw
}

// TestHostileBenchLeavesALiveServerAsItWas: `kvdock bench` against a
// server whose real worker fills its pool to ~47% leaves that worker's hit
// chunks, the fs tier's files and the Redis tier's keys exactly as they
// were (the bench gets only the room below the watermark, evicts only its
// own chunks and never reaches a tier), and 1 s after it ends no lock,
// session or registration of the bench is left.
func TestHostileBenchLeavesALiveServerAsItWas(t *testing.T) {
	r := redisserver.Start(t, redisserver.Options{})
	dir := t.TempDir()
	fsTier, _ := json.Marshal(map[string]any{"type": "fs", "base_path": dir, "max_capacity_gb": 1})
	respTier, _ := json.Marshal(map[string]any{"type": "resp", "host": "127.0.0.1", "port": r.Port})
	srv := harness.Start(t, "--chunk-size", "16", "--l2-adapter", string(fsTier), "--l2-adapter", string(respTier))

	rw := newRealWorker(t, srv, 30, 8)
	want := 30 * rw.chunks
	poll.Until(t, 30*time.Second, "both tiers hold the worker's chunks", func() bool {
		d := liveStatus(t, srv.HTTPPort)
		return len(d.Tiers) == 2 && d.Tiers[0].Objects == int64(want) && d.Tiers[1].Objects == int64(want) &&
			d.Tiers[0].QueueDepth == 0 && d.Tiers[1].QueueDepth == 0
	})
	hitsBefore := rw.hits(t)
	fsBefore, redisBefore := fsObjects(t, dir), redisObjects(t, r.Addr)
	before := liveStatus(t, srv.HTTPPort)
	if len(redisBefore) < want || len(fsBefore) < want {
		t.Fatalf("before the bench: %d redis keys, %d fs files, want %d", len(redisBefore), len(fsBefore), want)
	}
	for p, h := range hitsBefore {
		if h != rw.chunks {
			t.Fatalf("prompt %d: %d hits before the bench, want %d", p, h, rw.chunks)
		}
	}

	code, out, stderr := kvdock(t, nil, "bench", "--host", "127.0.0.1", "--port", strconv.Itoa(srv.Port),
		"--http-port", strconv.Itoa(srv.HTTPPort), "--mode", "shm", "--layers", "2", "--hidden", "1024", "--dtype", "float16",
		"--workers", "1", "--chunks", "4", "--duration", "1s", "--small-duration", "400ms", "--ref-duration", "100ms", "--timeout", "10s")
	ended := time.Now()
	if code != 0 {
		t.Fatalf("kvdock bench: exit %d\n%s\n%s", code, out, stderr)
	}
	// Within 1 s of its end, nothing of the bench is left on the server.
	var after liveDoc
	clean := func() bool {
		after = liveStatus(t, srv.HTTPPort)
		p := after.Pool
		return after.ActiveSessions == 0 && len(after.Instances) == 1 && p.WriteLocked == 0 && p.ReadLocked == 0 &&
			p.LockedBytes == 0 && p.LockOwners == 0 && p.Doomed == 0
	}
	for !clean() && time.Since(ended) < time.Second {
		time.Sleep(50 * time.Millisecond)
	}
	if !clean() {
		t.Fatalf("1 s after the bench: %d sessions, instances %v, pool %+v", after.ActiveSessions, after.Instances, after.Pool)
	}
	if after.Pool.BenchBytes == 0 {
		t.Fatalf("the bench stored nothing on the server (pool %+v):\n%s", after.Pool, stderr)
	}
	t.Logf("bench left %d bytes of its own chunks (evictable first); evictions %d → %d", after.Pool.BenchBytes, before.Pool.Evictions, after.Pool.Evictions)

	hitsAfter := rw.hits(t)
	for p := range hitsBefore {
		if hitsAfter[p] != hitsBefore[p] {
			t.Fatalf("prompt %d: %d hit chunks before the bench, %d after", p, hitsBefore[p], hitsAfter[p])
		}
	}
	// The hits came from the pool: none was loaded back from a tier (an
	// evicted chunk would have been).
	for i, ti := range liveStatus(t, srv.HTTPPort).Tiers {
		if ti.Loads != before.Tiers[i].Loads {
			t.Fatalf("tier %d (%s) loaded %d chunks back: the bench evicted the worker's chunks", i, ti.Type, ti.Loads-before.Tiers[i].Loads)
		}
	}
	if !sameObjects(fsBefore, fsObjects(t, dir)) {
		t.Fatalf("the fs tier's files changed during the bench")
	}
	if got := redisObjects(t, r.Addr); !sameObjects(redisBefore, got) {
		t.Fatalf("the Redis tier's keys changed during the bench: %d before, %d after", len(redisBefore), len(got))
	}
}
