package rpc

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	zmq "github.com/pebbe/zmq4"

	"kvdock/core/protocol"
	"kvdock/core/rpc/internal/wake"
)

// readBatch bounds how many messages one poll wake-up reads before replies
// queued by workers are flushed, so replies are not starved by a busy peer.
const readBatch = 128

// Poll failures: a socket that cannot be polled is dead. The loop retries
// with a growing pause and gives up after maxPollErrors failures in a row
// (about 3 s), so Serve returns and its caller learns the server failed.
const (
	maxPollErrors  = 20
	pollRetryFirst = 10 * time.Millisecond
	pollRetryMax   = 200 * time.Millisecond
)

// Replies waiting for a full peer are retried after retryFirst, backing off
// to retryMax while no peer takes any: libzmq gives no signal when a peer's
// send queue drains.
const (
	retryFirst = time.Millisecond
	retryMax   = 50 * time.Millisecond
)

// loop is the state of the socket goroutine; only it touches the sockets.
type loop struct {
	s       *Server
	router  *zmq.Socket
	monitor *zmq.Socket
	wake    *wake.Wake
	ordered []chan job
	shared  chan job
	ctx     context.Context // done means stop reading: Serve's, or in a handover when it ends
	stop    context.Context // Serve's: done means a stop was asked for
	endRead context.CancelFunc
	hctx    context.Context // handlers'
	ho      handoverState
	buf     []pending

	raw unsafe.Pointer // libzmq's handle of router, for counted sends
	rc  *receiver      // reads messages through raw

	// outBytes sums the replies waiting here for their peers (refused at
	// SendHWM, or behind those); the per-peer state is s.rp.
	outBytes  int64
	retryWait time.Duration
	sendErr   error // why the last write failed

	// handedOff is set when a request went to a worker goroutine since the
	// last poll: see yieldToWorkers.
	handedOff bool

	// lastRead is when a request was last read (during a stop); graceEnd
	// when a stop's grace ends (zero until the stop); lastWrite when a
	// reply was last handed to libzmq.
	lastRead, graceEnd, lastWrite time.Time

	// recent is the last answers' peers and times, so that a handover knows
	// which workers it answered just before it began.
	recent recentAnswers
}

// stopPoll is the poll timeout during a stop's grace.
const stopPoll = 5 * time.Millisecond

// stopQuiet is the silence that ends a stop's grace early: no request in
// flight or queued, and none read for this long.
const stopQuiet = 20 * time.Millisecond

// serving reports whether the loop goes on reading: until ctx is done, then
// for the stop's grace while requests are in flight, queued or arriving.
func (l *loop) serving() bool {
	if l.stop.Err() == nil {
		return true
	}
	if l.beginHandover() {
		if l.handing() {
			return true
		}
		l.endRead()
		return false
	}
	if l.ctx.Err() == nil {
		return true
	}
	if l.s.opts.StopGrace <= 0 {
		return false
	}
	now := time.Now()
	if l.graceEnd.IsZero() {
		l.graceEnd = now.Add(l.s.opts.StopGrace)
	}
	if now.After(l.graceEnd) {
		return false
	}
	busy := l.s.stats.inFlight.Load() > 0 || l.s.in.queued() > 0
	return busy || now.Sub(l.lastRead) < stopQuiet
}

// outMsg is a reply admitted to its peer's budget, its frames (identity,
// uid, type, results) copied out to C memory; sent is how many of them
// libzmq has taken.
type outMsg struct {
	frames []cbuf
	size   int64
	sent   int
	wire   int64 // the bytes it takes on the peer's connection
}

// release frees the frames libzmq has not taken.
func (m *outMsg) release() {
	for _, f := range m.frames[m.sent:] {
		f.release()
	}
	m.frames, m.sent = nil, 0
}

func (l *loop) poll(p *zmq.Poller, timeout time.Duration) ([]zmq.Polled, error) {
	if f := l.s.opts.PollFault; f != nil {
		if err := f(); err != nil {
			return nil, err
		}
	}
	return p.Poll(timeout)
}

// run serves until ctx is done (nil) or polling keeps failing (the error).
func (l *loop) run() error {
	poller := zmq.NewPoller()
	poller.Add(l.router, zmq.POLLIN)
	poller.Add(l.wake.Socket(), zmq.POLLIN)
	if l.monitor != nil {
		poller.Add(l.monitor, zmq.POLLIN)
	}
	failures := 0
	pause := pollRetryFirst
	for l.serving() {
		timeout := time.Duration(-1)
		if l.s.rp.n.Load() > 0 {
			timeout = l.retryWait
		}
		if l.stop.Err() != nil && (timeout < 0 || timeout > stopPoll) {
			timeout = stopPoll // in the grace or a handover: look at the clock often
		}
		if l.ho.noRead && (timeout < 0 || timeout > answerPoll) {
			timeout = answerPoll // the close must follow the last answer closely
		}
		if l.ho.noRead && !l.ho.unpolled {
			// The handover's answer phase reads nothing more: requests
			// left in libzmq must not wake the poll.
			l.ho.unpolled = true
			_ = poller.RemoveBySocket(l.router)
		}
		l.yieldToWorkers()
		polled, err := l.poll(poller, timeout)
		if err != nil {
			if errors.Is(err, syscall.EINTR) || zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			failures++
			if failures >= maxPollErrors {
				l.s.log.Error("rpc poll keeps failing: the wire server stops", "err", err, "failures", failures)
				return fmt.Errorf("rpc: poll failed %d times in a row: %w", failures, err)
			}
			if l.s.limiter.allow("poll_failed") {
				l.s.log.Error("rpc poll failed", "err", err, "failures", failures)
			}
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-l.ctx.Done():
				t.Stop()
				if !l.graceEnd.IsZero() {
					return nil // failing polls in the grace: stop at once
				}
			}
			pause = min(2*pause, pollRetryMax)
			continue
		}
		failures, pause = 0, pollRetryFirst
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
	return nil
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
		timeout := 100 * time.Millisecond
		if l.s.rp.n.Load() > 0 {
			timeout = l.retryWait
		}
		_, _ = poller.Poll(timeout)
	}
}

// flush retries waiting replies, then sends (or queues) the workers' new ones.
func (l *loop) flush() {
	l.retry()
	l.buf = l.s.takeReplies(l.buf)
	for i := range l.buf {
		l.deliver(l.buf[i])
		l.buf[i] = pending{}
	}
}

// sendResult is what libzmq did with a reply.
type sendResult int

const (
	sent     sendResult = iota
	peerFull            // the peer's send queue is at SendHWM: try later
	peerGone            // no such peer (disconnected)
	failed
)

// write hands m's frames to libzmq without blocking or copying.
func (l *loop) write(m *outMsg) sendResult {
	for m.sent < len(m.frames) {
		first := m.sent == 0
		n, err := sendMany(l.raw, m.frames, m.sent)
		m.sent += n
		if err == nil {
			break
		}
		if first && n == 0 && zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
			// libzmq applies the peer's "queue drained" notices lazily (at
			// most once a millisecond while sending); reading ZMQ_EVENTS
			// applies them now, so a reading peer is not taken for a full one.
			_, _ = l.router.GetEvents()
			n, err = sendMany(l.raw, m.frames, m.sent)
			m.sent += n
			if err == nil {
				break
			}
		}
		// ROUTER_MANDATORY reports both on the identity frame, before
		// anything of the message is queued.
		if first && m.sent == 0 {
			switch zmq.AsErrno(err) {
			case zmq.Errno(syscall.EAGAIN):
				return peerFull
			case zmq.EHOSTUNREACH:
				return peerGone
			}
		}
		l.sendErr = fmt.Errorf("frame %d of %d: %w", m.sent, len(m.frames), err)
		return failed
	}
	if l.ho.noRead {
		l.ho.wire += m.wire
	}
	l.lastWrite = time.Now()
	return sent
}

// send admits a reply made here (inline, or an error answer) and delivers it.
func (l *loop) send(r reply) {
	p, ok := l.s.prepare(&r)
	if !ok {
		return
	}
	l.deliver(p)
	l.s.rp.release(p.po)
}

// deliver hands an admitted reply to libzmq, or queues it behind the
// replies already waiting for its peer or while libzmq refuses it.
func (l *loop) deliver(p pending) {
	l.recent.note(p.key, time.Now())
	if p.peer != "" {
		l.answered(p.peer)
	}
	if len(p.po.q) > 0 || l.ho.holding {
		l.hold(p.po, p.m)
		return
	}
	switch l.write(&p.m) {
	case sent:
	case peerFull:
		l.hold(p.po, p.m)
	case peerGone:
		l.s.stats.repliesDropped.Add(1)
		p.m.release()
	default:
		l.sendFailed()
		p.m.release()
	}
}

// sendFailed counts and logs (rate-limited) a reply libzmq refused.
func (l *loop) sendFailed() {
	l.s.stats.bad(protocol.KindSendFailed)
	if l.s.limiter.allow("send_failed") {
		l.s.log.Warn("reply dropped: libzmq refused it", "err", l.sendErr)
	}
}

// hold queues m (already within the budgets) for its peer.
func (l *loop) hold(po *peerOut, m outMsg) {
	if len(po.q) == 0 {
		l.retryWait = retryFirst
	}
	po.q = append(po.q, m)
	l.outBytes += m.size
	l.s.stats.replyBytes.Store(l.outBytes)
}

// retry sends waiting replies, in order per peer, while libzmq takes them,
// and recycles the state of peers with nothing waiting or charged.
func (l *loop) retry() {
	rp := l.s.rp
	if rp.n.Load() == 0 || l.ho.holding {
		return
	}
	progress := false
	rp.mu.Lock()
	for _, po := range rp.m {
		for len(po.q) > 0 {
			m := &po.q[0]
			res := l.write(m)
			if res == peerFull {
				break
			}
			progress = true
			if res == peerGone {
				l.s.stats.repliesDropped.Add(1)
				l.dropQueue(po)
				break
			}
			if res == failed {
				l.sendFailed()
				m.release()
			}
			l.outBytes -= m.size
			po.q[0] = outMsg{}
			po.q = po.q[1:]
		}
	}
	before := len(rp.m)
	rp.forgetIdleLocked()
	if len(rp.m) < before {
		progress = true
	}
	rp.mu.Unlock()
	l.s.stats.replyBytes.Store(l.outBytes)
	if progress {
		l.retryWait = retryFirst
	} else {
		l.retryWait = min(2*l.retryWait, retryMax)
	}
}

// dropQueue releases every reply waiting for po.
func (l *loop) dropQueue(po *peerOut) {
	l.s.stats.repliesDropped.Add(int64(len(po.q)))
	for i := range po.q {
		l.outBytes -= po.q[i].size
		po.q[i].release()
	}
	po.q = nil
}

// dropPending forgets every waiting reply (shutdown: the socket closes).
func (l *loop) dropPending() {
	l.s.rp.mu.Lock()
	for _, po := range l.s.rp.m {
		l.dropQueue(po)
	}
	l.s.rp.mu.Unlock()
	l.s.stats.replyBytes.Store(0)
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
		if !l.roomInFlight() {
			return
		}
		limit := l.s.maxMessage()
		frames, held, total, tooMany, lost, ok := l.rc.recv(limit, &l.s.inflight)
		if !ok {
			return
		}
		if l.stop.Err() != nil {
			l.lastRead = time.Now()
		}
		l.s.churn.add(total)
		l.dispatch(frames, held, total, limit, tooMany, lost)
		if l.stop.Err() != nil && l.ho.h == nil {
			return
		}
	}
}

// roomInFlight reports whether another message may be read: the large
// frames borrowed by requests stay under InFlightBytes (replies are not
// counted: a peer that does not read its replies must not stop the server
// reading everyone's requests; they have their own budgets). Over it the loop stops reading (the messages stay in
// libzmq and the TCP buffers: backpressure, nothing is dropped) until they
// are released; it keeps sending replies meanwhile. A message is always read
// when nothing is in flight, so one of any legal size goes through.
func (l *loop) roomInFlight() bool {
	if l.s.inflight.Load() < l.s.opts.InFlightBytes {
		return true
	}
	l.s.stats.inflightWaits.Add(1)
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for l.s.inflight.Load() >= l.s.opts.InFlightBytes {
		select {
		case <-t.C:
			l.wake.Drain()
			l.flush()
		case <-l.ctx.Done():
			return false
		}
	}
	return true
}

func (l *loop) dispatch(frames [][]byte, held *borrowed, total, limit int64, tooMany, lost bool) {
	s := l.s
	// Borrowed frames go back to libzmq here unless the request is handed
	// to a worker, which releases them when its handler is done.
	handedOff := false
	defer func() {
		if !handedOff {
			held.release()
		}
	}()
	peer := frames[0]
	if lost {
		s.badInput(protocol.KindOversized, peer, nil, fmt.Errorf("message of %d bytes: no memory to keep a frame", total))
		return
	}
	if total > limit {
		s.badInput(protocol.KindOversized, peer, nil, fmt.Errorf("message of %d bytes exceeds the maximum %d", total, limit))
		return
	}
	if tooMany {
		s.badInput(protocol.KindTooMany, peer, nil, fmt.Errorf("more than %d frames", maxFrames))
		return
	}
	prof, spec, args, decoded, err := s.route(peer, frames[1:])
	if err != nil {
		var uid, typ []byte
		if len(frames) >= 3 {
			uid, typ = frames[1], frames[2]
		}
		s.decodeFailed(job{peer: peer, uid: uid, typ: typ, prof: prof, spec: spec, start: time.Now()}, err, l.send)
		return
	}
	// Args decoded during protocol detection may point into any payload
	// frame (a bytes field of a message struct, say): then every borrowed
	// frame stays borrowed until the handler is done. Otherwise only the
	// frames the handler takes as bytes do; the rest are copied to Go
	// memory before the job is built from them.
	settle(frames, held, func(i int) bool { return decoded || bytesAt(spec, len(frames)-3, i) })
	j := job{peer: peer, uid: frames[1], typ: frames[2], prof: prof, spec: spec, payload: frames[3:], held: held,
		start: time.Now(), args: args, decoded: decoded, tentative: s.tentative(peer)}
	if spec.Unsupported != "" {
		s.badInput(spec.Unsupported, peer, spec, fmt.Errorf("%s is not served", spec.Name))
		s.finish(j, OutcomeDropped)
		if r, ok := s.errorReply(j, "Unsupported", spec.Name+" is not supported by kvdock (non-GPU transfer only)"); ok {
			l.send(r)
		}
		return
	}
	if l.parks(spec.Handler) {
		handedOff = l.park(frames, j)
		return
	}
	ch := l.queueOf(j)
	if ch == nil {
		if !j.decoded && !s.decodePayload(&j, l.send) {
			return
		}
		s.stats.inFlight.Add(1)
		if r, ok := s.execute(l.hctx, j); ok {
			l.send(r)
		}
		return
	}
	l.ownCopy(frames, &j)
	for _, f := range j.payload {
		j.cost += int64(len(f))
	}
	if !l.charge(j) {
		s.finish(j, OutcomeDropped)
		return
	}
	// The payload (a key of thousands of tokens) is decoded by the worker
	// that runs the request, not here: this goroutine serves every peer.
	s.stats.inFlight.Add(1)
	select {
	case ch <- j:
		handedOff = true
	default:
		// Queue full: block (backpressure on this socket) but keep sending
		// replies and notice shutdown.
		handedOff = l.enqueueSlow(ch, j)
	}
	l.handedOff = l.handedOff || handedOff
}

// queueOf is the worker queue j runs on, nil for the inline class.
func (l *loop) queueOf(j job) chan job {
	class := j.spec.Class
	if class == protocol.Shared && l.s.fastShared(j.spec, j.payload) {
		// Cheap and non-blocking at this size: answered here, without the
		// hand-off to a worker and the wake-up to send its reply.
		class = protocol.Inline
	}
	switch class {
	case protocol.Inline:
		return nil
	case protocol.Ordered:
		return l.ordered[peerWorker(j.peer, len(l.ordered))]
	default:
		return l.shared
	}
}

// ownCopy gives j its own copy of its frames when they are in the receive
// buffer, which the next message overwrites (and drops args decoded into
// them: the worker decodes them again).
func (l *loop) ownCopy(frames [][]byte, j *job) {
	if !l.rc.inScratch {
		return
	}
	l.rc.detach(frames)
	j.peer, j.uid, j.typ, j.payload = frames[0], frames[1], frames[2], frames[3:]
	if j.decoded {
		j.decoded, j.args = false, nil
	}
}

// yieldToWorkers lets the workers just handed a request run before the
// socket goroutine blocks in zmq_poll. The hand-off readies a worker on this
// goroutine's P, and a cgo call keeps that P until the runtime's sysmon
// takes it back, up to milliseconds later when the process was idle; with no
// idle P (another goroutine blocked in cgo holds it, as a client in the same
// process does) nothing else runs the worker meanwhile: in a go tool trace
// a COMMIT_STORE right after a worker's 8 ms of copying waited 1.6 ms
// runnable. TestHandOffDoesNotWaitForSysmon guards it.
func (l *loop) yieldToWorkers() {
	if l.handedOff {
		l.handedOff = false
		runtime.Gosched()
	}
}

// charge reserves j's payload bytes in the inbound budget. Over budget the
// socket goroutine stops reading (holding only j) and keeps sending replies
// until queued requests finish; false means shutdown came first.
func (l *loop) charge(j job) bool {
	s := l.s
	if s.in.tryCharge(j.peer, j.cost, s.opts.PeerQueuedRequestBytes, s.opts.QueuedRequestBytes) {
		return true
	}
	s.stats.budgetWaits.Add(1)
	if s.limiter.allow("request_budget") {
		s.log.Warn("queued request bytes over budget: not reading until queued requests finish",
			"peer", hex.EncodeToString(j.peer), "request_bytes", j.cost, "queued_total", s.in.queued(),
			"budget_per_peer", s.opts.PeerQueuedRequestBytes, "budget_total", s.opts.QueuedRequestBytes)
	}
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.in.freed:
		case <-t.C:
			l.flush()
		case <-l.ctx.Done():
			return false
		}
		if s.in.tryCharge(j.peer, j.cost, s.opts.PeerQueuedRequestBytes, s.opts.QueuedRequestBytes) {
			return true
		}
	}
}

// bytesAt reports whether payload frame i of an n-frame payload of spec is
// decoded as bytes (a []byte arg: a slice of the frame, valid while the
// handler runs).
func bytesAt(spec *protocol.Spec, n, i int) bool {
	for _, shape := range spec.Shapes() {
		if len(shape) == n {
			return shape[i] == protocol.TypeBytes
		}
	}
	return false
}

// enqueueSlow waits for room in ch; false: shutdown came first (j dropped).
func (l *loop) enqueueSlow(ch chan job, j job) bool {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case ch <- j:
			return true
		case <-l.ctx.Done():
			l.s.stats.inFlight.Add(-1)
			l.s.in.release(j.peer, j.cost)
			l.s.finish(j, OutcomeDropped)
			return false
		case <-t.C:
			l.flush()
		}
	}
}
