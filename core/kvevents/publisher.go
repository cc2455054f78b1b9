package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"

	"kvdock/core/zmqwait"
)

// Coalesce is how long the publisher waits after the first event of a
// batch, so that the events of one store, eviction pass or clear leave in
// one batch.
const Coalesce = time.Millisecond

// FlushEvery is the shortest time between two flushes: under a steady
// stream of stores the events of several go in one batch per model, so
// that the publisher's sends (each a wake of libzmq's I/O thread and of
// every subscriber) stay a few hundred a second whatever the store rate.
// An event after a quiet spell still leaves Coalesce after it; the lag
// under load stays under 10 ms at the 99th percentile
// (BenchmarkKVEventsLagAndThroughput, docs/EVENTS.md).
const FlushEvery = 5 * time.Millisecond

// PublisherOptions configures a Publisher.
type PublisherOptions struct {
	// Endpoint is the PUB socket's endpoint (tcp://HOST:PORT); Connect
	// connects to it (a router that binds its SUB) instead of binding.
	Endpoint string
	Connect  bool
	// ReplayEndpoint, when set, is the ROUTER that answers replay requests.
	ReplayEndpoint string
	// LegacyReplay answers [identity, "", seq8, payload] and ends with
	// [identity, "", 8×0xFF, ""] (vLLM before 0.26); otherwise each frame
	// set carries the topic first and the end marker an empty topic.
	LegacyReplay bool
	// Pod names the topic: kv@<pod>@<model>.
	Pod string
	// HWM is the PUB socket's send high-water mark in messages: what a slow
	// subscriber can make kvdock hold (libzmq drops past it).
	HWM    int
	Logger *slog.Logger
}

// DefaultHWM is the PUB socket's send high-water mark.
const DefaultHWM = 100000

// PublisherStats are the publisher's counters.
type PublisherStats struct {
	Sent           uint64 // batches handed to the PUB socket
	SendErrors     uint64
	ReplayRequests uint64
	ReplayBad      uint64 // requests that were not [identity, "", seq8]
	ReplayBatches  uint64
}

// Publisher sends the tracker's batches on a ZMQ PUB socket and answers
// replays on a ZMQ ROUTER. Each socket has one owner goroutine: the PUB's
// waits on the tracker's wake channel (a zmq poll cannot wait on a Go
// channel), the ROUTER's on its ZMQ_FD in Go's network poller; the data
// path only fills the tracker's bounded queue.
type Publisher struct {
	tr     *Tracker
	opt    PublisherOptions
	zctx   *zmq.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	sent, sendErrs, replays, replayBad, replayBatches atomic.Uint64
}

// replayEnd is the seq frame of the end marker.
var replayEnd = bytes.Repeat([]byte{0xff}, 8)

// Start binds (or connects) the sockets and starts their goroutines.
func Start(tr *Tracker, opt PublisherOptions) (*Publisher, error) {
	if opt.HWM <= 0 {
		opt.HWM = DefaultHWM
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("kv events: zmq context: %w", err)
	}
	pub, err := socket(zctx, zmq.PUB, opt.HWM)
	if err == nil {
		if opt.Connect {
			err = pub.Connect(opt.Endpoint)
		} else {
			err = pub.Bind(opt.Endpoint)
		}
		if err != nil {
			err = fmt.Errorf("kv events: %s %s: %w", map[bool]string{true: "connect", false: "bind"}[opt.Connect], opt.Endpoint, err)
		}
	}
	var rep *zmq.Socket
	var w *zmqwait.Waiter
	if err == nil && opt.ReplayEndpoint != "" {
		// A replay of the whole buffer must arrive whole, end marker
		// included: libzmq's default limit of 1,000 would drop the rest.
		if rep, err = socket(zctx, zmq.ROUTER, tr.opt.BufferSteps+16); err == nil {
			if err = rep.Bind(opt.ReplayEndpoint); err != nil {
				err = fmt.Errorf("kv events: bind replay %s: %w", opt.ReplayEndpoint, err)
			} else {
				w, err = zmqwait.New(rep, "kv events: replay socket")
			}
		}
	}
	if err != nil {
		for _, s := range []*zmq.Socket{pub, rep} {
			if s != nil {
				_ = s.Close()
			}
		}
		_ = zctx.Term()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{tr: tr, opt: opt, zctx: zctx, cancel: cancel}
	p.wg.Add(1)
	go p.publish(ctx, pub)
	if rep != nil {
		p.wg.Add(1)
		go p.replay(ctx, rep, w)
	}
	return p, nil
}

func socket(zctx *zmq.Context, t zmq.Type, hwm int) (*zmq.Socket, error) {
	s, err := zctx.NewSocket(t)
	if err != nil {
		return nil, fmt.Errorf("kv events: socket: %w", err)
	}
	if err := errors.Join(s.SetLinger(0), s.SetSndhwm(hwm)); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("kv events: socket options: %w", err)
	}
	return s, nil
}

// Close stops the goroutines, closes the sockets and publishes nothing more.
func (p *Publisher) Close() {
	p.cancel()
	p.wg.Wait()
	_ = p.zctx.Term()
}

// Stats returns the counters.
func (p *Publisher) Stats() PublisherStats {
	return PublisherStats{Sent: p.sent.Load(), SendErrors: p.sendErrs.Load(), ReplayRequests: p.replays.Load(),
		ReplayBad: p.replayBad.Load(), ReplayBatches: p.replayBatches.Load()}
}

// appendTopic appends model's topic, kv@<pod>@<model>, to b.
func (p *Publisher) appendTopic(b []byte, model string) []byte {
	return append(append(append(append(b, "kv@"...), p.opt.Pod...), '@'), model...)
}

func seq8(s uint64) []byte { return binary.BigEndian.AppendUint64(nil, s) }

// publish owns the PUB socket: each wake, it waits Coalesce for the rest of
// the batch (longer when the last flush was under FlushEvery ago), then
// sends what the tracker flushed. A PUB never blocks: past
// the HWM libzmq drops for that subscriber.
func (p *Publisher) publish(ctx context.Context, pub *zmq.Socket) {
	defer p.wg.Done()
	defer func() { _ = pub.Close() }()
	t := time.NewTimer(0)
	<-t.C
	var last time.Time
	// The frames are built in buffers reused from send to send: zmq_send
	// copies them.
	var topic []byte
	var seq [8]byte
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.tr.Wake():
		}
		t.Reset(max(Coalesce, FlushEvery-time.Since(last)))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		last = time.Now()
		for _, b := range p.tr.Flush() {
			topic = p.appendTopic(topic[:0], b.Model)
			binary.BigEndian.PutUint64(seq[:], b.Seq)
			if _, err := pub.SendMessageDontwait(topic, seq[:], b.Payload); err != nil {
				if p.sendErrs.Add(1) == 1 {
					p.opt.Logger.Warn("kv events: publish failed", "seq", b.Seq, "err", err)
				}
				continue
			}
			p.sent.Add(1)
		}
	}
}

// replay owns the ROUTER: a request [identity, "", start_seq8] gets every
// buffered batch with seq >= start, then the end marker. Between requests
// it waits in Go's network poller (w, package zmqwait), not in a
// zmq_poll: a ROUTER polled in 100 ms slices cost an idle process about
// 2.7 ms of CPU and 100 context switches a second, ten times what it
// costs now (BenchmarkPublisherIdle).
func (p *Publisher) replay(ctx context.Context, rep *zmq.Socket, w *zmqwait.Waiter) {
	defer p.wg.Done()
	defer func() { _ = rep.Close() }()
	defer w.Close()
	stop := context.AfterFunc(ctx, func() { _ = w.Close() })
	defer stop()
	for {
		var evErr error
		err := w.Wait(func() bool {
			// ZMQ_FD only says the socket's state may have changed: its
			// events tell whether a request waits, checked before every
			// wait since a receive or send can take the signal.
			ev, err := rep.GetEvents()
			evErr = err
			return err != nil || ev&zmq.POLLIN != 0
		})
		if err != nil || evErr != nil || ctx.Err() != nil {
			return // closed, or the socket failed
		}
		for {
			msg, err := rep.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				break
			}
			p.answer(rep, msg)
		}
	}
}

// answer answers one replay request.
func (p *Publisher) answer(rep *zmq.Socket, msg [][]byte) {
	if len(msg) != 3 || len(msg[1]) != 0 || len(msg[2]) != 8 {
		p.replayBad.Add(1)
		return
	}
	p.replays.Add(1)
	id, start := msg[0], binary.BigEndian.Uint64(msg[2])
	for _, b := range p.tr.Since(start) {
		var err error
		if p.opt.LegacyReplay {
			_, err = rep.SendMessageDontwait(id, "", seq8(b.Seq), b.Payload)
		} else {
			_, err = rep.SendMessageDontwait(id, "", p.appendTopic(nil, b.Model), seq8(b.Seq), b.Payload)
		}
		if err != nil {
			break
		}
		p.replayBatches.Add(1)
	}
	if p.opt.LegacyReplay {
		_, _ = rep.SendMessageDontwait(id, "", replayEnd, "")
	} else {
		_, _ = rep.SendMessageDontwait(id, "", "", replayEnd, "")
	}
}
