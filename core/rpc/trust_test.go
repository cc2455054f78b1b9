package rpc_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/core/testkit/logbuf"
	"kvdock/core/testkit/poll"
)

// The peer of the memory tests runs in a child process (this test binary),
// so its own libzmq buffers do not count in the server's RSS.
const peerEnv = "KVDOCK_RPC_TEST_PEER"

// TestHelperPeer is the child: it connects a DEALER that reads nothing
// (receive HWM 1, small kernel buffer), sends the requests it was told to,
// prints "sent" and waits for stdin to close.
func TestHelperPeer(t *testing.T) {
	spec := os.Getenv(peerEnv)
	if spec == "" {
		t.Skip("child process of the memory tests")
	}
	var ep string
	var count, size, first int
	if _, err := fmt.Sscanf(spec, "%s %d %d %d", &ep, &count, &size, &first); err != nil {
		t.Fatalf("peer spec %q: %v", spec, err)
	}
	d, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	_ = d.SetLinger(0)
	_ = d.SetRcvhwm(1)
	_ = d.SetRcvbuf(64 << 10)
	if err := d.Connect(ep); err != nil {
		t.Fatal(err)
	}
	typ, _ := protocol.Encode(6) // QUERY_PREFETCH_STATUS, shared, [str]
	if first > 0 {
		// One small request first (one the handler accepts).
		uid, _ := protocol.Encode(0)
		if _, err := d.SendMessage(uid, typ, strEncoded(first)); err != nil {
			t.Fatal(err)
		}
	}
	payload := strEncoded(size)
	for i := range count {
		uid, _ := protocol.Encode(i + 1)
		if _, err := d.SendMessage(uid, typ, payload); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Println("sent")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
}

// strEncoded is a msgpack str of n bytes.
func strEncoded(n int) []byte {
	b, _ := protocol.Encode(strings.Repeat("a", n))
	return b
}

type peerProc struct {
	cmd   *exec.Cmd
	stdin interface{ Close() error }
}

func startPeer(t *testing.T, ep string, count, size, first int) *peerProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperPeer$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d %d", peerEnv, ep, count, size, first))
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &peerProc{cmd: cmd, stdin: in}
	t.Cleanup(p.stop)
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if sc.Text() == "sent" {
			go func() {
				for sc.Scan() {
				}
			}()
			return p
		}
	}
	t.Fatalf("peer process ended before sending: %v", sc.Err())
	return nil
}

func (p *peerProc) stop() {
	if p.stdin != nil {
		_ = p.stdin.Close()
		p.stdin = nil
		_ = p.cmd.Wait()
	}
}

// rssKiB reads this process's resident set size.
func rssKiB(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	t.Skip("no VmRSS")
	return 0
}

// peakSampler records the highest RSS seen until stop.
type peakSampler struct {
	peak atomic.Int64
	last atomic.Int64 // when peak last rose (unix nano)
	quit chan struct{}
	done chan struct{}
}

func samplePeak(t *testing.T) *peakSampler {
	s := &peakSampler{quit: make(chan struct{}), done: make(chan struct{})}
	s.peak.Store(rssKiB(t))
	s.last.Store(time.Now().UnixNano())
	go func() {
		defer close(s.done)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.quit:
				return
			case <-tick.C:
				if v := rssKiB(t); v > s.peak.Load() {
					s.peak.Store(v)
					s.last.Store(time.Now().UnixNano())
				}
			}
		}
	}()
	return s
}

// settled waits until the peak has not risen for quiet (at most max): the
// attack has had its full effect on memory before the test lets it drain.
func (s *peakSampler) settled(quiet, max time.Duration) {
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) && time.Since(time.Unix(0, s.last.Load())) < quiet {
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *peakSampler) stop() int64 {
	close(s.quit)
	<-s.done
	return s.peak.Load()
}

func baselineRSS(t *testing.T) int64 {
	runtime.GC()
	debug.FreeOSMemory()
	return rssKiB(t)
}

// TestSlowReaderRepliesBounded: a peer sends 40 requests whose 8 MiB
// replies it never reads. libzmq alone would queue every reply (SNDHWM
// counts messages, not bytes): +320 MiB. What libzmq holds for the peer and
// what waits here are bounded together by the peer's reply budget (one
// reply when that is larger); the rest is dropped before it is copied and
// counted, and another peer is still answered.
func TestSlowReaderRepliesBounded(t *testing.T) {
	const n, size, budget = 40, 8 << 20, 16 << 20
	body, err := protocol.Encode(make([]byte, size))
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, rpc.Options{ReplyBytesPerPeer: budget, ReplyBytes: 4 * budget})
	h.srv.Handle(protocol.QueryPrefetchStatus, func(context.Context, *rpc.Request) (any, error) {
		return protocol.Raw(body), nil // one shared buffer: only the sends cost memory
	})
	c := dial(t, h)
	noopWithin(t, c, 2*time.Second)

	base := baselineRSS(t)
	s := samplePeak(t)
	peer := startPeer(t, h.srv.Endpoint(), n, 1, 0)
	poll.Until(t, statsLimit, "all requests handled", func() bool { return h.srv.Stats().Requests["QUERY_PREFETCH_STATUS"].OK == n })
	s.settled(300*time.Millisecond, 5*time.Second)
	noopWithin(t, c, 2*time.Second) // another peer is served meanwhile
	peak := s.stop()
	st := h.srv.Stats()
	growth := peak - base
	t.Logf("%d replies of %d MiB never read: RSS %d -> peak %d KiB (+%d MiB); dropped %d, waiting %d bytes",
		n, size>>20, base, peak, growth>>10, st.RepliesDropped, st.WaitingReplyBytes)
	if st.RepliesDropped == 0 {
		t.Error("no reply dropped although the peer read nothing")
	}
	if st.WaitingReplyBytes > budget+size {
		t.Errorf("%d reply bytes waiting, budget %d", st.WaitingReplyBytes, budget)
	}
	if growth > 80<<10 {
		t.Errorf("RSS grew %d MiB for %d MiB of unread replies; bound 80 MiB", growth>>10, n*size>>20)
	}
	// Once the peer is gone, nothing stays waiting for it.
	peer.stop()
	noopWithin(t, c, 2*time.Second)
	poll.Until(t, statsLimit, "waiting replies released", func() bool { return h.srv.Stats().WaitingReplyBytes == 0 })
}

// TestQueuedRequestBytesBounded: a peer sends 40 × 8 MiB requests behind a
// busy worker. Reading and queueing them all would hold +320 MiB; the
// server stops reading once the peer's queued bytes pass the budget, the
// rest waits in libzmq (RecvHWM messages) and TCP, and every request is
// still served once the worker is free.
func TestQueuedRequestBytesBounded(t *testing.T) {
	const n, size = 40, 8 << 20
	h := start(t, rpc.Options{QueuedRequestBytes: 32 << 20, PeerQueuedRequestBytes: 16 << 20, RecvHWM: 4,
		MaxMessageBytes: 64 << 20})
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	h.srv.Handle(protocol.QueryPrefetchStatus, func(context.Context, *rpc.Request) (any, error) {
		select {
		case entered <- struct{}{}:
			<-release
		default:
		}
		return nil, nil
	})
	base := baselineRSS(t)
	s := samplePeak(t)
	startPeer(t, h.srv.Endpoint(), n, size, 1)
	<-entered
	// Generous limits: they only bound a failure, and a loaded machine
	// moves 320 MiB through loopback ZMQ slowly.
	poll.Until(t, 10*time.Second, "the budget to stop reading", func() bool { return h.srv.Stats().BudgetWaits > 0 })
	s.settled(300*time.Millisecond, 5*time.Second)
	queued := h.srv.Stats().QueuedRequestBytes
	close(release)
	// Every request is answered in the end (here: dropped as undecodable,
	// an 8 MiB str is over the 256-byte cap): none was lost to the budget.
	poll.Until(t, 15*time.Second, "all requests processed", func() bool {
		r := h.srv.Stats().Requests["QUERY_PREFETCH_STATUS"]
		return r.OK+r.Dropped == n+1
	})

	peak := s.stop()
	growth := peak - base
	t.Logf("%d requests of %d MiB behind a busy worker: RSS %d -> peak %d KiB (+%d MiB); %d bytes queued while reading stopped",
		n, size>>20, base, peak, growth>>10, queued)
	if queued > 16<<20+size {
		t.Errorf("%d bytes queued for one peer, budget %d", queued, 16<<20)
	}
	// Bound: the budget and the message it holds (24 MiB), RecvHWM messages
	// in libzmq and the one it is reading (40 MiB), and room for frames Go
	// has yet to collect.
	if growth > 128<<10 {
		t.Errorf("RSS grew %d MiB for %d MiB of queued requests; bound 128 MiB", growth>>10, n*size>>20)
	}
}

// TestPollFailureEndsServe: a socket that can no longer be polled is not
// retried forever; Serve gives up after repeated failures and returns the
// error.
func TestPollFailureEndsServe(t *testing.T) {
	var broken atomic.Bool
	srv, err := rpc.New(rpc.Options{Host: "localhost", Profile: profile(t, "nongpu-v1"), Logger: quietLogger(),
		PollFault: func() error {
			if broken.Load() {
				return zmq.Errno(9) // EBADF
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Bind(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background()) }()
	broken.Store(true)
	// Wake the loop from its poll: the next poll is the failing one.
	sendFrames(t, rawDealer(t, srv.Endpoint()), enc(t, 1), enc(t, 19))
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "poll failed") {
			t.Fatalf("Serve returned %v, want a poll failure", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Serve did not return on a persistent poll failure")
	}
}

// TestBindSeparateFromServe: Bind reports a taken port itself; a server that
// was bound but never served releases its port on Shutdown.
func TestBindSeparateFromServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	srv, _ := rpc.New(rpc.Options{Port: port, Profile: profile(t, "nongpu-v1"), Logger: quietLogger()})
	if err := srv.Bind(); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Bind on a taken port: %v", err)
	}
	ln.Close()
	srv2, _ := rpc.New(rpc.Options{Port: port, Profile: profile(t, "nongpu-v1"), Logger: quietLogger()})
	if err := srv2.Bind(); err != nil {
		t.Fatalf("Bind: %v", err)
	}
	if srv2.Endpoint() != fmt.Sprintf("tcp://127.0.0.1:%d", port) {
		t.Errorf("endpoint %q", srv2.Endpoint())
	}
	if err := srv2.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown of a bound server: %v", err)
	}
	if err := srv2.Serve(context.Background()); err == nil {
		t.Error("Serve after Shutdown succeeded")
	}
	srv3, _ := rpc.New(rpc.Options{Port: port, Profile: profile(t, "nongpu-v1"), Logger: quietLogger()})
	if err := srv3.Bind(); err != nil {
		t.Fatalf("port not released by Shutdown: %v", err)
	}
	_ = srv3.Shutdown(context.Background())
}

// TestShutdownWaitsForHandlers (wire side): Serve and Shutdown report a
// handler still running (it may hold views of the pool) instead of
// returning nil, and HandlersDone says when it ends.
func TestShutdownWaitsForHandlers(t *testing.T) {
	srv, err := rpc.New(rpc.Options{Host: "localhost", Profile: profile(t, "nongpu-v1"), Logger: quietLogger(),
		DrainTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var running atomic.Bool
	srv.Handle(protocol.QueryPrefetchStatus, func(context.Context, *rpc.Request) (any, error) {
		running.Store(true)
		close(entered)
		<-release
		running.Store(false)
		return nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	<-srv.Bound()
	d := rawDealer(t, srv.Endpoint())
	sendFrames(t, d, enc(t, 1), enc(t, 6), enc(t, "req"))
	<-entered

	sctx, scancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	err = srv.Shutdown(sctx)
	scancel()
	if !errors.Is(err, rpc.ErrHandlersRunning) {
		t.Fatalf("Shutdown with a handler running: %v", err)
	}
	serveErr := <-served
	if serveErr == nil && running.Load() {
		t.Fatal("Serve returned nil while a handler was running")
	}
	if !errors.Is(serveErr, rpc.ErrHandlersRunning) {
		t.Fatalf("Serve: %v", serveErr)
	}
	select {
	case <-srv.HandlersDone():
		t.Fatal("HandlersDone closed while a handler runs")
	default:
	}
	close(release)
	select {
	case <-srv.HandlersDone():
	case <-time.After(5 * time.Second):
		t.Fatal("HandlersDone not closed after the handler returned")
	}
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown after the handler ended: %v", err)
	}
	cancel()
}

// TestShutdownDrainsInTime: a handler that ends within the drain gets its
// reply out and Shutdown returns nil.
func TestShutdownDrainsInTime(t *testing.T) {
	h := start(t, rpc.Options{DrainTimeout: 5 * time.Second})
	entered, release := make(chan struct{}), make(chan struct{})
	h.srv.Handle(protocol.QueryPrefetchStatus, func(context.Context, *rpc.Request) (any, error) {
		close(entered)
		<-release
		return int64(7), nil
	})
	d := rawDealer(t, h.srv.Endpoint())
	sendFrames(t, d, enc(t, 1), enc(t, 6), enc(t, "req"))
	<-entered
	res := make(chan error, 1)
	go func() { res <- h.srv.Shutdown(context.Background()) }()
	close(release)
	if err := <-res; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	msg, err := d.RecvMessageBytes(0)
	if err != nil || len(msg) != 3 || !bytes.Equal(msg[2], enc(t, 7)) {
		t.Fatalf("reply of the drained handler: %q %v", msg, err)
	}
}

// TestMessageCapAndTokenCapOverTheWire: the dynamic cap (MessageCap) drops a
// message over it (counted oversized), and a key over MaxTokensPerRequest is
// a decode error, while the server keeps serving.
func TestMessageCapAndTokenCapOverTheWire(t *testing.T) {
	var cap atomic.Int64
	cap.Store(1 << 20)
	h := start(t, rpc.Options{MessageCap: cap.Load, MaxTokensPerRequest: 1000, Profile: profile(t, "engine-driven")})
	var mu sync.Mutex
	var lookups int
	h.srv.Handle(protocol.Lookup, func(context.Context, *rpc.Request) (any, error) {
		mu.Lock()
		lookups++
		mu.Unlock()
		return nil, nil
	})
	c := dial(t, h)
	d := rawDealer(t, h.srv.Endpoint())
	big := make([]byte, 2<<20)
	sendFrames(t, d, enc(t, 1), enc(t, 6), big)
	poll.Until(t, statsLimit, "oversized counted", func() bool { return h.srv.Stats().BadInput[protocol.KindOversized] == 1 })
	cap.Store(4 << 20) // a registration raised the cap
	sendFrames(t, d, enc(t, 2), enc(t, 6), big)
	poll.Until(t, statsLimit, "decoded under the raised cap", func() bool { return h.srv.Stats().DecodeFailures["QUERY_PREFETCH_STATUS"] == 1 })

	key := func(n int) []byte {
		return enc(t, protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: make([]uint32, n), End: n, RequestID: "r"})
	}
	sendFrames(t, d, enc(t, 3), enc(t, 5), key(1001), enc(t, 0))
	poll.Until(t, statsLimit, "token cap", func() bool { return h.srv.Stats().DecodeFailures["LOOKUP"] == 1 })
	sendFrames(t, d, enc(t, 4), enc(t, 5), key(1000), enc(t, 0))
	poll.Until(t, statsLimit, "lookup at the cap", func() bool { mu.Lock(); defer mu.Unlock(); return lookups == 1 })
	noopWithin(t, c, 2*time.Second)
}

// TestHostilePayloadsOverTheWire: 8 MB of nested arrays under an unknown
// key (a recursive decoder overflows its stack, a fatal error), a 16 MiB
// model name and a 16 MiB request id are decode errors whose log lines do
// not carry the strings; the server keeps serving.
func TestHostilePayloadsOverTheWire(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	h := start(t, rpc.Options{Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, nil)),
		LogInterval: time.Nanosecond})
	h.srv.Handle(protocol.Lookup, func(context.Context, *rpc.Request) (any, error) { return nil, nil })
	c := dial(t, h)
	d := rawDealer(t, h.srv.Endpoint())
	key := func(extra ...any) []byte {
		var b bytes.Buffer
		e := msgpack.NewEncoder(&b)
		fields := append([]any{"model_name", "m", "world_size", 1, "token_ids", []int{1}, "start", 0, "end", 1,
			"request_id", "r"}, extra...)
		_ = e.EncodeMapLen(len(fields) / 2)
		for i := 0; i < len(fields); i += 2 {
			_ = e.EncodeString(fields[i].(string))
			if raw, ok := fields[i+1].([]byte); ok {
				b.Write(raw)
			} else {
				_ = e.Encode(fields[i+1])
			}
		}
		return b.Bytes()
	}
	deep := append(bytes.Repeat([]byte{0x91}, 8<<20), 0xc0)
	huge := strings.Repeat("M", 16<<20)
	start := time.Now()
	sendFrames(t, d, enc(t, 1), enc(t, 5), key("x", deep), enc(t, 0))
	sendFrames(t, d, enc(t, 2), enc(t, 5), key("model_name", huge), enc(t, 0))
	sendFrames(t, d, enc(t, 3), enc(t, 5), key("request_id", huge), enc(t, 0))
	poll.Until(t, statsLimit, "three decode failures", func() bool { return h.srv.Stats().DecodeFailures["LOOKUP"] == 3 })
	noopWithin(t, c, 2*time.Second)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("hostile payloads took %v", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := buf.Len(); n > 64<<10 || strings.Contains(buf.String(), "MMMM") {
		t.Errorf("%d bytes of log for three bad requests (peer strings logged?)", n)
	}
}

// TestShutdownWhileOverBudget: a server that stopped reading because the
// request budget is full still shuts down promptly (reporting the stuck
// handler), and the budget wait does not hold the drain.
func TestShutdownWhileOverBudget(t *testing.T) {
	srv, err := rpc.New(rpc.Options{Host: "localhost", Profile: profile(t, "nongpu-v1"), Logger: quietLogger(),
		QueuedRequestBytes: 1 << 20, PeerQueuedRequestBytes: 1 << 20, DrainTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	srv.Handle(protocol.QueryPrefetchStatus, func(context.Context, *rpc.Request) (any, error) {
		select {
		case entered <- struct{}{}:
			<-release
		default:
		}
		return nil, nil
	})
	defer close(release)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background()) }()
	<-srv.Bound()
	d := rawDealer(t, srv.Endpoint())
	sendFrames(t, d, enc(t, 0), enc(t, 6), enc(t, "a"))
	<-entered
	for i := range 4 {
		sendFrames(t, d, enc(t, i+1), enc(t, 6), strEncoded(700<<10))
	}
	poll.Until(t, statsLimit, "the budget to stop reading", func() bool { return srv.Stats().BudgetWaits > 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	if err := srv.Shutdown(ctx); !errors.Is(err, rpc.ErrHandlersRunning) {
		t.Fatalf("Shutdown with a stuck handler: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Shutdown took %v", d)
	}
	select {
	case err := <-served:
		if !errors.Is(err, rpc.ErrHandlersRunning) {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
}

// TestShutdownUnderBacklog (a rebuild under retrieve load): with requests
// queued behind a running handler, a Shutdown whose ctx ends must (1) drop
// the queued requests instead of running them, and (2) close the socket
// before it returns, so that a restart or a rollback can bind the port
// again at once. Otherwise the socket stays bound for the whole backlog's
// drain, the rollback of a rebuild fails with "address already in use" and
// the server is left without a wire server.
func TestShutdownUnderBacklog(t *testing.T) {
	srv, err := rpc.New(rpc.Options{Host: "localhost", Profile: profile(t, "nongpu-v1"), Logger: quietLogger(),
		DrainTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	srv.Handle(protocol.QueryPrefetchStatus, func(context.Context, *rpc.Request) (any, error) {
		if calls.Add(1) == 1 {
			close(entered)
			<-release
		}
		return int64(1), nil
	})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background()) }()
	<-srv.Bound()
	d := rawDealer(t, srv.Endpoint())
	const backlog = 50
	for i := range backlog {
		sendFrames(t, d, enc(t, i), enc(t, 6), enc(t, fmt.Sprint("req", i)))
	}
	<-entered
	// Every request is read (queued) before the stop.
	deadline := time.Now().Add(5 * time.Second)
	for srv.Stats().InFlight < backlog && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	t0 := time.Now()
	err = srv.Shutdown(sctx)
	scancel()
	if !errors.Is(err, rpc.ErrHandlersRunning) {
		t.Fatalf("Shutdown with a handler running: %v", err)
	}
	if d := time.Since(t0); d > 3*time.Second {
		t.Errorf("Shutdown took %v with a 100 ms ctx (the drain timeout is 10 s)", d)
	}
	port := strings.TrimPrefix(srv.Endpoint(), "tcp://127.0.0.1:")
	var p int
	fmt.Sscan(port, &p)
	again, _ := rpc.New(rpc.Options{Port: p, Profile: profile(t, "nongpu-v1"), Logger: quietLogger()})
	if err := again.Bind(); err != nil {
		t.Errorf("port not released when Shutdown returned: %v", err)
	}
	_ = again.Shutdown(context.Background())
	close(release)
	select {
	case <-srv.HandlersDone():
	case <-time.After(5 * time.Second):
		t.Fatal("HandlersDone not closed after the handler returned")
	}
	<-served
	if n := calls.Load(); n != 1 {
		t.Errorf("%d handlers ran; only the one running at the stop should (the %d queued are dropped)", n, backlog-1)
	}
	if st := srv.Stats(); st.InFlight != 0 {
		t.Errorf("%d requests still counted in flight after the drain", st.InFlight)
	}
}

// TestStopGraceAnswersRequestsStillArriving: a request that reaches the
// server just after its stop began, while another is still being handled,
// is read and answered within the stop's grace instead of dropped unread;
// with the grace off it gets no answer.
func TestStopGraceAnswersRequestsStillArriving(t *testing.T) {
	for _, tc := range []struct {
		name     string
		grace    time.Duration
		answered bool
	}{{"grace", 5 * time.Second, true}, {"no grace", 0, false}} {
		// The grace is far above the 10 ms a loaded CI run may stretch, and
		// costs nothing: the stop ends once no request is in flight.
		t.Run(tc.name, func(t *testing.T) {
			var logs logbuf.Buffer
			srv, err := rpc.New(rpc.Options{Host: "localhost", Profile: profile(t, "nongpu-v1"), Logger: slog.New(slog.NewTextHandler(&logs, nil)), StopGrace: tc.grace})
			if err != nil {
				t.Fatal(err)
			}
			entered, release := make(chan struct{}), make(chan struct{})
			srv.Handle(protocol.QueryPrefetchStatus, func(context.Context, *rpc.Request) (any, error) {
				close(entered)
				<-release
				return 1, nil
			})
			srv.Handle(protocol.Noop, func(context.Context, *rpc.Request) (any, error) { return "OK", nil })
			ctx, cancel := context.WithCancel(context.Background())
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ctx) }()
			<-srv.Bound()
			busy, late := rawDealer(t, srv.Endpoint()), rawDealer(t, srv.Endpoint())
			sendFrames(t, late, enc(t, 1), enc(t, 19)) // connect and get answered once first
			if _, err := late.RecvMessageBytes(0); err != nil {
				t.Fatalf("NOOP before the stop: %v", err)
			}
			sendFrames(t, busy, enc(t, 2), enc(t, 6), enc(t, "req"))
			<-entered
			cancel() // the stop begins while QUERY_PREFETCH_STATUS runs
			if tc.grace == 0 {
				// Without a grace the loop stops reading at once; a sleep
				// could end before a loaded scheduler ran the loop at all.
				if err := logs.Wait("rpc server draining", 10*time.Second); err != nil {
					t.Fatal(err)
				}
			} else {
				time.Sleep(10 * time.Millisecond)
			}
			sendFrames(t, late, enc(t, 3), enc(t, 19))
			// The reply is awaited while QUERY_PREFETCH_STATUS still runs:
			// with a grace the loop reads on, so a slow machine gets time.
			rcv := time.Second
			if tc.answered {
				rcv = 10 * time.Second
			}
			_ = late.SetRcvtimeo(rcv)
			_, err = late.RecvMessageBytes(0)
			close(release)
			if got := err == nil; got != tc.answered {
				t.Errorf("NOOP sent into the stop: answered %v (%v), want %v", got, err, tc.answered)
			}
			if err := <-served; err != nil {
				t.Fatalf("Serve: %v", err)
			}
		})
	}
}
