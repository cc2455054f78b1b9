package nongpu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/layout"
	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/core/testkit/fakeclock"
	"kvdock/core/workers"
	"kvdock/settings"
	"kvdock/transfer/torchpickle"
)

const testChunk = 16

func strptr(s string) *string { return &s }
func intptr(i int) *int       { return &i }

var segCounter atomic.Int64

// uniqueName is a bare segment name no other test process uses.
func uniqueName(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("kvdocktest_%d_%d", os.Getpid(), segCounter.Add(1))
}

// view is a view of the pool released when the test ends (before the pool
// closes: cleanups run last-registered first).
func view(t testing.TB, p *l1.Pool, off, n int64) []byte {
	b, release := p.View(off, n)
	t.Cleanup(release)
	return b
}

// openPool opens a real L1 pool: shared under segment when it is not "",
// anonymous otherwise.
func openPool(t *testing.T, segment string, size int64, clk *fakeclock.Clock) *l1.Pool {
	t.Helper()
	p, err := l1.Open(l1.Options{
		Size: size, Align: 64, Plan: l1.Decision{Segment: segment, Reason: "test: anonymous pool"},
		WriteTTL: 600 * time.Second, ReadTTL: 300 * time.Second, Policy: "LRU",
		Watermark: 0.8, Ratio: 0.2, Now: clk.Now,
	})
	if err != nil {
		t.Fatalf("l1.Open(%q): %v", segment, err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

type env struct {
	t        *testing.T
	clk      *fakeclock.Clock
	pool     *l1.Pool
	sessions *keys.Sessions
	layouts  *layout.Registry
	mod      *Module
	server   settings.ServerConfig
	mu       sync.Mutex
	events   []workers.Event
}

// newEnv builds a module over a real pool. shared selects a real /dev/shm
// segment (SHM strategy) or an anonymous pool with --shm-name "" (PICKLE).
func newEnv(t *testing.T, shared bool, size int64) *env {
	t.Helper()
	e := &env{t: t, clk: fakeclock.New(), layouts: layout.NewRegistry()}
	seg := ""
	e.server = settings.Default().Server
	e.server.ChunkSize = testChunk
	if shared {
		seg = l1.NormalizeName(uniqueName(t))
		e.server.ShmName = strptr(seg)
	} else {
		e.server.ShmName = strptr("")
	}
	e.pool = openPool(t, seg, size, e.clk)
	h, err := keys.NewHasher(testChunk, "blake3")
	if err != nil {
		t.Fatal(err)
	}
	e.sessions = keys.NewSessions(h, time.Hour, e.clk.Now)
	l1cfg := settings.Default().L1
	e.mod, err = New(Deps{
		Pool: e.pool, Keys: e.sessions, Layouts: e.layouts,
		Events: func(ev workers.Event) { e.mu.Lock(); e.events = append(e.events, ev); e.mu.Unlock() },
		Now:    e.clk.Now,
	}, e.server, l1cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.mod.Close)
	return e
}

func (e *env) eventsOf(kind workers.EventKind) []workers.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []workers.Event
	for _, ev := range e.events {
		if ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

func payload(id int64) protocol.RegisterPayload {
	return protocol.RegisterPayload{InstanceID: id, ModelName: "m", WorldSize: 1, BlockSize: 8,
		NumLayers: 2, HiddenDimSize: 4, DtypeStr: "float16"}
}

// chunkBytes is the registered layout's size: [2, 2, 16, 4] float16.
const chunkBytes = 2 * 2 * testChunk * 4 * 2

func (e *env) register(id int64) protocol.RegisterResponse {
	e.t.Helper()
	r, err := e.mod.RegisterThrough(payload(id), nil, "")
	if err != nil {
		e.t.Fatalf("Register: %v", err)
	}
	return r
}

func tokens(n int, base uint32) []uint32 {
	ts := make([]uint32, n)
	for i := range ts {
		ts[i] = base + uint32(i)
	}
	return ts
}

func key(toks []uint32, start, end int) protocol.Key {
	return protocol.Key{ModelName: "m", WorldSize: 1, WorkerID: intptr(0), TokenIDs: toks,
		Start: start, End: end, RequestID: "req"}
}

// objectKeys are k's keys under the layout a LOOKUP of its model answers
// for (the model's first registered layout).
func (e *env) objectKeys(k protocol.Key) []keys.ObjectKey {
	e.t.Helper()
	id, _ := e.layouts.First(k.ModelName, k.WorldSize)
	ks, err := e.sessions.ObjectKeys(keys.KeyRequest{RequestID: k.RequestID, Model: k.ModelName,
		WorldSize: k.WorldSize, Worker: k.WorkerID, Tokens: k.TokenIDs, Start: k.Start, End: k.End, Salt: k.CacheSalt, Layout: id})
	if err != nil {
		e.t.Fatal(err)
	}
	return ks
}

// lookupLock takes the read lock LOOKUP would take; all keys must be cached.
func (e *env) lookupLock(k protocol.Key) []keys.ObjectKey {
	e.t.Helper()
	ks := e.objectKeys(k)
	if n := e.pool.ReserveReadPrefix(ks, 1); n != len(ks) {
		e.t.Fatalf("lookup locked %d of %d keys", n, len(ks))
	}
	return ks
}

// cached reports how many leading keys are readable (without keeping locks).
func (e *env) cached(k protocol.Key) int {
	ks := e.objectKeys(k)
	n := e.pool.ReserveReadPrefix(ks, 1)
	e.pool.FinishRead(ks[:n], 1)
	return n
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

func tensorOf(seed byte) torchpickle.Tensor {
	d := make([]byte, chunkBytes)
	fill(d, seed)
	return torchpickle.Tensor{Dtype: "float16", Shape: []int{2, 2, testChunk, 4}, Data: d}
}

func pickled(t *testing.T, ts ...torchpickle.Tensor) []byte {
	t.Helper()
	b, err := torchpickle.AppendEncode(nil, ts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestPlanSegment(t *testing.T) {
	lazy := settings.L1Config{UseLazy: true}
	eager := settings.L1Config{}
	cases := []struct {
		name       string
		shm        *string
		l1         settings.L1Config
		source     string
		want       string
		private    bool // planned in this endpoint's private segment
		wantReason string
	}{
		{"auto lazy", nil, lazy, "", "", false, "l1.use_lazy is on: a lazy pool cannot be shared"},
		{"auto eager", nil, eager, "", "lmcache_l1_pool_4242", false, "pid 4242"},
		{"empty flag", strptr(""), eager, "on the command line", "", true, `--shm-name "" given (on the command line)`},
		{"empty env", strptr(""), eager, "by KVDOCK_SHM_NAME", "", true, `--shm-name "" given (by KVDOCK_SHM_NAME)`},
		{"empty file, lazy", strptr(""), lazy, "in kvdock.yaml:3", "", false, `--shm-name "" given (in kvdock.yaml:3); l1.use_lazy is on`},
		{"bare", strptr("foo"), eager, "on the command line", "lmcache_l1_pool_foo", false, "--shm-name foo given"},
		{"slash", strptr("/foo"), eager, "on the command line", "lmcache_l1_pool_foo", false, "--shm-name /foo given"},
		{"prefixed", strptr("lmcache_l1_pool_x"), eager, "", "lmcache_l1_pool_x", false, "--shm-name lmcache_l1_pool_x given"},
		{"name beats lazy", strptr("foo"), lazy, "", "lmcache_l1_pool_foo", false, "foo"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			server := settings.ServerConfig{ShmName: c.shm, Host: "127.0.0.1", Port: 27042}
			d := PlanSegment(server, c.l1, 4242, c.source)
			if d.Segment != c.want {
				t.Errorf("segment = %q, want %q", d.Segment, c.want)
			}
			if want := map[bool]string{true: l1.PrivateSegmentName("127.0.0.1", 27042)}[c.private]; d.Private != want {
				t.Errorf("private segment = %q, want %q", d.Private, want)
			}
			if d.Shared || d.Size != 0 {
				t.Errorf("plan %+v claims an outcome: only l1.Open knows whether the segment exists", d)
			}
			if !strings.Contains(d.Reason, c.wantReason) {
				t.Errorf("reason = %q, want it to contain %q", d.Reason, c.wantReason)
			}
		})
	}
}

func TestPoolInfoFromDecision(t *testing.T) {
	shared := l1.Decision{Segment: "lmcache_l1_pool_9", Size: 1 << 20, Shared: true, Reason: "shared"}
	anon := l1.Decision{Size: 1 << 20, Reason: "/dev/shm has 60 MiB free, pool needs 1 GiB"}
	off := l1.Decision{Size: 1 << 20, Reason: `--shm-name "" given (on the command line)`}
	private := l1.PrivateSegmentName("127.0.0.1", 27042)
	cases := []struct {
		name string
		d    l1.Decision
		want workers.Info
	}{
		{"shared", shared, workers.Info{ShmName: "lmcache_l1_pool_9", PoolSize: 1 << 20, Reason: "shared"}},
		{"capacity fallback", anon, workers.Info{Reason: anon.Reason}},
		{"off", off, workers.Info{Reason: off.Reason}},
		{"planned, not created", l1.Decision{Segment: "lmcache_l1_pool_foo", Reason: "--shm-name foo given"}, workers.Info{Reason: "--shm-name foo given"}},
		{"no reason", l1.Decision{Segment: "lmcache_l1_pool_foo", Size: 4096, Shared: true}, workers.Info{ShmName: "lmcache_l1_pool_foo", PoolSize: 4096, Reason: "shared segment lmcache_l1_pool_foo (4096 bytes)"}},
		{"private segment", l1.Decision{Private: private, Size: 1 << 20, Reason: off.Reason}, workers.Info{Reason: off.Reason}},
		// However a private name got into Segment, it is never advertised.
		{"private name as shared", l1.Decision{Segment: private, Size: 1 << 20, Shared: true, Reason: "x"}, workers.Info{Reason: "x"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := PoolInfo(c.d)
			if got != c.want {
				t.Errorf("PoolInfo = %+v, want %+v", got, c.want)
			}
		})
	}
}

// seedCase runs the seed wiring: PlanSegment turns the settings into the
// plan, l1.Open carries it out and the module advertises the pool's
// Decision; the registration reply is what the pool created.
func seedCase(t *testing.T, server settings.ServerConfig, l1cfg settings.L1Config) (protocol.RegisterResponse, *l1.Pool, *Module) {
	t.Helper()
	clk := fakeclock.New()
	plan := PlanSegment(server, l1cfg, os.Getpid(), "on the command line")
	pool, err := l1.Open(l1.Options{Size: 1 << 20, Align: 64, Plan: plan,
		WriteTTL: time.Minute, ReadTTL: time.Minute, Policy: "LRU", Watermark: 0.8, Ratio: 0.2, Now: clk.Now})
	if err != nil {
		t.Fatalf("l1.Open(%q): %v", plan.Segment, err)
	}
	t.Cleanup(func() { pool.Close() })
	h, _ := keys.NewHasher(testChunk, "blake3")
	server.ChunkSize = testChunk
	mod, err := New(Deps{Pool: pool, Keys: keys.NewSessions(h, time.Hour, clk.Now), Layouts: layout.NewRegistry(), Now: clk.Now}, server, l1cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mod.Close)
	resp, err := mod.RegisterThrough(payload(1), nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := mod.PoolInfo(); got.ShmName != resp.ShmName || got.PoolSize != resp.PoolSize {
		t.Errorf("PoolInfo() = %+v, registration said %+v", got, resp)
	}
	return resp, pool, mod
}

func TestSeedNotSetLazy(t *testing.T) {
	resp, _, mod := seedCase(t, settings.ServerConfig{}, settings.L1Config{UseLazy: true})
	if resp != (protocol.RegisterResponse{}) {
		t.Fatalf("lazy L1 advertised %+v, want {\"\", 0}", resp)
	}
	c := mod.Contexts()
	if len(c) != 1 || c[0].Mode != workers.ModePickle || !strings.Contains(c[0].Reason, "use_lazy") {
		t.Fatalf("contexts = %+v, want one PICKLE instance with the lazy reason", c)
	}
}

func TestSeedNotSetEager(t *testing.T) {
	// auto → default lmcache_l1_pool_<pid>; this test process's pid is unique.
	resp, pool, mod := seedCase(t, settings.ServerConfig{}, settings.L1Config{})
	want := fmt.Sprintf("lmcache_l1_pool_%d", os.Getpid())
	d := pool.Decision()
	if !d.Shared {
		t.Fatalf("pool not shared: %s", d.Reason)
	}
	if resp.ShmName != want || resp.PoolSize != d.Size || d.Segment != want {
		t.Fatalf("advertised %+v, pool %+v, want %s", resp, d, want)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", want)); err != nil {
		t.Fatalf("advertised segment does not exist: %v", err)
	}
	if c := mod.Contexts(); c[0].Mode != workers.ModeSHM {
		t.Fatalf("mode %s, want SHM", c[0].Mode)
	}
}

func TestSeedNamedCapacityFallback(t *testing.T) {
	// The plan names a segment; the capacity check in l1.Open fails; the
	// module advertises the outcome, never the planned name.
	clk := fakeclock.New()
	plan := PlanSegment(settings.ServerConfig{ShmName: strptr(uniqueName(t))}, settings.L1Config{}, os.Getpid(), "")
	pool, err := l1.Open(l1.Options{Size: 1 << 20, Align: 64, Plan: plan, Now: clk.Now,
		Statfs: func(string) (int64, error) { return 4096, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	h, _ := keys.NewHasher(testChunk, "blake3")
	mod, err := New(Deps{Pool: pool, Keys: keys.NewSessions(h, time.Hour, clk.Now), Layouts: layout.NewRegistry(), Now: clk.Now},
		settings.ServerConfig{ShmName: strptr(plan.Segment), ChunkSize: testChunk}, settings.L1Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Close()
	info := mod.PoolInfo()
	if info.ShmName != "" || info.PoolSize != 0 || !strings.Contains(info.Reason, "pool needs") {
		t.Fatalf("advertised %+v, want {\"\", 0} with the capacity reason", info)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", plan.Segment)); !os.IsNotExist(err) {
		t.Fatalf("planned segment %s exists after the fallback: %v", plan.Segment, err)
	}
}

func TestSeedEmptyAdvertisesNoSegment(t *testing.T) {
	// An eager pool /dev/shm could hold, but --shm-name "" shares none: the
	// pool is the endpoint's private segment, which a restart can keep and
	// no worker is told of; every worker gets pickle.
	server := settings.ServerConfig{ShmName: strptr(""), Host: "127.0.0.1", Port: 27000 + os.Getpid()%1000}
	resp, pool, mod := seedCase(t, server, settings.L1Config{})
	if resp != (protocol.RegisterResponse{}) {
		t.Fatalf("Register = %+v; want {\"\", 0}", resp)
	}
	private := l1.PrivateSegmentName(server.Host, server.Port)
	if d := pool.Decision(); d.Shared || d.Segment != "" || d.Private != private || !strings.Contains(d.Reason, `--shm-name "" given (on the command line)`) {
		t.Fatalf("pool decision %+v, want the private segment %s because of --shm-name \"\"", d, private)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", private)); err != nil {
		t.Fatalf("private segment: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", fmt.Sprintf("lmcache_l1_pool_%d", os.Getpid()))); !os.IsNotExist(err) {
		t.Fatalf("--shm-name \"\" left a default segment: %v", err)
	}
	if c := mod.Contexts(); c[0].Mode != workers.ModePickle || !strings.Contains(c[0].Reason, `--shm-name ""`) {
		t.Fatalf("context %+v, want PICKLE with the --shm-name \"\" reason", c[0])
	}
}

func TestModuleAdvertisesThePoolNotTheSetting(t *testing.T) {
	// The module takes the pool's Decision only: server.ShmName was spent on
	// the plan, so a setting that disagrees with the pool changes nothing.
	clk := fakeclock.New()
	pool := openPool(t, l1.NormalizeName(uniqueName(t)), 1<<20, clk)
	d := pool.Decision()
	if !d.Shared {
		t.Fatal("test pool should be shared")
	}
	h, _ := keys.NewHasher(testChunk, "blake3")
	server := settings.ServerConfig{ShmName: strptr(""), ChunkSize: testChunk}
	mod, err := New(Deps{Pool: pool, Keys: keys.NewSessions(h, time.Hour, clk.Now), Layouts: layout.NewRegistry(), Now: clk.Now}, server, settings.L1Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Close()
	resp, err := mod.RegisterThrough(payload(1), nil, "")
	if err != nil || resp.ShmName != d.Segment || resp.PoolSize != d.Size {
		t.Fatalf("Register = %+v, %v; want the pool's segment %s", resp, err, d.Segment)
	}
}

func TestSeedNamed(t *testing.T) {
	bare := uniqueName(t)
	for _, given := range []string{bare, "/" + bare, "lmcache_l1_pool_" + bare} {
		t.Run(given, func(t *testing.T) {
			want := "lmcache_l1_pool_" + bare
			resp, pool, _ := seedCase(t, settings.ServerConfig{ShmName: strptr(given)}, settings.L1Config{UseLazy: true})
			if resp.ShmName != want || resp.PoolSize != 1<<20 {
				t.Fatalf("advertised %+v, want {%s, %d}", resp, want, 1<<20)
			}
			if d := pool.Decision(); d.Segment != want {
				t.Fatalf("pool created %q, advertised %q", d.Segment, want)
			}
			if _, err := os.Stat(filepath.Join("/dev/shm", want)); err != nil {
				t.Fatalf("advertised segment does not exist: %v", err)
			}
			pool.Close()
		})
	}
}

func TestRegistrationValidation(t *testing.T) {
	e := newEnv(t, false, 1<<20)
	bad := map[string]func(*protocol.RegisterPayload){
		"dtype":      func(p *protocol.RegisterPayload) { p.DtypeStr = "complex32" },
		"layers":     func(p *protocol.RegisterPayload) { p.NumLayers = 0 },
		"hidden":     func(p *protocol.RegisterPayload) { p.HiddenDimSize = -1 },
		"block":      func(p *protocol.RegisterPayload) { p.BlockSize = 0 },
		"world":      func(p *protocol.RegisterPayload) { p.WorldSize = 0 },
		"big world":  func(p *protocol.RegisterPayload) { p.WorldSize = 256 },
		"model @":    func(p *protocol.RegisterPayload) { p.ModelName = "a@b" },
		"model none": func(p *protocol.RegisterPayload) { p.ModelName = "" },
	}
	for name, mut := range bad {
		p := payload(7)
		mut(&p)
		if _, err := e.mod.RegisterThrough(p, nil, ""); err == nil {
			t.Errorf("%s: registration accepted", name)
		}
	}
	if n := len(e.mod.Contexts()); n != 0 {
		t.Fatalf("%d contexts after invalid registrations", n)
	}
	if e.layouts.Has("m", 1) || e.layouts.Has("a@b", 1) {
		t.Fatal("invalid registration reached the layout registry")
	}
	if len(e.eventsOf(workers.EventError)) == 0 {
		t.Fatal("no error event for invalid registrations")
	}

	// Layout uses the server chunk size and MLA drops the K/V axis.
	p := payload(8)
	p.UseMLA = true
	p.ModelName = "mla"
	if _, err := e.mod.RegisterThrough(p, nil, ""); err != nil {
		t.Fatal(err)
	}
	l, _ := e.layouts.Get("mla", 1)
	if fmt.Sprint(l.Shape) != fmt.Sprint([]int{2, testChunk, 4}) || l.Bytes != 2*testChunk*4*2 {
		t.Fatalf("MLA layout %v (%d bytes)", l.Shape, l.Bytes)
	}

	// Another layout for the same (model, world size) registers beside it.
	p = payload(9)
	p.ModelName = "mla"
	if _, err := e.mod.RegisterThrough(p, nil, ""); err != nil {
		t.Fatalf("another layout of the model: %v", err)
	}
	if ids, _ := e.layouts.Registered("mla", 1); len(ids) != 2 || ids[0] == ids[1] {
		t.Fatalf("registered layouts %x", ids)
	}
}

func TestReRegistration(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	first := e.register(1)
	if first.ShmName == "" || first.PoolSize != 1<<20 {
		t.Fatalf("first registration %+v", first)
	}
	p := payload(1)
	p.NumLayers = 99 // ignored: nothing is replaced
	again, err := e.mod.RegisterThrough(p, nil, "")
	if err != nil || again != first {
		t.Fatalf("re-registration = %+v, %v; want %+v", again, err, first)
	}
	c := e.mod.Contexts()
	if len(c) != 1 || c[0].NumLayers != 2 {
		t.Fatalf("contexts after re-registration: %+v", c)
	}
	// Only one layout reference was taken.
	if !e.mod.Unregister(1) || e.layouts.Has("m", 1) {
		t.Fatal("layout still referenced after the single unregister")
	}
	if e.mod.Unregister(1) {
		t.Fatal("unknown instance unregistered")
	}
}

func TestSHMRoundTrip(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	toks := tokens(2*testChunk+3, 100)
	k := key(toks, 0, 2*testChunk)

	resp, err := e.mod.PrepareStore(k, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Shm || len(resp.Slots) != 2 || fmt.Sprint(resp.ChunkIndices) != "[0 1]" {
		t.Fatalf("prepare store = %+v", resp)
	}
	for i, s := range resp.Slots {
		if s.Length != chunkBytes || s.Dtype != "float16" || fmt.Sprint(s.Shape) != "[2 2 16 4]" {
			t.Fatalf("slot %d = %+v", i, s)
		}
		fill(view(t, e.pool, s.Offset, s.Length), byte(i+1))
	}
	if e.cached(k) != 0 {
		t.Fatal("chunks readable before commit")
	}
	if ok, err := e.mod.CommitStore(k, 1, nil); !ok || err != nil {
		t.Fatalf("commit = %v, %v", ok, err)
	}
	if ok, _ := e.mod.CommitStore(k, 1, nil); ok {
		t.Fatal("second commit found a pending write")
	}

	ks := e.lookupLock(k)
	r, err := e.mod.PrepareRetrieve(k, 1)
	if err != nil || !r.Success || len(r.Slots) != 2 || len(r.Data) != 0 {
		t.Fatalf("prepare retrieve = %+v, %v", r, err)
	}
	for i, s := range r.Slots {
		want := make([]byte, chunkBytes)
		fill(want, byte(i+1))
		if !bytes.Equal(view(t, e.pool, s.Offset, s.Length), want) {
			t.Fatalf("slot %d holds other bytes", i)
		}
	}
	if !e.pool.IsLocked(ks[0]) {
		t.Fatal("lock released before COMMIT_RETRIEVE")
	}
	if e.mod.Stats().PendingReads != 1 {
		t.Fatalf("stats %+v", e.mod.Stats())
	}
	if ok, err := e.mod.CommitRetrieve(k, 1); !ok || err != nil {
		t.Fatalf("commit retrieve = %v, %v", ok, err)
	}
	if e.pool.IsLocked(ks[0]) {
		t.Fatal("read lock not released by COMMIT_RETRIEVE")
	}
	if ok, _ := e.mod.CommitRetrieve(k, 1); !ok {
		t.Fatal("COMMIT_RETRIEVE without pending read must still be true")
	}
	c := e.mod.Contexts()[0]
	if c.Stores != 1 || c.Retrieves != 1 || c.HitChunks != 2 || c.BytesIn != 2*chunkBytes || c.BytesOut != 2*chunkBytes {
		t.Fatalf("context stats %+v", c)
	}

	// Without a LOOKUP lock a retrieve is a miss.
	r, err = e.mod.PrepareRetrieve(k, 1)
	if err != nil || r.Success {
		t.Fatalf("unlocked retrieve = %+v, %v", r, err)
	}
}

func TestRetrievePartialLockReleasesFound(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	toks := tokens(2*testChunk, 1)
	k0 := key(toks, 0, testChunk)
	if _, err := e.mod.PrepareStore(k0, 1); err != nil {
		t.Fatal(err)
	}
	e.mod.CommitStore(k0, 1, nil)
	ks0 := e.lookupLock(k0)
	r, err := e.mod.PrepareRetrieve(key(toks, 0, 2*testChunk), 1)
	if err != nil || r.Success {
		t.Fatalf("retrieve with a missing chunk = %+v, %v", r, err)
	}
	if e.pool.IsLocked(ks0[0]) {
		t.Fatal("lock of the found chunk not released on a miss")
	}
}

func TestPartialReservationAndAllCached(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	toks := tokens(2*testChunk, 5)
	k0 := key(toks, 0, testChunk)
	if r, _ := e.mod.PrepareStore(k0, 1); len(r.Slots) != 1 {
		t.Fatalf("first prepare %+v", r)
	}
	if ok, _ := e.mod.CommitStore(k0, 1, nil); !ok {
		t.Fatal("commit failed")
	}
	k := key(toks, 0, 2*testChunk)
	r, err := e.mod.PrepareStore(k, 1)
	if err != nil || len(r.Slots) != 1 || fmt.Sprint(r.ChunkIndices) != "[1]" {
		t.Fatalf("partial prepare = %+v, %v; want one slot, chunk_indices [1]", r, err)
	}
	if ok, _ := e.mod.CommitStore(k, 1, nil); !ok {
		t.Fatal("commit failed")
	}
	r, err = e.mod.PrepareStore(k, 1)
	if err != nil || !r.Shm || r.Slots == nil || len(r.Slots) != 0 || r.ChunkIndices == nil || len(r.ChunkIndices) != 0 {
		t.Fatalf("all-cached prepare = %+v, %v; want empty (non-nil) slots and indices", r, err)
	}
	if e.mod.Stats().PendingWrites != 0 {
		t.Fatal("all-cached prepare left a pending entry")
	}
	if ok, _ := e.mod.CommitStore(k, 1, nil); ok {
		t.Fatal("commit after all-cached prepare must be false")
	}
}

func TestUnregisterAbortsPendingWritesAndReleasesReads(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	e.register(2)
	toks := tokens(testChunk, 9)
	kr := key(toks, 0, testChunk)
	e.mod.PrepareStore(kr, 2)
	e.mod.CommitStore(kr, 2, nil)
	ksr := e.lookupLock(kr)
	if r, _ := e.mod.PrepareRetrieve(kr, 1); !r.Success {
		t.Fatal("retrieve missed")
	}

	kw := key(tokens(testChunk, 1000), 0, testChunk)
	r, _ := e.mod.PrepareStore(kw, 1)
	if len(r.Slots) != 1 {
		t.Fatalf("prepare %+v", r)
	}
	fill(view(t, e.pool, r.Slots[0].Offset, r.Slots[0].Length), 3) // half-written, never committed

	if !e.mod.Unregister(1) {
		t.Fatal("unregister failed")
	}
	if s := e.mod.Stats(); s.PendingReads != 0 || s.PendingWrites != 0 {
		t.Fatalf("pending left after unregister: %+v", s)
	}
	if e.cached(kw) != 0 {
		t.Fatal("half-written chunk was published by unregister")
	}
	// The dropped worker may still be copying out of the read slot: the hold
	// stays until the read TTL.
	if !e.pool.IsLocked(ksr[0]) {
		t.Fatal("pending read hold released under a live copy by unregister")
	}
	// The abandoned write's key is free at once: another instance can store
	// the chunk, in other bytes.
	if r, _ := e.mod.PrepareStore(kw, 2); len(r.Slots) != 1 {
		t.Fatalf("chunk not reservable after abort: %+v", r)
	}
	if _, err := e.mod.PrepareStore(kw, 1); err == nil {
		t.Fatal("unregistered instance served")
	}
	if len(e.eventsOf(workers.EventUnregister)) != 1 || len(e.eventsOf(workers.EventRegister)) != 2 {
		t.Fatalf("events %+v", e.events)
	}
}

// TestDuplicatePrepareKeepsFirst: a second prepare of a pending transfer
// (request_id is not part of its identity) gets no slots, since the next
// commit of the key publishes the first one's slots; those stay the
// transfer's until that commit. Past half the write TTL the first is given
// up and a prepare reserves again.
func TestDuplicatePrepareKeepsFirst(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	k := key(tokens(testChunk, 77), 0, testChunk)
	first, _ := e.mod.PrepareStore(k, 1)
	k.RequestID = "other"
	second, err := e.mod.PrepareStore(k, 1)
	if err != nil || len(first.Slots) != 1 || len(second.Slots) != 0 {
		t.Fatalf("prepares %+v / %+v, %v: the second must get no slots", first, second, err)
	}
	if n := e.mod.Stats().PendingWrites; n != 1 {
		t.Fatalf("%d pending writes, want 1", n)
	}
	fill(view(t, e.pool, first.Slots[0].Offset, first.Slots[0].Length), 4)
	if ok, _ := e.mod.CommitStore(k, 1, nil); !ok {
		t.Fatal("commit failed")
	}
	if e.cached(k) != 1 {
		t.Fatal("chunk not stored")
	}

	k2 := key(tokens(testChunk, 700), 0, testChunk)
	if r, _ := e.mod.PrepareStore(k2, 1); len(r.Slots) != 1 {
		t.Fatalf("prepare %+v", r)
	}
	e.clk.Advance(301 * time.Second)
	again, err := e.mod.PrepareStore(k2, 1)
	if err != nil || len(again.Slots) != 1 {
		t.Fatalf("prepare after the first was given up: %+v, %v", again, err)
	}
	fill(view(t, e.pool, again.Slots[0].Offset, again.Slots[0].Length), 5)
	if ok, _ := e.mod.CommitStore(k2, 1, nil); !ok || e.cached(k2) != 1 {
		t.Fatalf("commit after a given-up prepare: %v, cached %d", ok, e.cached(k2))
	}
}

func TestPickleRoundTrip(t *testing.T) {
	e := newEnv(t, false, 1<<20)
	if r := e.register(1); r != (protocol.RegisterResponse{}) {
		t.Fatalf("pickle server advertised %+v", r)
	}
	k := key(tokens(2*testChunk, 3), 0, 2*testChunk)
	ps, err := e.mod.PrepareStore(k, 1)
	if err != nil || ps.Shm {
		t.Fatalf("pickle prepare = %+v, %v; want empty context", ps, err)
	}
	if e.mod.Stats().PendingWrites != 0 {
		t.Fatal("pickle prepare reserved")
	}
	in := []torchpickle.Tensor{tensorOf(1), tensorOf(2)}
	if ok, err := e.mod.CommitStore(k, 1, pickled(t, in...)); !ok || err != nil {
		t.Fatalf("commit = %v, %v", ok, err)
	}
	if ok, err := e.mod.CommitStore(k, 1, pickled(t, in...)); !ok || err != nil {
		t.Fatalf("commit of cached chunks = %v, %v; want true (0 == 0)", ok, err)
	}
	ks := e.lookupLock(k)
	r, err := e.mod.PrepareRetrieve(k, 1)
	if err != nil || !r.Success || r.Slots != nil || len(r.Data) == 0 {
		t.Fatalf("prepare retrieve = success %v, %d bytes, slots %v, %v", r.Success, len(r.Data), r.Slots, err)
	}
	if e.pool.IsLocked(ks[0]) {
		t.Fatal("pickle retrieve kept the read lock")
	}
	out, err := torchpickle.Decode(r.Data, torchpickle.Limits{})
	if err != nil || len(out) != 2 {
		t.Fatalf("decode reply: %d tensors, %v", len(out), err)
	}
	for i := range out {
		if !matches(out[i], layout.Layout{Shape: in[i].Shape, Dtype: in[i].Dtype, Bytes: chunkBytes}) || !bytes.Equal(out[i].Data, in[i].Data) {
			t.Fatalf("tensor %d came back different", i)
		}
	}
	if ok, _ := e.mod.CommitRetrieve(k, 1); !ok {
		t.Fatal("commit retrieve false")
	}
	if _, err := e.mod.CommitStore(k, 1, nil); err == nil {
		t.Fatal("empty bytes in pickle mode must be an error (no reply), as upstream")
	}
	if _, err := e.mod.CommitStore(k, 1, []byte("not a pickle")); err == nil {
		t.Fatal("garbage pickle accepted")
	}
}

func TestLayoutMismatchRejected(t *testing.T) {
	e := newEnv(t, false, 1<<20)
	e.register(1)
	k := key(tokens(2*testChunk, 3), 0, 2*testChunk)
	wrongShape := tensorOf(1)
	wrongShape.Shape = []int{2, 2, 4, testChunk}
	wrongDtype := tensorOf(2)
	wrongDtype.Dtype = "bfloat16"
	for _, bad := range []torchpickle.Tensor{wrongShape, wrongDtype} {
		ok, err := e.mod.CommitStore(k, 1, pickled(t, tensorOf(0), bad))
		if err != nil || ok {
			t.Fatalf("mismatched tensor: commit = %v, %v; want false", ok, err)
		}
		ks := e.objectKeys(k)
		if n := e.pool.ReserveReadPrefix(ks[1:], 1); n != 0 {
			t.Fatal("mismatched tensor was stored")
		}
	}
	if e.mod.Stats().Rejected != 2 || len(e.eventsOf(workers.EventError)) == 0 {
		t.Fatalf("stats %+v, events %+v", e.mod.Stats(), e.events)
	}
	// Fewer tensors than chunks: the missing one is not stored, answer false.
	k2 := key(tokens(2*testChunk, 50), 0, 2*testChunk)
	if ok, _ := e.mod.CommitStore(k2, 1, pickled(t, tensorOf(0))); ok {
		t.Fatal("short tensor list answered true")
	}
	if e.cached(k2) != 1 {
		t.Fatal("the valid leading chunk should be stored")
	}
}

func TestSHMPrepareThenPickleCommit(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	k := key(tokens(testChunk, 11), 0, testChunk)
	if r, _ := e.mod.PrepareStore(k, 1); len(r.Slots) != 1 {
		t.Fatalf("prepare %+v", r)
	}
	in := tensorOf(9)
	if ok, err := e.mod.CommitStore(k, 1, pickled(t, in)); !ok || err != nil {
		t.Fatalf("pickle commit after SHM prepare = %v, %v", ok, err)
	}
	if e.mod.Stats().PendingWrites != 0 {
		t.Fatal("SHM reservation still pending")
	}
	ks := e.lookupLock(k)
	ref, _ := e.pool.HoldRead(ks[0])
	if !bytes.Equal(view(t, e.pool, ref.Offset, ref.Length), in.Data) {
		t.Fatal("pickled data not stored")
	}
	e.pool.ReturnRead([]l1.ReadRef{ref}) // the lock stays for the retrieve below
	// The instance fell back: retrieves now answer pickled data.
	r, err := e.mod.PrepareRetrieve(k, 1)
	if err != nil || !r.Success || len(r.Data) == 0 || r.Slots != nil {
		t.Fatalf("retrieve after fallback = %+v, %v", r.Success, err)
	}
}

func TestFallbackDetection(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	e.register(2)
	seg := e.mod.PoolInfo().ShmName
	k := key(tokens(testChunk, 21), 0, testChunk)
	if ok, err := e.mod.CommitStore(k, 1, pickled(t, tensorOf(5))); !ok || err != nil {
		t.Fatalf("commit = %v, %v", ok, err)
	}
	for _, c := range e.mod.Contexts() {
		switch c.InstanceID {
		case 1:
			if c.Mode != workers.ModePickle || c.Reason != "worker fell back: could not attach "+seg {
				t.Fatalf("instance 1: %s %q", c.Mode, c.Reason)
			}
		case 2:
			if c.Mode != workers.ModeSHM {
				t.Fatalf("instance 2 changed mode: %s", c.Mode)
			}
		}
	}
	if n := len(e.eventsOf(workers.EventFallback)); n != 1 {
		t.Fatalf("%d fallback events", n)
	}
	if ps, _ := e.mod.PrepareStore(k, 1); ps.Shm {
		t.Fatal("fallen-back instance still gets slots")
	}
	e.lookupLock(k)
	r, _ := e.mod.PrepareRetrieve(k, 1)
	out, err := torchpickle.Decode(r.Data, torchpickle.Limits{})
	if !r.Success || err != nil || len(out) != 1 || !bytes.Equal(out[0].Data, tensorOf(5).Data) {
		t.Fatalf("fallback retrieve: success %v, %v", r.Success, err)
	}
	if e.mod.Stats().Fallbacks != 1 {
		t.Fatal("fallback not counted")
	}
}

func TestNoSpace(t *testing.T) {
	e := newEnv(t, true, 4096) // a chunk is 512 bytes; eight fit
	e.register(1)
	k := key(tokens(9*testChunk, 1), 0, 9*testChunk)
	r, err := e.mod.PrepareStore(k, 1)
	if err != nil || !r.Shm || len(r.Slots) != 0 || r.Slots == nil {
		t.Fatalf("prepare without space = %+v, %v; want empty slots", r, err)
	}
	if s := e.mod.Stats(); s.NoSpace != 1 || s.PendingWrites != 0 {
		t.Fatalf("stats %+v", s)
	}
	if len(e.eventsOf(workers.EventNoSpace)) != 1 {
		t.Fatal("no-space not reported")
	}
}

func TestPendingExpiry(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	e.register(2)
	kw := key(tokens(testChunk, 1), 0, testChunk)
	e.mod.PrepareStore(kw, 1)
	kr := key(tokens(testChunk, 500), 0, testChunk)
	e.mod.PrepareStore(kr, 2)
	e.mod.CommitStore(kr, 2, nil)
	ksr := e.lookupLock(kr)
	e.mod.PrepareRetrieve(kr, 2)

	e.clk.Advance(100 * time.Second) // under half of either TTL
	e.mod.Sweep()
	if s := e.mod.Stats(); s.PendingWrites != 1 || s.PendingReads != 1 {
		t.Fatalf("expired too early: %+v", s)
	}
	e.clk.Advance(60 * time.Second) // reads: 160 s ≥ 300/2
	e.mod.Sweep()
	if s := e.mod.Stats(); s.PendingWrites != 1 || s.PendingReads != 0 {
		t.Fatalf("read not expired: %+v", s)
	}
	if !e.pool.IsLocked(ksr[0]) {
		t.Fatal("expired pending read gave its hold up before the pool's read TTL")
	}
	e.clk.Advance(150 * time.Second) // writes: 310 s ≥ 600/2
	if ok, _ := e.mod.CommitStore(kw, 1, nil); ok {
		t.Fatal("commit of an expired reservation succeeded")
	}
	if e.cached(kw) != 0 {
		t.Fatal("expired reservation was published")
	}
	if s := e.mod.Stats(); s.PendingWrites != 0 || s.Expired != 2 {
		t.Fatalf("stats %+v", s)
	}
	if len(e.eventsOf(workers.EventExpired)) == 0 {
		t.Fatal("expiry not reported")
	}
}

func TestCloseDiscardsPending(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	k := key(tokens(testChunk, 1), 0, testChunk)
	e.mod.PrepareStore(k, 1)
	e.mod.Close()
	if e.cached(k) != 0 || e.layouts.Has("m", 1) {
		t.Fatal("Close left a reservation or a layout")
	}
	if _, err := e.mod.RegisterThrough(payload(3), nil, ""); err == nil {
		t.Fatal("closed module registered")
	}
	e.mod.Close() // idempotent
}

func TestHandlers(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	hs := e.mod.Handlers()
	for _, n := range []string{protocol.RegisterKVCacheNonGPUContext, protocol.UnregisterKVCache,
		protocol.UnregisterKVCacheNonGPUContext, protocol.PrepareStore, protocol.CommitStore,
		protocol.PrepareRetrieve, protocol.CommitRetrieve} {
		if hs[n] == nil {
			t.Fatalf("no handler for %s", n)
		}
	}
	call := func(name string, args ...any) (any, error) {
		return hs[name](context.Background(), &rpc.Request{Name: name, Args: args})
	}
	v, err := call(protocol.RegisterKVCacheNonGPUContext, payload(1))
	if err != nil || v.(protocol.RegisterResponse).ShmName != e.mod.PoolInfo().ShmName {
		t.Fatalf("register via handler = %v, %v", v, err)
	}
	k := key(tokens(testChunk, 1), 0, testChunk)
	v, err = call(protocol.PrepareStore, k, int64(1))
	if ps, ok := v.(protocol.PrepareStoreResponse); err != nil || !ok || len(ps.Slots) != 1 {
		t.Fatalf("prepare via handler = %v, %v", v, err)
	}
	v, err = call(protocol.CommitStore, k, int64(1), []byte{})
	if err != nil || v != true {
		t.Fatalf("commit via handler = %v, %v", v, err)
	}
	bad := [][]any{
		{},
		{k},
		{k, "1"},
		{int64(1), int64(1)},
		{k, int64(1), []byte{}, int64(4)},
	}
	for _, args := range bad {
		for _, n := range []string{protocol.PrepareStore, protocol.CommitStore, protocol.PrepareRetrieve, protocol.CommitRetrieve} {
			if _, err := call(n, args...); err == nil {
				t.Errorf("%s%v accepted", n, args)
			}
		}
	}
	if _, err := call(protocol.CommitStore, k, int64(1), "bytes?"); err == nil {
		t.Error("string as bytes accepted")
	}
	if _, err := call(protocol.RegisterKVCacheNonGPUContext, "x"); err == nil {
		t.Error("bad payload accepted")
	}
	noWorker := k
	noWorker.WorkerID = nil
	if _, err := call(protocol.PrepareStore, noWorker, int64(1)); err == nil {
		t.Error("nil worker_id accepted")
	}
	otherModel := k
	otherModel.ModelName = "other"
	if _, err := call(protocol.PrepareStore, otherModel, int64(1)); err == nil {
		t.Error("key of another model accepted")
	}
	if v, err := call(protocol.PrepareStore, k, int64(99)); err != nil || v.(protocol.PrepareStoreResponse).Shm {
		t.Errorf("unregistered instance = %v, %v; want its failure reply, an empty context", v, err)
	}
	if len(e.eventsOf(workers.EventError)) == 0 {
		t.Error("handler errors not reported")
	}
	v, err = call(protocol.UnregisterKVCache, int64(1))
	if v != nil || err != nil {
		t.Fatalf("unregister = %v, %v; want no reply", v, err)
	}
	v, err = call(protocol.UnregisterKVCacheNonGPUContext, int64(42))
	if v != nil || err != nil {
		t.Fatalf("unregister unknown = %v, %v; want no reply, no error", v, err)
	}
}

func TestStatus(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(5)
	e.register(3)
	st := e.mod.Status()
	ids := st["registered_non_cuda_instance_ids"].([]int64)
	if fmt.Sprint(ids) != "[3 5]" {
		t.Fatalf("ids %v", ids)
	}
	meta := st["non_cuda_context_meta"].(map[string]any)["5"].(map[string]any)
	if meta["model_name"] != "m" || meta["world_size"] != 1 || meta["block_size"] != 8 || meta["use_mla"] != false {
		t.Fatalf("meta %v", meta)
	}
}

func TestConcurrentInstances(t *testing.T) {
	e := newEnv(t, true, 4<<20)
	var wg sync.WaitGroup
	for id := int64(1); id <= 4; id++ {
		e.register(id)
		wg.Add(1)
		go func(id int64) {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				k := key(tokens(testChunk, uint32(id*1000+int64(i))), 0, testChunk)
				k.RequestID = fmt.Sprint(id, "-", i)
				r, err := e.mod.PrepareStore(k, id)
				if err != nil {
					t.Error(err)
					return
				}
				for _, s := range r.Slots {
					fill(view(t, e.pool, s.Offset, s.Length), byte(i))
				}
				if ok, err := e.mod.CommitStore(k, id, nil); err != nil || ok != (len(r.Slots) > 0) {
					t.Errorf("commit %v %v", ok, err)
				}
			}
			if id == 4 {
				e.mod.Unregister(id)
			}
		}(id)
	}
	wg.Wait()
	if s := e.mod.Stats(); s.PendingWrites != 0 || s.Instances != 3 {
		t.Fatalf("stats %+v", s)
	}
}

func TestLateSweepLeavesPoolLocksAlone(t *testing.T) {
	// Swept after the pool's read lock expired and another LOOKUP locked the
	// key again, an entry's release must not take the new lock.
	e := newEnv(t, true, 1<<20)
	e.register(1)
	k := key(tokens(testChunk, 1), 0, testChunk)
	e.mod.PrepareStore(k, 1)
	e.mod.CommitStore(k, 1, nil)
	ks := e.lookupLock(k)
	if r, _ := e.mod.PrepareRetrieve(k, 1); !r.Success {
		t.Fatal("retrieve missed")
	}
	e.clk.Advance(301 * time.Second) // past the pool's read TTL
	if n := e.pool.ReserveReadPrefix(ks, 1); n != len(ks) {
		t.Fatal("relock failed")
	}
	e.mod.Sweep()
	if s := e.mod.Stats(); s.PendingReads != 0 || s.Expired != 1 {
		t.Fatalf("stats %+v", s)
	}
	if !e.pool.IsLocked(ks[0]) {
		t.Fatal("the late sweep released a lock it no longer owned")
	}
}

func TestLateCommitRetrieveLeavesNewLockAlone(t *testing.T) {
	// The LOOKUP's lock was taken long before PREPARE_RETRIEVE, so the pool
	// expires it before the module thinks its entry is old. A commit after
	// that must not release the lock a newer LOOKUP took on the same key.
	e := newEnv(t, true, 1<<20)
	e.register(1)
	k := key(tokens(testChunk, 1), 0, testChunk)
	e.mod.PrepareStore(k, 1)
	e.mod.CommitStore(k, 1, nil)
	ks := e.lookupLock(k) // t = 0: the pool's read lock ends at 300 s
	e.clk.Advance(200 * time.Second)
	if r, _ := e.mod.PrepareRetrieve(k, 1); !r.Success {
		t.Fatal("retrieve missed")
	}
	e.clk.Advance(101 * time.Second) // 301 s: the lock expired; the entry is 101 s old
	if n := e.pool.ReserveReadPrefix(ks, 1); n != len(ks) {
		t.Fatal("relock failed")
	}
	if ok, err := e.mod.CommitRetrieve(k, 1); !ok || err != nil {
		t.Fatalf("commit retrieve %v %v", ok, err)
	}
	if !e.pool.IsLocked(ks[0]) {
		t.Fatal("a late COMMIT_RETRIEVE released the lock of a newer LOOKUP")
	}
}
