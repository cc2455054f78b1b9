package rpc

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"kvdock/core/protocol"
	"kvdock/core/rpc/internal/wake"
)

// readBatch bounds how many messages one poll wake-up reads before replies
// queued by workers are flushed, so replies are not starved by a busy peer.
const readBatch = 128

// loop is the state of the socket goroutine; only it touches the sockets.
type loop struct {
	s       *Server
	router  *zmq.Socket
	monitor *zmq.Socket
	wake    *wake.Wake
	ordered []chan job
	shared  chan job
	ctx     context.Context // Serve's: done means stop reading
	hctx    context.Context // handlers'
	buf     []reply
}

func (l *loop) run() {
	poller := zmq.NewPoller()
	poller.Add(l.router, zmq.POLLIN)
	poller.Add(l.wake.Socket(), zmq.POLLIN)
	if l.monitor != nil {
		poller.Add(l.monitor, zmq.POLLIN)
	}
	for l.ctx.Err() == nil {
		polled, err := poller.Poll(-1)
		if err != nil {
			if errors.Is(err, syscall.EINTR) || zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			l.s.log.Error("rpc poll failed", "err", err)
			// Do not spin on a persistent error.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		for _, p := range polled {
			switch p.Socket {
			case l.router:
				l.read()
			case l.wake.Socket():
				l.wake.Drain()
			case l.monitor:
				l.events()
			}
		}
		l.flush()
	}
}

// drain sends worker replies until done reports true.
func (l *loop) drain(done func() bool) {
	poller := zmq.NewPoller()
	poller.Add(l.wake.Socket(), zmq.POLLIN)
	for {
		l.wake.Drain()
		l.flush()
		if done() {
			l.wake.Drain()
			l.flush()
			return
		}
		_, _ = poller.Poll(100 * time.Millisecond)
	}
}

func (l *loop) flush() {
	l.buf = l.s.takeReplies(l.buf)
	for i := range l.buf {
		l.send(l.buf[i])
		l.buf[i] = reply{}
	}
}

func (l *loop) send(r reply) {
	// ROUTER never blocks: at the HWM or for a gone peer the message is
	// dropped by libzmq.
	n := 3 + len(r.frames)
	for i := range n {
		var p []byte
		switch i {
		case 0:
			p = r.peer
		case 1:
			p = r.uid
		case 2:
			p = r.typ
		default:
			p = r.frames[i-3]
		}
		flag := zmq.SNDMORE
		if i == n-1 {
			flag = 0
		}
		if _, err := l.router.SendBytes(p, flag|zmq.DONTWAIT); err != nil {
			l.s.stats.bad("send_failed")
			return
		}
	}
}

func (l *loop) events() {
	for {
		ev, _, _, err := l.monitor.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			return
		}
		if ev == zmq.EVENT_DISCONNECTED {
			l.s.stats.disconnects.Add(1)
		}
	}
}

func (l *loop) read() {
	for range readBatch {
		frames, total, tooMany, ok := l.recv()
		if !ok {
			return
		}
		l.dispatch(frames, total, tooMany)
		if l.ctx.Err() != nil {
			return
		}
	}
}

// recv reads one whole message without blocking. Frames beyond maxFrames, and
// every frame once the total passes MaxMessageBytes, are read and discarded.
func (l *loop) recv() (frames [][]byte, total int64, tooMany, ok bool) {
	first, err := l.router.RecvBytes(zmq.DONTWAIT)
	if err != nil {
		return nil, 0, false, false
	}
	frames = append(make([][]byte, 0, 4), first)
	total = int64(len(first))
	for {
		more, err := l.router.GetRcvmore()
		if err != nil || !more {
			break
		}
		f, err := l.router.RecvBytes(0)
		if err != nil {
			break
		}
		total += int64(len(f))
		if len(frames) >= maxFrames {
			tooMany = true
			continue
		}
		if total <= l.s.opts.MaxMessageBytes {
			frames = append(frames, f)
		}
	}
	return frames, total, tooMany, true
}

func (l *loop) dispatch(frames [][]byte, total int64, tooMany bool) {
	s := l.s
	peer := frames[0]
	if total > s.opts.MaxMessageBytes {
		s.badInput(protocol.KindOversized, peer, nil, fmt.Errorf("message of %d bytes exceeds the maximum %d", total, s.opts.MaxMessageBytes))
		return
	}
	if tooMany {
		s.badInput(protocol.KindTooMany, peer, nil, fmt.Errorf("more than %d frames", maxFrames))
		return
	}
	spec, err := s.opts.Profile.DecodeHead(frames[1:])
	if err != nil {
		var uid, typ []byte
		if len(frames) >= 3 {
			uid, typ = frames[1], frames[2]
		}
		s.decodeFailed(job{peer: peer, uid: uid, typ: typ, spec: spec, start: time.Now()}, err, l.send)
		return
	}
	j := job{peer: peer, uid: frames[1], typ: frames[2], spec: spec, payload: frames[3:], start: time.Now()}
	if spec.Unsupported != "" {
		s.badInput(spec.Unsupported, peer, spec, fmt.Errorf("%s is not served", spec.Name))
		s.finish(j, OutcomeDropped)
		if r, ok := s.errorReply(j, "Unsupported", spec.Name+" is not supported by kvdock (non-GPU transfer only)"); ok {
			l.send(r)
		}
		return
	}
	var ch chan job
	switch spec.Class {
	case protocol.Inline:
		if !s.decodePayload(&j, l.send) {
			return
		}
		s.stats.inFlight.Add(1)
		if r, ok := s.execute(l.hctx, j); ok {
			l.send(r)
		}
		return
	case protocol.Ordered:
		ch = l.ordered[peerWorker(peer, len(l.ordered))]
	default:
		ch = l.shared
	}
	// The payload (a key of thousands of tokens) is decoded by the worker
	// that runs the request, not here: this goroutine serves every peer.
	s.stats.inFlight.Add(1)
	select {
	case ch <- j:
	default:
		// Queue full: block (backpressure on this socket) but keep sending
		// replies and notice shutdown.
		l.enqueueSlow(ch, j)
	}
}

func (l *loop) enqueueSlow(ch chan job, j job) {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case ch <- j:
			return
		case <-l.ctx.Done():
			l.s.stats.inFlight.Add(-1)
			l.s.finish(j, OutcomeDropped)
			return
		case <-t.C:
			l.flush()
		}
	}
}
