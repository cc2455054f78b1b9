package rpc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/core/rpc/client"
	"kvdock/core/testkit/logbuf"
	"kvdock/core/testkit/poll"
	"kvdock/core/testkit/profiles"
)

func profile(t testing.TB, name string) *protocol.Profile {
	t.Helper()
	p := profiles.Load(t, name)
	return p
}

// statsLimit bounds a wait for the server's counters to show what a test
// sent over loopback; it only ends a failing test, and a loaded -race CI run
// can take seconds to schedule the server's goroutines.
const statsLimit = 10 * time.Second

type harness struct {
	srv    *rpc.Server
	cancel context.CancelFunc
	done   chan error
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// start serves opts (port 0) with the management handlers every test uses.
func start(t testing.TB, opts rpc.Options) *harness {
	t.Helper()
	if opts.Profile == nil {
		opts.Profile = profile(t, "nongpu-v1")
	}
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	opts.Host = "localhost"
	srv, err := rpc.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Handle(protocol.Noop, func(context.Context, *rpc.Request) (any, error) { return "OK", nil })
	srv.Handle(protocol.GetChunkSize, func(context.Context, *rpc.Request) (any, error) { return 256, nil })
	srv.Handle(protocol.Ping, func(context.Context, *rpc.Request) (any, error) { return true, nil })
	srv.Handle(protocol.Clear, func(context.Context, *rpc.Request) (any, error) { return nil, nil })
	// Bound before Serve runs: the endpoint is known on return.
	if err := srv.Bind(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{srv: srv, cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-h.done:
			if err != nil {
				t.Errorf("Serve returned %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after cancel")
		}
	})
	return h
}

func dial(t testing.TB, h *harness) *client.Client {
	t.Helper()
	c, err := client.Dial(h.srv.Endpoint(), h.srv.Profile(), client.Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawDealer is a bare DEALER for frame-level tests.
func rawDealer(t testing.TB, endpoint string) *zmq.Socket {
	t.Helper()
	s, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.SetLinger(0)
	_ = s.SetRcvtimeo(2 * time.Second)
	if err := s.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func enc(t testing.TB, v any) []byte {
	b, err := protocol.Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sendFrames(t testing.TB, s *zmq.Socket, frames ...[]byte) {
	t.Helper()
	for i, f := range frames {
		flag := zmq.SNDMORE
		if i == len(frames)-1 {
			flag = 0
		}
		if _, err := s.SendBytes(f, flag); err != nil {
			t.Fatal(err)
		}
	}
}

func TestManagementRequests(t *testing.T) {
	h := start(t, rpc.Options{})
	c := dial(t, h)
	ctx := context.Background()
	r, err := c.Call(ctx, "NOOP")
	var s string
	if err != nil || r.Decode(&s) != nil || s != "OK" {
		t.Fatalf("NOOP: %v %v %q", r, err, s)
	}
	var n int
	if r, err = c.Call(ctx, "GET_CHUNK_SIZE"); err != nil || r.Decode(&n) != nil || n != 256 {
		t.Fatalf("GET_CHUNK_SIZE: %v %v", n, err)
	}
	var b bool
	if r, err = c.Call(ctx, "PING"); err != nil || r.Decode(&b) != nil || !b {
		t.Fatalf("PING: %v %v", b, err)
	}
	if r, err = c.Call(ctx, "CLEAR"); err != nil || r.Present {
		t.Fatalf("CLEAR must answer without a result frame: %+v %v", r, err)
	}
	st := h.srv.Stats()
	if st.Requests["NOOP"].OK != 1 || st.Requests["CLEAR"].OK != 1 || st.Requests["NOOP"].Count != 1 {
		t.Errorf("stats %+v", st.Requests)
	}
	if !strings.HasPrefix(st.Endpoint, "tcp://127.0.0.1:") {
		t.Errorf("endpoint %q", st.Endpoint)
	}
}

func TestFrameLayoutEchoesUIDAndTypeVerbatim(t *testing.T) {
	h := start(t, rpc.Options{})
	d := rawDealer(t, h.srv.Endpoint())
	// Non-shortest encodings must come back byte for byte, not re-encoded.
	uid := []byte{0xcf, 0, 0, 0, 0, 0, 0, 0, 42}
	typ := []byte{0xcd, 0, 19}
	sendFrames(t, d, uid, typ)
	msg, err := d.RecvMessageBytes(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(msg) != 3 || !bytes.Equal(msg[0], uid) || !bytes.Equal(msg[1], typ) || !bytes.Equal(msg[2], enc(t, "OK")) {
		t.Fatalf("reply % x", msg)
	}
	// None → exactly [uid, type].
	sendFrames(t, d, enc(t, 7), enc(t, 15))
	msg, err = d.RecvMessageBytes(0)
	if err != nil || len(msg) != 2 {
		t.Fatalf("CLEAR reply %q %v", msg, err)
	}
}

func TestManyOutstandingMatchedByUID(t *testing.T) {
	const n = 100
	h := start(t, rpc.Options{SharedWorkers: n})
	var mu sync.Mutex
	gate := make(chan struct{})
	entered := make(chan struct{}, n)
	h.srv.Handle(protocol.QueryPrefetchStatus, func(_ context.Context, r *rpc.Request) (any, error) {
		entered <- struct{}{}
		<-gate // hold all of them so they are truly outstanding together
		mu.Lock()
		defer mu.Unlock()
		var n int
		fmt.Sscanf(r.Args[0].(string), "req-%d", &n)
		return n, nil
	})
	c := dial(t, h)
	var wg sync.WaitGroup
	var bad atomic.Int64
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.Call(context.Background(), "QUERY_PREFETCH_STATUS", fmt.Sprintf("req-%d", i))
			var n int
			if err != nil || r.Decode(&n) != nil || n != i {
				bad.Add(1)
			}
		}()
	}
	// Every request is inside its handler (one worker each) before any
	// reply is released.
	for range n {
		<-entered
	}
	close(gate)
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d of %d replies missing or mismatched", bad.Load(), n)
	}
}

func TestOrderedPerPeerFIFO(t *testing.T) {
	h := start(t, rpc.Options{OrderedWorkers: 3})
	var mu sync.Mutex
	seen := map[string][]int64{}
	var running, maxRunning atomic.Int64
	h.srv.Handle(protocol.PrepareStore, func(_ context.Context, r *rpc.Request) (any, error) {
		cur := running.Add(1)
		defer running.Add(-1)
		for {
			m := maxRunning.Load()
			if cur <= m || maxRunning.CompareAndSwap(m, cur) {
				break
			}
		}
		seq := r.Args[1].(int64)
		// Later requests sleep less: a non-FIFO dispatcher would reorder them.
		time.Sleep(time.Duration(20-seq%20) * 100 * time.Microsecond)
		mu.Lock()
		seen[string(r.Peer)] = append(seen[string(r.Peer)], seq)
		mu.Unlock()
		return protocol.PrepareStoreResponse{}, nil
	})
	key := protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: []uint32{1}, RequestID: "r"}
	const peers, per = 6, 40
	var wg sync.WaitGroup
	for p := range peers {
		d := rawDealer(t, h.srv.Endpoint())
		_ = d.SetIdentity(fmt.Sprintf("peer-%d", p))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				sendFrames(t, d, enc(t, i), enc(t, 11), enc(t, key), enc(t, int64(i)))
			}
			for range per {
				if _, err := d.RecvMessageBytes(0); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != peers {
		t.Fatalf("%d peers seen", len(seen))
	}
	for peer, seqs := range seen {
		for i, s := range seqs {
			if s != int64(i) {
				t.Fatalf("%s: order %v", peer, seqs)
			}
		}
	}
	if maxRunning.Load() < 2 {
		t.Errorf("ordered workers never ran in parallel (max %d)", maxRunning.Load())
	}
}

func noopWithin(t *testing.T, c *client.Client, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if _, err := c.Call(ctx, "NOOP"); err != nil {
		t.Fatalf("NOOP after bad input: %v", err)
	}
}

func TestBadInputCountedAndLoopSurvives(t *testing.T) {
	var logs bytes.Buffer
	var logMu sync.Mutex
	h := start(t, rpc.Options{MaxMessageBytes: 1 << 20, Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil))})
	h.srv.Handle(protocol.EndSession, func(context.Context, *rpc.Request) (any, error) { return nil, errors.New("boom") })
	h.srv.Handle(protocol.Lookup, func(context.Context, *rpc.Request) (any, error) { panic("kaboom") })
	c := dial(t, h)
	d := rawDealer(t, h.srv.Endpoint())
	key := protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: []uint32{1}, RequestID: "r"}
	cases := []struct {
		name   string
		frames [][]byte
		kind   string
	}{
		{"one frame", [][]byte{enc(t, 1)}, protocol.KindShort},
		{"garbage type", [][]byte{enc(t, 1), []byte("garbage")}, protocol.KindBadHeader},
		{"type 250", [][]byte{enc(t, 1), enc(t, 250)}, protocol.KindUnknownType},
		{"wrong arity", [][]byte{enc(t, 1), enc(t, 19), enc(t, 1)}, protocol.KindArity},
		{"not msgpack", [][]byte{enc(t, 1), enc(t, 9), []byte{0xc1, 0xc1}}, protocol.KindPayload},
		{"handler error", [][]byte{enc(t, 1), enc(t, 9), enc(t, "sess")}, protocol.KindHandlerErr},
		{"handler panic", [][]byte{enc(t, 1), enc(t, 5), enc(t, key), enc(t, 1)}, protocol.KindPanic},
		{"no handler", [][]byte{enc(t, 1), enc(t, 11), enc(t, key), enc(t, 1)}, protocol.KindNoHandler},
		{"gpu store", [][]byte{enc(t, 1), enc(t, 3), []byte("ipc")}, protocol.KindCUDAUnsupported},
		{"total oversized", [][]byte{enc(t, 1), enc(t, 12), make([]byte, 600<<10), make([]byte, 600<<10)}, protocol.KindOversized},
	}
	for _, tc := range cases {
		before := h.srv.Stats().BadInput[tc.kind]
		sendFrames(t, d, tc.frames...)
		noopWithin(t, c, time.Second)
		poll.Until(t, statsLimit, tc.name+" counter", func() bool { return h.srv.Stats().BadInput[tc.kind] == before+1 })
	}
	// Nothing was answered on the raw dealer.
	_ = d.SetRcvtimeo(100 * time.Millisecond)
	if msg, err := d.RecvMessageBytes(0); err == nil {
		t.Errorf("bad input was answered: %q", msg)
	}
	st := h.srv.Stats()
	if st.Requests["END_SESSION"].Error != 1 || st.Requests["LOOKUP"].Error != 1 || st.Requests["NOOP"].Dropped != 1 {
		t.Errorf("outcomes %+v", st.Requests)
	}
	if st.DecodeFailures["NOOP"] != 1 || st.DecodeFailures["END_SESSION"] != 1 {
		t.Errorf("decode failures %v", st.DecodeFailures)
	}
	// A frame over ZMQ_MAXMSGSIZE: libzmq drops the connection.
	before := h.srv.Stats().Disconnects
	big := rawDealer(t, h.srv.Endpoint())
	sendFrames(t, big, enc(t, 1), enc(t, 12), make([]byte, 2<<20))
	poll.Until(t, statsLimit, "disconnect after oversized frame", func() bool { return h.srv.Stats().Disconnects > before })
	noopWithin(t, c, time.Second)

	logMu.Lock()
	out := logs.String()
	logMu.Unlock()
	for _, want := range []string{"protocol mismatch suspected (profile nongpu-v1, type 19 decoded as NOOP failed",
		"GPU-path request dropped", "kind=unknown_type", "peer="} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

func TestBadInputLogsAreRateLimited(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	h := start(t, rpc.Options{Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))})
	c := dial(t, h)
	d := rawDealer(t, h.srv.Endpoint())
	for range 20 {
		sendFrames(t, d, enc(t, 1), enc(t, 250))
	}
	noopWithin(t, c, time.Second)
	poll.Until(t, statsLimit, "20 unknown types", func() bool { return h.srv.Stats().BadInput[protocol.KindUnknownType] == 20 })
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logs.String(), "kind=unknown_type"); n != 1 {
		t.Errorf("%d log lines for 20 bad requests from one peer, want 1", n)
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestErrorsNotAnsweredInSeedProfile(t *testing.T) {
	h := start(t, rpc.Options{})
	h.srv.Handle(protocol.EndSession, func(context.Context, *rpc.Request) (any, error) { return nil, errors.New("boom") })
	c, err := client.Dial(h.srv.Endpoint(), h.srv.Profile(), client.Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Call(context.Background(), "END_SESSION", "x"); !errors.Is(err, client.ErrTimeout) {
		t.Fatalf("want timeout, got %v", err)
	}
}

func TestErrorMarkerProfile(t *testing.T) {
	p, err := protocol.Parse([]byte(`name: marker
error_marker: true
requests:
  - {name: NOOP, number: 1, payload: [], result: str, class: inline, handler: NOOP}
  - {name: END_SESSION, number: 2, payload: [str], result: none, class: shared, handler: END_SESSION}
`))
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, rpc.Options{Profile: p})
	h.srv.Handle(protocol.EndSession, func(context.Context, *rpc.Request) (any, error) { return nil, errors.New("boom") })
	c := dial(t, h)
	_, err = c.Call(context.Background(), "END_SESSION", "x")
	var re *client.RemoteError
	if !errors.As(err, &re) || re.Type != "HandlerError" || re.Message != "boom" {
		t.Fatalf("want marker error, got %v", err)
	}
}

func TestBindErrorReturnedPromptly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	srv, err := rpc.New(rpc.Options{Port: port, Profile: profile(t, "nongpu-v1"), Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	err = srv.Serve(context.Background())
	want := fmt.Sprintf("bind tcp://127.0.0.1:%d: address already in use", port)
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
	if time.Since(t0) > time.Second {
		t.Errorf("bind error took %v", time.Since(t0))
	}
}

func TestGracefulDrain(t *testing.T) {
	var logs logbuf.Buffer
	h := start(t, rpc.Options{DrainTimeout: 3 * time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	started := make(chan struct{})
	release := make(chan struct{})
	h.srv.Handle(protocol.Ping, func(ctx context.Context, _ *rpc.Request) (any, error) {
		close(started)
		<-release // until the server has stopped reading and drains
		return ctx.Err() == nil, nil
	})
	c := dial(t, h)
	res := make(chan error, 1)
	go func() {
		r, err := c.Call(context.Background(), "PING")
		var ok bool
		if err == nil {
			if err = r.Decode(&ok); err == nil && !ok {
				err = errors.New("handler context was cancelled during drain")
			}
		}
		res <- err
	}()
	<-started
	h.cancel()
	if err := logs.Wait("rpc server draining", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-res; err != nil {
		t.Fatalf("in-flight reply lost on shutdown: %v", err)
	}
	select {
	case err := <-h.done:
		h.done <- err // for the cleanup
	case <-time.After(3 * time.Second):
		t.Fatal("Serve did not return")
	}
}

type recObserver struct {
	mu   sync.Mutex
	seen []string
}

func (o *recObserver) OnRequest(name, outcome string, _ time.Duration) {
	o.mu.Lock()
	o.seen = append(o.seen, name+"/"+outcome)
	o.mu.Unlock()
}

func TestObserverAndRegisterPayload(t *testing.T) {
	obs := &recObserver{}
	h := start(t, rpc.Options{Observer: obs, Profile: profile(t, "engine-driven")})
	h.srv.Handle(protocol.RegisterKVCacheNonGPUContext, func(_ context.Context, r *rpc.Request) (any, error) {
		p := r.Args[0].(protocol.RegisterPayload)
		return protocol.RegisterResponse{ShmName: "lmcache_l1_pool_" + p.ModelName, PoolSize: 4096}, nil
	})
	c := dial(t, h)
	r, err := c.Call(context.Background(), "REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT",
		protocol.RegisterPayload{InstanceID: 1, ModelName: "x", WorldSize: 1, DtypeStr: "float16"})
	var resp struct {
		ShmName  string `msgpack:"shm_name"`
		PoolSize int64  `msgpack:"pool_size"`
	}
	if err != nil || r.Decode(&resp) != nil || resp.ShmName != "lmcache_l1_pool_x" || resp.PoolSize != 4096 {
		t.Fatalf("register: %+v %v", resp, err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.seen) != 1 || obs.seen[0] != "REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT/ok" {
		t.Errorf("observer saw %v", obs.seen)
	}
}

func TestTuneMalloc(t *testing.T) {
	tn := rpc.TuneMalloc()
	if tn.TrimThreshold != 1<<30 || tn.MmapThreshold < 32<<20 || tn.ArenaMax != 1 {
		t.Fatalf("TuneMalloc: %v", tn)
	}
}

// TestScavengeDue walks the scavenger's decision through traffic, a lull
// and a burst: freed memory goes back once per lull after traffic that left
// at least ScavengeQuiet behind, at once after a burst, and never while
// nothing happens or for a lull's crumbs.
func TestScavengeDue(t *testing.T) {
	var d rpc.ScavengeDue
	mib := int64(1 << 20)
	steps := []struct {
		what              string
		msgs, moved, free int64
		run, lull         bool
		freed             bool
	}{
		{what: "no message yet", msgs: 0, moved: 0, free: 8 * mib},
		{what: "still none", msgs: 0, moved: 0, free: 8 * mib},
		{what: "traffic", msgs: 50, moved: 6 * mib, free: 8 * mib},
		{what: "more traffic", msgs: 90, moved: 12 * mib, free: 8 * mib},
		{what: "a lull after it", msgs: 90, moved: 12 * mib, free: 8 * mib, run: true, lull: true, freed: true},
		{what: "the lull goes on", msgs: 90, moved: 0, free: 8 * mib},
		{what: "traffic again, small leftovers", msgs: 95, moved: 0, free: mib},
		{what: "a lull, crumbs only", msgs: 95, moved: 0, free: mib},
		{what: "a burst of large messages", msgs: 300, moved: rpc.ScavengeAfter, free: 0, run: true, freed: true},
		{what: "a burst held in the Go heap", msgs: 310, moved: 0, free: rpc.ScavengeAfter, run: true, freed: true},
		{what: "a lull right after the burst's scavenge", msgs: 310, moved: 0, free: 5 * mib},
		{what: "traffic", msgs: 320, moved: 0, free: 5 * mib},
		{what: "a lull, the server busy (not scavenged)", msgs: 320, moved: 0, free: 5 * mib, run: true, lull: true},
		{what: "still due", msgs: 320, moved: 0, free: 5 * mib, run: true, lull: true, freed: true},
		{what: "after that, nothing", msgs: 320, moved: 0, free: 5 * mib},
	}
	for _, s := range steps {
		run, lull := d.Tick(s.msgs, s.moved, s.free)
		if run != s.run || lull != s.lull {
			t.Fatalf("%s: run %v lull %v, want run %v lull %v", s.what, run, lull, s.run, s.lull)
		}
		if s.freed {
			d.Freed()
		}
	}
}

// TestSpareProc: one P more than the runtime chose, unless GOMAXPROCS is
// set (then nothing changes).
func TestSpareProc(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(before) })
	if got := rpc.SpareProc(func(string) string { return "3" }); got != before || runtime.GOMAXPROCS(0) != before {
		t.Fatalf("with GOMAXPROCS set: %d (runtime %d), want %d unchanged", got, runtime.GOMAXPROCS(0), before)
	}
	if got := rpc.SpareProc(func(string) string { return "" }); got != before+1 || runtime.GOMAXPROCS(0) != before+1 {
		t.Fatalf("without GOMAXPROCS: %d (runtime %d), want %d", got, runtime.GOMAXPROCS(0), before+1)
	}
}
