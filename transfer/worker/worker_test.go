package worker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kvdock/core/engine"
	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/core/rpc/client"
	"kvdock/core/testkit/freeport"
	"kvdock/core/testkit/profiles"
	"kvdock/settings"
	"kvdock/transfer/torchpickle"
	"kvdock/transfer/worker"
)

// The test geometry: float32, one layer, hidden 4, 16-token chunks (512 B).
const (
	chunkTokens = 16
	chunkBytes  = 2 * 1 * chunkTokens * 4 * 4
)

func profile(t testing.TB) *protocol.Profile {
	t.Helper()
	p := profiles.Load(t, "nongpu-v1")
	return p
}

func dial(t testing.TB, endpoint string) *client.Client {
	t.Helper()
	c, err := client.Dial(endpoint, profile(t), client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// startEngine runs a kvdock engine with a 4 MiB pool, SHM or pickle.
func startEngine(t testing.TB, shm bool) string {
	t.Helper()
	return startEngineSized(t, shm, chunkTokens, 4.0/1024)
}

// startEngineSized runs a kvdock engine of the chunk size and pool size
// given, SHM or pickle, stopped when t ends.
func startEngineSized(t testing.TB, shm bool, chunk int, poolGB float64) string {
	t.Helper()
	cfg := settings.Default()
	cfg.Server.Host = "127.0.0.1"
	cfg.Server.Port = freeport.Port(t)
	cfg.Server.ChunkSize = chunk
	cfg.L1.SizeGB = poolGB
	name := ""
	if shm {
		name = fmt.Sprintf("kvdock_worker_test_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	}
	cfg.Server.ShmName = &name
	if err := settings.Validate(cfg, nil); err != nil {
		t.Fatal(err)
	}
	e := engine.New(cfg, engine.Options{Logger: slog.New(slog.DiscardHandler), Version: "test"})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	return e.Snapshot().Endpoint
}

func geometry(id int64, pickle bool) worker.Config {
	return worker.Config{InstanceID: id, Model: "m", Layers: 1, Hidden: 4, Dtype: "float32", Pickle: pickle}
}

func tokens(seed, chunks int) []uint32 {
	out := make([]uint32, chunks*chunkTokens)
	for i := range out {
		out[i] = uint32(seed*100000 + i)
	}
	return out
}

func chunkOf(seed, i int) []byte {
	b := make([]byte, chunkBytes)
	for j := range b {
		b[j] = byte(seed*31 + i*7 + j)
	}
	return b
}

// TestWorkerAgainstEngine stores, looks up and retrieves through a real
// engine in both modes, from four goroutines sharing one worker (the
// pickle buffer is reused by one of them at a time).
func TestWorkerAgainstEngine(t *testing.T) {
	for _, mode := range []string{worker.ModeSHM, worker.ModePickle} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			ep := startEngine(t, mode == worker.ModeSHM)
			c := dial(t, ep)
			cfg := geometry(1, false)
			cfg.EncodeChunks = 3
			w, err := worker.Register(ctx, c, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if w.Mode() != mode || w.ChunkTokens() != chunkTokens || w.Layout().Bytes != chunkBytes {
				t.Fatalf("mode %s chunk %d bytes %d", w.Mode(), w.ChunkTokens(), w.Layout().Bytes)
			}
			sched := worker.Scheduler{C: c}
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for g := range 4 {
				wg.Go(func() {
					toks := tokens(g, 3)
					data := [][]byte{chunkOf(g, 0), chunkOf(g, 1), chunkOf(g, 2)}
					req := fmt.Sprint("r", g)
					res, err := w.Store(ctx, w.Key(toks, 3, req), data)
					if err != nil || !res.Committed || res.Chunks != 3 {
						errs <- fmt.Errorf("store %d: %+v %v", g, res, err)
						return
					}
					// The copies' own time is reported for SHM only.
					if (mode == worker.ModeSHM) != (res.Copy > 0) {
						errs <- fmt.Errorf("store %d (%s): copy time %v", g, mode, res.Copy)
						return
					}
					hits, err := sched.Hits(ctx, w.LookupKey(toks, req), 1)
					if err != nil || hits != 3 {
						errs <- fmt.Errorf("lookup %d: %d %v", g, hits, err)
						return
					}
					var got [][]byte
					n, err := w.Retrieve(ctx, w.Key(toks, 3, req), func(i int, b []byte) { got = append(got, bytes.Clone(b)) })
					if err != nil || n != 3 {
						errs <- fmt.Errorf("retrieve %d: %d %v", g, n, err)
						return
					}
					for i := range got {
						if !bytes.Equal(got[i], data[i]) {
							errs <- fmt.Errorf("goroutine %d chunk %d: wrong bytes", g, i)
						}
					}
					errs <- sched.EndSession(ctx, req)
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			// Stored again: SHM reserves nothing and skips the commit; pickle
			// sends it and the server answers true (0 of 0 new keys).
			res, err := w.Store(ctx, w.Key(tokens(0, 3), 3, "again"), [][]byte{chunkOf(0, 0), chunkOf(0, 1), chunkOf(0, 2)})
			if err != nil || res.Skipped != (mode == worker.ModeSHM) || (mode == worker.ModePickle && !res.Committed) {
				t.Fatalf("second store: %+v %v", res, err)
			}
			// Without a LOOKUP nothing is read-locked: a miss, committed anyway.
			if n, err := w.Retrieve(ctx, w.Key(tokens(1, 3), 3, "nolookup"), func(int, []byte) { t.Error("chunk delivered without a lookup") }); err != nil || n != 0 {
				t.Fatalf("retrieve without lookup: %d %v", n, err)
			}
			if err := w.Unregister(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// fakeServer is an rpc server whose worker-side replies a test chooses: a
// hostile or broken LMCache server.
type fakeServer struct {
	endpoint        string
	dir             string       // the advertised segment lives here
	name            atomic.Value // string: the name advertised
	size            int64
	prepareStore    atomic.Value // func() any
	prepareRetrieve atomic.Value // func() any
	chunk           atomic.Int64
	commits         atomic.Int64 // COMMIT_STORE
	retrieveCommits atomic.Int64 // COMMIT_RETRIEVE
	unregisters     atomic.Int64
}

const fakeName = "lmcache_l1_pool_fake"

// registerOn registers instance 1 in the test geometry (pickle, or SHM
// under f's directory) with f, closed when the test ends.
func registerOn(t *testing.T, f *fakeServer, pickle bool) *worker.Worker {
	t.Helper()
	cfg := geometry(1, pickle)
	cfg.ShmDir = f.dir
	w, err := worker.Register(context.Background(), dial(t, f.endpoint), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func startFake(t *testing.T) *fakeServer {
	t.Helper()
	f := &fakeServer{dir: t.TempDir(), size: 8 * chunkBytes}
	f.name.Store(fakeName)
	if err := os.WriteFile(filepath.Join(f.dir, fakeName), make([]byte, f.size), 0o600); err != nil {
		t.Fatal(err)
	}
	f.chunk.Store(chunkTokens)
	f.prepareStore.Store(func() any { return protocol.PrepareStoreResponse{} })
	f.prepareRetrieve.Store(func() any { return protocol.PrepareRetrieveResponse{} })
	srv, err := rpc.New(rpc.Options{Host: "127.0.0.1", Profile: profile(t), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h := func(fn func() any) rpc.Handler {
		return func(context.Context, *rpc.Request) (any, error) { return fn(), nil }
	}
	srv.Handle(protocol.GetChunkSize, h(func() any { return f.chunk.Load() }))
	srv.Handle(protocol.RegisterKVCacheNonGPUContext, h(func() any {
		return protocol.RegisterResponse{ShmName: f.name.Load().(string), PoolSize: f.size}
	}))
	srv.Handle(protocol.UnregisterKVCache, h(func() any { f.unregisters.Add(1); return nil }))
	srv.Handle(protocol.PrepareStore, h(func() any { return f.prepareStore.Load().(func() any)() }))
	srv.Handle(protocol.CommitStore, h(func() any { f.commits.Add(1); return true }))
	srv.Handle(protocol.PrepareRetrieve, h(func() any { return f.prepareRetrieve.Load().(func() any)() }))
	srv.Handle(protocol.CommitRetrieve, h(func() any { f.retrieveCommits.Add(1); return true }))
	srv.Handle(protocol.QueryPrefetchStatus, h(func() any { return nil })) // never done
	srv.Handle(protocol.Lookup, h(func() any { return nil }))
	if err := srv.Bind(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	f.endpoint = srv.Endpoint()
	return f
}

func (f *fakeServer) segment(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.dir, fakeName))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func slot(off, length int64) protocol.Slot {
	return protocol.Slot{Offset: off, Length: length, Shape: []int{2, 1, chunkTokens, 4}, Dtype: "float32"}
}

// TestHostileServerStore: a PREPARE_STORE reply whose slots do not fit
// the mapping or the request is refused before a byte is written, and no
// COMMIT_STORE follows.
func TestHostileServerStore(t *testing.T) {
	f := startFake(t)
	ctx := context.Background()
	w := registerOn(t, f, false)
	if w.Mode() != worker.ModeSHM {
		t.Fatalf("mode %s", w.Mode())
	}
	good := slot(0, chunkBytes)
	cases := map[string]protocol.PrepareStoreResponse{
		"slot past the end":          {Shm: true, Slots: []protocol.Slot{slot(f.size-100, chunkBytes)}},
		"slot offset beyond the map": {Shm: true, Slots: []protocol.Slot{slot(1<<40, chunkBytes)}},
		"slot shorter than a chunk":  {Shm: true, Slots: []protocol.Slot{slot(0, chunkBytes/2)}},
		"slot longer than a chunk":   {Shm: true, Slots: []protocol.Slot{slot(0, 2*chunkBytes)}},
		"good slot then a bad one":   {Shm: true, Slots: []protocol.Slot{good, slot(f.size, chunkBytes)}},
		"chunk index out of range":   {Shm: true, Slots: []protocol.Slot{good}, ChunkIndices: []int{2}},
		"more slots than chunks":     {Shm: true, Slots: []protocol.Slot{good, slot(chunkBytes, chunkBytes), slot(2*chunkBytes, chunkBytes)}},
		"indices and slots disagree": {Shm: true, Slots: []protocol.Slot{good}, ChunkIndices: []int{0, 1}},
	}
	for name, reply := range cases {
		f.prepareStore.Store(func() any { return reply })
		_, err := w.Store(ctx, w.Key(tokens(1, 2), 2, "s"), [][]byte{chunkOf(1, 0), chunkOf(1, 1)})
		if !errors.Is(err, worker.ErrBadReply) {
			t.Errorf("%s: got %v, want ErrBadReply", name, err)
		}
		if !bytes.Equal(f.segment(t), make([]byte, f.size)) {
			t.Fatalf("%s: the worker wrote into the segment", name)
		}
		if n := f.commits.Load(); n != 0 {
			t.Fatalf("%s: %d COMMIT_STORE sent after a refused reply", name, n)
		}
	}
	// The same worker still stores when the reply is sound.
	f.prepareStore.Store(func() any {
		return protocol.PrepareStoreResponse{Shm: true, Slots: []protocol.Slot{slot(3*chunkBytes, chunkBytes)}, ChunkIndices: []int{1}}
	})
	res, err := w.Store(ctx, w.Key(tokens(1, 2), 2, "s"), [][]byte{chunkOf(1, 0), chunkOf(1, 1)})
	if err != nil || !res.Committed || res.Chunks != 1 {
		t.Fatalf("sound store: %+v %v", res, err)
	}
	if seg := f.segment(t); !bytes.Equal(seg[3*chunkBytes:4*chunkBytes], chunkOf(1, 1)) {
		t.Fatal("chunk 1 not written into its slot")
	}
}

// TestHostileServerRetrieve: a PREPARE_RETRIEVE reply that does not fit
// delivers nothing; COMMIT_RETRIEVE is sent all the same (the server's
// read locks must go).
func TestHostileServerRetrieve(t *testing.T) {
	f := startFake(t)
	ctx := context.Background()
	for _, pickle := range []bool{false, true} {
		w := registerOn(t, f, pickle)
		pk := func(ts ...torchpickle.Tensor) []byte {
			b, err := torchpickle.AppendEncode(nil, ts)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		tensor := torchpickle.Tensor{Dtype: "float32", Shape: []int{2, 1, chunkTokens, 4}, Data: chunkOf(1, 0)}
		cases := map[string]protocol.PrepareRetrieveResponse{}
		if pickle {
			cases["wrong dtype"] = protocol.PrepareRetrieveResponse{Success: true,
				Data: pk(torchpickle.Tensor{Dtype: "int32", Shape: []int{2, 1, chunkTokens, 4}, Data: chunkOf(1, 0)})}
			cases["wrong size"] = protocol.PrepareRetrieveResponse{Success: true,
				Data: pk(torchpickle.Tensor{Dtype: "float32", Shape: []int{4}, Data: make([]byte, 16)})}
			cases["more tensors than chunks"] = protocol.PrepareRetrieveResponse{Success: true, Data: pk(tensor, tensor, tensor)}
			cases["not a pickle"] = protocol.PrepareRetrieveResponse{Success: true, Data: []byte("garbage")}
		} else {
			cases["slot past the end"] = protocol.PrepareRetrieveResponse{Success: true, Slots: []protocol.Slot{slot(0, chunkBytes), slot(f.size-1, chunkBytes)}}
			cases["slot of another size"] = protocol.PrepareRetrieveResponse{Success: true, Slots: []protocol.Slot{slot(0, 64)}}
			cases["more slots than chunks"] = protocol.PrepareRetrieveResponse{Success: true,
				Slots: []protocol.Slot{slot(0, chunkBytes), slot(chunkBytes, chunkBytes), slot(2*chunkBytes, chunkBytes)}}
		}
		for name, reply := range cases {
			f.prepareRetrieve.Store(func() any { return reply })
			before := f.retrieveCommits.Load()
			n, err := w.Retrieve(ctx, w.Key(tokens(1, 2), 2, "r"), func(int, []byte) { t.Errorf("%s: chunk delivered", name) })
			if n != 0 || err == nil || (name != "not a pickle" && !errors.Is(err, worker.ErrBadReply)) {
				t.Errorf("%s (pickle %v): %d chunks, %v", name, pickle, n, err)
			}
			if f.retrieveCommits.Load() != before+1 {
				t.Errorf("%s: no COMMIT_RETRIEVE after a refused reply", name)
			}
		}
		// A miss: success false, or an SHM reply to a pickle worker (spec 4.10).
		for _, reply := range []protocol.PrepareRetrieveResponse{{}, {Success: true, Slots: []protocol.Slot{slot(0, chunkBytes)}}} {
			f.prepareRetrieve.Store(func() any { return reply })
			n, err := w.Retrieve(ctx, w.Key(tokens(1, 2), 2, "r"), func(int, []byte) {})
			want := 0
			if reply.Success && !pickle {
				want = 1 // one slot for two chunks: a partial hit, the caller sees the count
			}
			if n != want || err != nil {
				t.Errorf("pickle %v reply %+v: %d chunks, %v", pickle, reply.Success, n, err)
			}
		}
	}
}

// TestHostileServerRegister: an advertised name that leaves the segment
// directory, or a chunk size that is no size, is refused; a registration
// made is withdrawn.
func TestHostileServerRegister(t *testing.T) {
	f := startFake(t)
	ctx := context.Background()
	cfg := geometry(1, false)
	cfg.ShmDir = f.dir
	for _, name := range []string{"../../etc/passwd", "/", "a/b", ".."} {
		f.name.Store(name)
		before := f.unregisters.Load()
		if _, err := worker.Register(ctx, dial(t, f.endpoint), cfg); !errors.Is(err, worker.ErrBadReply) {
			t.Errorf("advertised %q: %v", name, err)
		}
		if f.unregisters.Load() != before+1 {
			t.Errorf("advertised %q: registration not withdrawn", name)
		}
	}
	f.name.Store(fakeName)
	for _, n := range []int64{0, -16, 1 << 40} {
		f.chunk.Store(n)
		if _, err := worker.Register(ctx, dial(t, f.endpoint), cfg); err == nil {
			t.Errorf("chunk size %d accepted", n)
		}
	}
}

// TestPrefetchThatNeverEnds: a server that answers "still running"
// forever costs the scheduler its patience, not a hang.
func TestPrefetchThatNeverEnds(t *testing.T) {
	f := startFake(t)
	s := worker.Scheduler{C: dial(t, f.endpoint), Poll: time.Millisecond, Patience: 100 * time.Millisecond}
	start := time.Now()
	_, err := s.Hits(context.Background(), protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: tokens(1, 1), End: chunkTokens, RequestID: "q"}, 1)
	if !errors.Is(err, worker.ErrPrefetchPending) {
		t.Fatalf("got %v, want ErrPrefetchPending", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("gave up after %v with a patience of 100 ms", el)
	}
}
