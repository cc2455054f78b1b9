package bench

import (
	"context"
	"errors"
	"fmt"
	"kvdock/core/protocol"
	"net"
	"os"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"
	"golang.org/x/sys/unix"
)

// memcpyDests is how many destinations the memcpy reference rotates over:
// like the pool's slots, a destination is not in the CPU caches when the
// copy starts ("fresh"), but its pages are mapped ("prefaulted").
const memcpyDests = 4

// memcpyGBps copies src into prefaulted destinations of the same size in
// turn, one stream, for about dur, and returns GB/s (10^9 bytes).
func memcpyGBps(src []byte, dur time.Duration) float64 {
	dst := make([]byte, memcpyDests*len(src))
	return copyRate(dst, src, dur)
}

// copyRate copies src into consecutive len(src)-sized parts of dst, which
// it prefaults first.
func copyRate(dst, src []byte, dur time.Duration) float64 {
	parts := len(dst) / len(src)
	if parts == 0 {
		return 0
	}
	for i := range parts {
		copy(dst[i*len(src):], src)
	}
	var n int64
	start := time.Now()
	for i := 0; time.Since(start) < dur || n == 0; i++ {
		off := (i % parts) * len(src)
		copy(dst[off:off+len(src)], src)
		n += int64(len(src))
	}
	return float64(n) / time.Since(start).Seconds() / 1e9
}

// copyOutRate copies consecutive len(dst)-sized parts of src in turn into
// dst, which it prefaults first: the retrieve's direction (out of the
// segment's pages into one resident buffer, as the bench's workers copy
// each chunk into their own destination).
func copyOutRate(dst, src []byte, dur time.Duration) float64 {
	parts := len(src) / len(dst)
	if parts == 0 {
		return 0
	}
	copy(dst, src)
	var n int64
	start := time.Now()
	for i := 0; time.Since(start) < dur || n == 0; i++ {
		off := (i % parts) * len(dst)
		copy(dst, src[off:off+len(dst)])
		n += int64(len(dst))
	}
	return float64(n) / time.Since(start).Seconds() / 1e9
}

// echoResult is the raw ZMQ reference, same library, same socket pattern.
type echoResult struct {
	RoundTripsPS float64 // all streams together
	GBps         float64 // payload bytes moved per second, both directions counted
}

// echo runs a ROUTER that sends every message back and `streams` DEALERs
// (each with its own context, as each bench worker's client has) doing
// synchronous round trips of the given frames for about dur.
func echo(ctx context.Context, frames [][]byte, streams int, dur time.Duration) (echoResult, error) {
	return echoUnder(ctx, frames, streams, dur, nil)
}

// echoUnder is echo while, when load is set, one more DEALER sends load
// messages without pause, each answered by the ROUTER with its first frame
// only: the raw-ZMQ counterpart of a store stream (chunk-sized requests,
// few-byte replies) beside the small round trips. Only the small streams
// are counted.
func echoUnder(ctx context.Context, frames [][]byte, streams int, dur time.Duration, load [][]byte) (echoResult, error) {
	port, err := freePort()
	if err != nil {
		return echoResult{}, err
	}
	endpoint := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	zctx, err := zmq.NewContext()
	if err != nil {
		return echoResult{}, fmt.Errorf("echo: zmq context: %w", err)
	}
	defer zctx.Term()
	router, err := zctx.NewSocket(zmq.ROUTER)
	if err != nil {
		return echoResult{}, fmt.Errorf("echo: router: %w", err)
	}
	_ = router.SetLinger(0)
	if err := router.Bind(endpoint); err != nil {
		router.Close()
		return echoResult{}, fmt.Errorf("echo: bind %s: %w", endpoint, err)
	}
	stop := make(chan struct{})
	served := make(chan struct{})
	go func() {
		defer close(served)
		defer router.Close()
		poller := zmq.NewPoller()
		poller.Add(router, zmq.POLLIN)
		for {
			select {
			case <-stop:
				return
			default:
			}
			polled, err := poller.Poll(50 * time.Millisecond)
			if err != nil || len(polled) == 0 {
				continue
			}
			for {
				msg, err := router.RecvMessageBytes(zmq.DONTWAIT)
				if err != nil {
					break
				}
				if load != nil && size(msg) > 1<<20 && len(msg) > 1 {
					msg = msg[:2] // identity and the first frame: an ack
				}
				_, _ = router.SendMessage(msg)
			}
		}
	}()
	defer func() {
		close(stop)
		<-served
	}()

	var size int
	for _, f := range frames {
		size += len(f)
	}
	counts := make([]int64, streams)
	errs := make([]error, streams)
	var wg sync.WaitGroup
	start := time.Now()
	until := start.Add(dur)
	var loadErr error
	loadDone := make(chan struct{})
	if load != nil {
		go func() {
			defer close(loadDone)
			_, loadErr = echoStream(ctx, endpoint, load, until)
		}()
	} else {
		close(loadDone)
	}
	for s := range streams {
		wg.Go(func() { counts[s], errs[s] = echoStream(ctx, endpoint, frames, until) })
	}
	wg.Wait()
	<-loadDone
	if loadErr != nil {
		return echoResult{}, fmt.Errorf("echo: load stream: %w", loadErr)
	}
	el := time.Since(start).Seconds()
	if err := errors.Join(errs...); err != nil {
		return echoResult{}, err
	}
	var n int64
	for _, c := range counts {
		n += c
	}
	return echoResult{RoundTripsPS: float64(n) / el, GBps: float64(n) * 2 * float64(size) / el / 1e9}, nil
}

func echoStream(ctx context.Context, endpoint string, frames [][]byte, until time.Time) (int64, error) {
	zctx, err := zmq.NewContext()
	if err != nil {
		return 0, fmt.Errorf("echo: zmq context: %w", err)
	}
	defer zctx.Term()
	d, err := zctx.NewSocket(zmq.DEALER)
	if err != nil {
		return 0, fmt.Errorf("echo: dealer: %w", err)
	}
	defer d.Close()
	_ = d.SetLinger(0)
	_ = d.SetRcvtimeo(10 * time.Second)
	if err := d.Connect(endpoint); err != nil {
		return 0, fmt.Errorf("echo: connect: %w", err)
	}
	args := make([]any, len(frames))
	for i, f := range frames {
		args[i] = f
	}
	var n int64
	for first := true; first || time.Now().Before(until); first = false {
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
		if _, err := d.SendMessage(args...); err != nil {
			return n, fmt.Errorf("echo: send: %w", err)
		}
		if _, err := d.RecvMessageBytes(0); err != nil {
			return n, fmt.Errorf("echo: receive: %w", err)
		}
		n++
	}
	return n, nil
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tmpfsCopyRate is copyRate into a fresh MAP_SHARED mapping of size bytes
// backed by an unlinked file in dir (tmpfs, like the pool's segment under
// /dev/shm): the segment-pages reference where the bench cannot write into
// the segment itself (a target server's live pool). Only the pages copied
// into are allocated.
func tmpfsCopyRate(dir string, size int64, src []byte, dur time.Duration) (float64, error) {
	need := int64(memcpyDests) * int64(len(src))
	size = max(size, need)
	f, err := os.CreateTemp(dir, "kvdock_bench_ref_*")
	if err != nil {
		return 0, fmt.Errorf("segment reference: %w", err)
	}
	defer f.Close()
	// Unlinked at once: nothing is left behind whatever happens next.
	if err := os.Remove(f.Name()); err != nil {
		return 0, fmt.Errorf("segment reference: %w", err)
	}
	if err := f.Truncate(size); err != nil {
		return 0, fmt.Errorf("segment reference: size %s: %w", f.Name(), err)
	}
	// Allocate the pages the copies touch now: a full tmpfs then answers
	// ENOSPC here instead of SIGBUS in the copy.
	if err := unix.Fallocate(int(f.Fd()), 0, 0, need); err != nil {
		return 0, fmt.Errorf("segment reference: allocate %d bytes in %s: %w", need, dir, err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return 0, fmt.Errorf("segment reference: map %d bytes: %w", size, err)
	}
	defer func() { _ = unix.Munmap(m) }()
	return copyRate(m[:need], src, dur), nil
}

// measureReferences runs memcpy and the raw ZMQ echoes (same sizes as the
// workload's messages, as many streams as workers).
func (r *Result) measureReferences(ctx context.Context, o Options, prof *protocol.Profile) error {
	chunk := r.Config.ChunkBytes
	pat := newPattern(int(chunk), 0xc0ffee)
	r.References.MemcpyGBps = round4(memcpyGBps(pat.chunk(0), o.RefDuration))
	small, look, typ, err := echoFrames(benchModel(o.Model, o.Host != "" && !o.ServerProcess), r.Config.ChunkTokens, prof)
	if err != nil {
		return fmt.Errorf("references: %w", err)
	}
	uid, _ := protocol.Encode(int64(1) << 40)
	r.References.EchoStreams = o.Workers
	var errs []error
	e, err := echo(ctx, small, o.Workers, o.RefDuration)
	errs = append(errs, err)
	r.References.EchoNoopBytes, r.References.EchoNoopRTPS = size(small), round4(e.RoundTripsPS)
	e, err = echo(ctx, look, o.Workers, o.RefDuration)
	errs = append(errs, err)
	r.References.EchoLookupBytes, r.References.EchoLookupRTPS = size(look), round4(e.RoundTripsPS)
	large := [][]byte{uid, typ(protocol.CommitStore), pat.chunk(1)}
	e, err = echo(ctx, large, o.Workers, o.RefDuration)
	errs = append(errs, err)
	r.References.EchoLargeBytes, r.References.EchoLargeGBps = size(large), round4(e.GBps)
	if (r.SHM != nil && r.SHM.NoopLoadedRTPS > 0) || (r.Pickle != nil && r.Pickle.NoopLoadedRTPS > 0) {
		e, err = echoUnder(ctx, small, o.Workers, o.RefDuration, large)
		errs = append(errs, err)
		r.References.EchoNoopLoadedRTPS = round4(e.RoundTripsPS)
		e, err = echoUnder(ctx, look, o.Workers, o.RefDuration, large)
		errs = append(errs, err)
		r.References.EchoLookupLoadedRTPS = round4(e.RoundTripsPS)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("references: %w", err)
	}
	return nil
}

// echoFrames builds the raw echo's messages of the small requests: a NOOP
// and a LOOKUP of a 16-chunk prompt (frames as the workers send them, uid
// first), and returns how a request type is encoded.
func echoFrames(model string, chunkTokens int, prof *protocol.Profile) (small, look [][]byte, typ func(string) []byte, err error) {
	uid, _ := protocol.Encode(int64(1) << 40)
	typ = func(name string) []byte {
		spec, ok := prof.ByName(name)
		if !ok {
			return []byte{0}
		}
		b, _ := protocol.Encode(spec.Number)
		return b
	}
	lw := &workload{chunkTokens: chunkTokens, chunks: 16}
	p := lw.prompt(1<<15, 0, 0)
	key, err := protocol.Encode(protocol.Key{ModelName: model, WorldSize: 1, TokenIDs: p.tokens, End: len(p.tokens), RequestID: "bench-small-w0"})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("encode the LOOKUP key: %w", err)
	}
	one, _ := protocol.Encode(int64(1))
	return [][]byte{uid, typ(protocol.Noop)}, [][]byte{uid, typ(protocol.Lookup), key, one}, typ, nil
}

func mean(xs []float64) float64 {
	var t float64
	for _, x := range xs {
		t += x
	}
	return t / float64(len(xs))
}

func size(frames [][]byte) int {
	n := 0
	for _, f := range frames {
		n += len(f)
	}
	return n
}
