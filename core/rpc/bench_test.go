package rpc_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/core/rpc/client"
)

// rawEcho is the reference: a bare pebbe/zmq4 ROUTER echoing [id, uid, type]
// plus "OK", the least any ROUTER server can do per request.
func rawEcho(b *testing.B) (endpoint string, stop func()) {
	b.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		b.Fatal(err)
	}
	r, err := zctx.NewSocket(zmq.ROUTER)
	if err != nil {
		b.Fatal(err)
	}
	_ = r.SetLinger(0)
	if err := r.Bind("tcp://127.0.0.1:*"); err != nil {
		b.Fatal(err)
	}
	ep, _ := r.GetLastEndpoint()
	ok, _ := protocol.Encode("OK")
	var quit atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		poller := zmq.NewPoller()
		poller.Add(r, zmq.POLLIN)
		for !quit.Load() {
			polled, err := poller.Poll(20 * time.Millisecond)
			if err != nil || len(polled) == 0 {
				continue
			}
			for {
				msg, err := r.RecvMessageBytes(zmq.DONTWAIT)
				if err != nil {
					break
				}
				if len(msg) >= 3 {
					_, _ = r.SendMessage(msg[0], msg[1], msg[2], ok)
				}
			}
		}
	}()
	return ep, func() {
		quit.Store(true)
		<-done
		r.Close()
		zctx.Term()
	}
}

func kvdockNoop(b *testing.B) (endpoint string, stop func()) {
	b.Helper()
	p := profile(b, "nongpu-v1")
	srv, err := rpc.New(rpc.Options{Host: "127.0.0.1", Profile: p, Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	srv.Handle(protocol.Noop, func(context.Context, *rpc.Request) (any, error) { return "OK", nil })
	return serveBench(srv)
}

// serveBench serves srv and returns its endpoint, once bound, and the stop
// that ends Serve.
func serveBench(srv *rpc.Server) (string, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	for srv.Endpoint() == "" {
		time.Sleep(time.Millisecond)
	}
	return srv.Endpoint(), func() { cancel(); <-done }
}

// roundTrips measures n serial NOOP round trips from a bare DEALER.
func roundTrips(b *testing.B, ep string, n, window int) time.Duration {
	b.Helper()
	d, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	_ = d.SetLinger(0)
	_ = d.SetRcvtimeo(5 * time.Second)
	if err := d.Connect(ep); err != nil {
		b.Fatal(err)
	}
	typ, _ := protocol.Encode(19)
	uid, _ := protocol.Encode(1)
	// Warm up the connection.
	_, _ = d.SendMessage(uid, typ)
	if _, err := d.RecvMessageBytes(0); err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	for sent := 0; sent < n; sent += window {
		for range window {
			_, _ = d.SendMessage(uid, typ)
		}
		for range window {
			if _, err := d.RecvMessageBytes(0); err != nil {
				b.Fatal(err)
			}
		}
	}
	return time.Since(t0)
}

// BenchmarkNoop reports kvdock's NOOP rate as a ratio to a raw pebbe ROUTER
// echo measured in the same run, serial (window 1) and pipelined (window 100).
func BenchmarkNoop(b *testing.B) {
	for _, c := range []struct {
		name   string
		window int
	}{{"serial", 1}, {"pipelined", 100}} {
		b.Run(c.name, func(b *testing.B) {
			n := max(b.N, c.window)
			n = (n + c.window - 1) / c.window * c.window
			rawEP, stopRaw := rawEcho(b)
			kvEP, stopKV := kvdockNoop(b)
			defer stopRaw()
			defer stopKV()
			b.ResetTimer()
			// Interleave short blocks and compare medians: the machine is
			// shared, and load drift must hit both sides alike.
			const blocks = 21
			per := max(n/blocks, c.window)
			per = (per + c.window - 1) / c.window * c.window
			raws := make([]time.Duration, blocks)
			kvs := make([]time.Duration, blocks)
			for i := range blocks {
				raws[i] = roundTrips(b, rawEP, per, c.window)
				kvs[i] = roundTrips(b, kvEP, per, c.window)
			}
			b.StopTimer()
			slices.Sort(raws)
			slices.Sort(kvs)
			raw, kv := raws[blocks/2], kvs[blocks/2]
			b.ReportMetric(float64(per)/kv.Seconds(), "kvdock-req/s")
			b.ReportMetric(float64(per)/raw.Seconds(), "raw-req/s")
			b.ReportMetric(raw.Seconds()/kv.Seconds(), "ratio")
		})
	}
}

// BenchmarkEcho32MiB echoes a 32 MiB bytes payload through rpc.Server and the
// Go client, first at glibc's default thresholds, then after TuneMalloc (the
// single arena is set when the process loads, so both phases have it).
// TuneMalloc cannot be undone, so run it as its own process: -run '^$' -bench
// Echo32MiB -benchtime=1x. Each phase does a fixed number of echoes whatever b.N is.
func BenchmarkEcho32MiB(b *testing.B) {
	const rounds = 20
	p := profile(b, "nongpu-v1")
	srv, err := rpc.New(rpc.Options{Host: "127.0.0.1", Profile: p, Logger: quietLogger(), OrderedWorkers: 1})
	if err != nil {
		b.Fatal(err)
	}
	// COMMIT_STORE carries bytes; answering with them makes it an echo.
	srv.Handle(protocol.CommitStore, func(_ context.Context, r *rpc.Request) (any, error) {
		return r.Args[2].([]byte), nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	for srv.Endpoint() == "" {
		time.Sleep(time.Millisecond)
	}
	c, err := client.Dial(srv.Endpoint(), p, client.Options{Timeout: 30 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	key := protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: []uint32{1}, RequestID: "r"}
	payload := make([]byte, 32<<20)
	for i := range payload {
		payload[i] = byte(i)
	}
	phase := func() time.Duration {
		// One warm-up, then timed rounds.
		if _, err := c.Call(ctx, "COMMIT_STORE", key, int64(0), payload); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		for range rounds {
			r, err := c.Call(ctx, "COMMIT_STORE", key, int64(0), payload)
			if err != nil || len(r.Raw) < len(payload) {
				b.Fatalf("echo: %v (%d bytes)", err, len(r.Raw))
			}
		}
		return time.Since(t0) / rounds
	}
	b.ResetTimer()
	before := phase()
	tn := rpc.TuneMalloc()
	after := phase()
	b.StopTimer()
	b.Logf("TuneMalloc: %v", tn)
	b.ReportMetric(float64(before.Microseconds())/1000, "default-ms/echo")
	b.ReportMetric(float64(after.Microseconds())/1000, "tuned-ms/echo")
	b.ReportMetric(before.Seconds()/after.Seconds(), "speedup")
}

// smallServer serves NOOP (inline), LOOKUP and QUERY_PREFETCH_STATUS (shared
// class; answered on the socket goroutine when fast) and COMMIT_STORE (the
// store stream's, ordered: answers true) with trivial handlers, so that what
// is measured is what the server adds to a ROUTER.
func smallServer(b *testing.B, fast bool) (endpoint string, stop func()) {
	b.Helper()
	opts := rpc.Options{Host: "127.0.0.1", Profile: profile(b, "nongpu-v1"), Logger: quietLogger(), MaxMessageBytes: 64 << 20}
	if fast {
		opts.FastShared = []string{protocol.Lookup, protocol.QueryPrefetchStatus}
	}
	srv, err := rpc.New(opts)
	if err != nil {
		b.Fatal(err)
	}
	srv.Handle(protocol.Noop, func(context.Context, *rpc.Request) (any, error) { return "OK", nil })
	srv.Handle(protocol.Lookup, func(context.Context, *rpc.Request) (any, error) { return nil, nil })
	srv.Handle(protocol.QueryPrefetchStatus, func(context.Context, *rpc.Request) (any, error) { return int64(0), nil })
	srv.Handle(protocol.CommitStore, func(context.Context, *rpc.Request) (any, error) { return true, nil })
	return serveBench(srv)
}

// exchange is one synchronous client operation: requests sent one after the
// other, each waiting for its reply.
func exchange(b *testing.B, d *zmq.Socket, reqs [][][]byte) {
	for _, r := range reqs {
		if _, err := d.SendMessage(r); err != nil {
			b.Fatal(err)
		}
		if _, err := d.RecvMessageBytes(0); err != nil {
			b.Fatal(err)
		}
	}
}

func dealer(b *testing.B, ep string) *zmq.Socket {
	b.Helper()
	d, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		b.Fatal(err)
	}
	_ = d.SetLinger(0)
	_ = d.SetRcvtimeo(10 * time.Second)
	if err := d.Connect(ep); err != nil {
		b.Fatal(err)
	}
	return d
}

// stream sends 32 MiB COMMIT_STOREs to ep without pause until stop is
// closed, each waiting for its (small) answer: a store stream.
func stream(b *testing.B, ep string, stop <-chan struct{}) (done <-chan struct{}) {
	d := dealer(b, ep)
	key, _ := protocol.Encode(protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: []uint32{1}, End: 1})
	inst, _ := protocol.Encode(int64(0))
	data, _ := protocol.Encode(make([]byte, 32<<20))
	uid, _ := protocol.Encode(1)
	typ, _ := protocol.Encode(12)
	fin := make(chan struct{})
	go func() {
		defer close(fin)
		defer d.Close()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := d.SendMessage(uid, typ, key, inst, data); err != nil {
				return
			}
			if _, err := d.RecvMessageBytes(0); err != nil {
				return
			}
		}
	}()
	return fin
}

// BenchmarkSmallRequests compares NOOP and LOOKUP + QUERY_PREFETCH_STATUS
// round trips (a 16 KiB key, as the bench's 16-chunk prompt) through
// rpc.Server with a raw pebbe ROUTER echo, alone and while a 32 MiB store
// stream runs on another connection to the same server; short blocks of
// each are interleaved and compared round by round (load drift hits both
// alike). ratio: the median over rounds of kvdock's rate / the echo's;
// ratio-workers: the same with LOOKUP and STATUS on the shared workers
// (FastShared off), for comparison. The op/s figures are medians of blocks.
func BenchmarkSmallRequests(b *testing.B) {
	uid, _ := protocol.Encode(1)
	enc := func(v any) []byte { x, _ := protocol.Encode(v); return x }
	tokens := make([]uint32, 4096)
	for i := range tokens {
		tokens[i] = uint32(100000 + i)
	}
	key := enc(protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: tokens, End: len(tokens), RequestID: "r"})
	noop := [][][]byte{{uid, enc(19)}}
	lookup := [][][]byte{{uid, enc(5), key, enc(int64(1))}, {uid, enc(6), enc("r")}}
	for _, c := range []struct {
		name   string
		reqs   [][][]byte
		stream bool
	}{{"noop", noop, false}, {"noop-under-store", noop, true}, {"lookup-status", lookup, false}, {"lookup-status-under-store", lookup, true}} {
		b.Run(c.name, func(b *testing.B) {
			rawEP, stopRaw := rawEcho(b)
			defer stopRaw()
			fastEP, stopFast := smallServer(b, true)
			defer stopFast()
			slowEP, stopSlow := smallServer(b, false)
			defer stopSlow()
			eps := []string{rawEP, fastEP, slowEP}
			socks := make([]*zmq.Socket, len(eps))
			for i, ep := range eps {
				socks[i] = dealer(b, ep)
				defer socks[i].Close()
				exchange(b, socks[i], c.reqs)
			}
			// Many short blocks, each round running the three in a rotating
			// order, and the ratio taken per round (echo time / kvdock time
			// of that round) with the median over rounds: on a shared,
			// oversubscribed machine the load moves on a scale of tens of
			// milliseconds to seconds, so blocks adjacent in time see about
			// the same load, while whole runs do not.
			per := 20
			if c.stream {
				per = 100 // each block starts and stops a stream
			}
			blocks := max(b.N/per, 15)
			times := make([][]time.Duration, len(eps))
			b.ResetTimer()
			for round := range blocks {
				for k := range eps {
					i := (round + k) % len(eps)
					var stop chan struct{}
					var done <-chan struct{}
					if c.stream {
						stop = make(chan struct{})
						done = stream(b, eps[i], stop)
					}
					t0 := time.Now()
					for range per {
						exchange(b, socks[i], c.reqs)
					}
					times[i] = append(times[i], time.Since(t0))
					if c.stream {
						close(stop)
						<-done
					}
				}
			}
			b.StopTimer()
			paired := func(i int) float64 {
				r := make([]float64, blocks)
				for k := range blocks {
					r[k] = times[0][k].Seconds() / times[i][k].Seconds()
				}
				slices.Sort(r)
				return r[blocks/2]
			}
			fastRatio, slowRatio := paired(1), paired(2)
			med := make([]time.Duration, len(eps))
			for i := range times {
				slices.Sort(times[i])
				med[i] = times[i][blocks/2]
			}
			b.ReportMetric(float64(per)/med[0].Seconds(), "echo-ops/s")
			b.ReportMetric(float64(per)/med[1].Seconds(), "kvdock-ops/s")
			b.ReportMetric(fastRatio, "ratio")
			b.ReportMetric(slowRatio, "ratio-workers")
		})
	}
}
