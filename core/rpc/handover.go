package rpc

import (
	"encoding/hex"
	"time"
)

// Handover is how a stop for a restart ends the wire server so that no
// request a worker sent is left unread, and none is answered in a way the
// next process cannot finish. Set it with SetHandover before the stop.
//
// The problem it solves: a request libzmq has read into this process (or
// that sits in the TCP buffers) when the socket closes is gone; the worker
// that sent it waits out its timeout, and upstream's SHM worker raises. A
// worker that is waiting for an answer sends nothing more (every LMCache
// worker call on the data path is synchronous), so the stop runs in two
// phases:
//
//  1. Park: reading goes on. Requests that finish work already begun
//     (Finish: commits, the query of an answered lookup, END_SESSION) are
//     served as usual; every other request is parked, read but not run,
//     which holds its sender. The phase ends once nothing has arrived for
//     Quiet, nothing runs and Busy reports no transfer still expecting its
//     commit — every worker is then waiting on a parked request or idle —,
//     or after Max at the latest.
//  2. Answer: reading stops; the parked requests run (the transfers they
//     begin are carried to the next process by the engine), their answers
//     are handed to libzmq, and the socket closes with Linger so they
//     reach the workers. A worker's next request then goes to the next
//     process on the DEALER's reconnection.
type Handover struct {
	// Finish names the requests served during the park phase (handler
	// names: protocol.CommitStore, …).
	Finish []string
	// Quiet is the silence that ends the park phase (default 25 ms).
	Quiet time.Duration
	// Think is how long a worker answered during (or just before) the
	// park phase may take to send its next request (computing, pickling,
	// or descheduled on a busy host): the phase waits that long for it to
	// be parked too, unless it is (default 200 ms).
	Think time.Duration
	// Max bounds the park phase (default 1 s): a parked request waits at
	// most this long, well inside a worker's timeout (upstream: 2 s and up).
	Max time.Duration
	// Busy reports work begun that its worker will finish with a request
	// of Finish (a prepared store awaiting its commit); nil: none.
	Busy func() bool
	// Linger is how long the close may take to send the last answers
	// (default 2 s).
	Linger time.Duration
	// Parked is called once the park phase ends, before the parked
	// requests run, with their count (the engine turns on carrying).
	Parked func(n int)
}

func (h *Handover) defaults() {
	if h.Quiet <= 0 {
		h.Quiet = 25 * time.Millisecond
	}
	if h.Think <= 0 {
		h.Think = 200 * time.Millisecond
	}
	if h.Max <= 0 {
		h.Max = time.Second
	}
	if h.Linger <= 0 {
		h.Linger = 2 * time.Second
	}
}

// SetHandover makes the next stop a handover (nil: a plain stop, the
// default). It must be called before Shutdown or the cancel of Serve's ctx.
func (s *Server) SetHandover(h *Handover) {
	if h != nil {
		c := *h
		c.defaults()
		h = &c
	}
	s.handover.Store(h)
}

// parkedJob is a request read in the park phase, to run in the answer
// phase: ch is its worker queue (nil: inline).
type parkedJob struct {
	ch chan job
	j  job
}

// handoverState is the socket goroutine's part of a handover.
type handoverState struct {
	h        *Handover
	finish   map[string]bool
	start    time.Time
	parked   []parkedJob
	noRead   bool // the answer phase: no more reads
	holding  bool // the answer phase: replies held until all are made
	unpolled bool // the router is out of the poller
	// answerStart is when the answer phase began.
	answerStart time.Time
	// Per peer, when it was last answered in the park phase and when its
	// last request was parked; before is the last answer before the phase.
	lastAnswer, lastParked map[string]time.Time
	before                 time.Time
	// The TCP end (handover_conns.go): the accepted connections when the
	// answer phase began, what the kernel had sent on them then, the
	// answers' bytes handed to libzmq since, and whether they were shut.
	quiet, baseOK, shut bool
	port                int
	fds                 []int
	base                uint64
	wire                int64
	started             bool
}

// answerPoll is the poll timeout of the answer phase: replies made by the
// workers wake the poll, so this only bounds a missed wake-up.
const answerPoll = 200 * time.Microsecond

// maxParked ends the park phase early: each parked request is charged to
// the inbound budgets or is small, but their count is bounded too.
const maxParked = 4096

// park holds j (read in the park phase) for the answer phase, its frames
// copied out of the receive buffer and its bytes charged as a queued
// request's; true when it is held (its borrowed frames stay borrowed).
func (l *loop) park(frames [][]byte, j job) bool {
	s := l.s
	ch := l.queueOf(j)
	l.ownCopy(frames, &j)
	if ch != nil {
		for _, f := range j.payload {
			j.cost += int64(len(f))
		}
		if !l.charge(j) {
			s.finish(j, OutcomeDropped)
			return false
		}
	}
	s.stats.inFlight.Add(1)
	l.ho.parked = append(l.ho.parked, parkedJob{ch: ch, j: j})
	l.ho.lastParked[string(j.peer)] = time.Now()
	return true
}

// answered notes a reply to peer in the park phase: the peer is thinking
// until its next request is parked.
func (l *loop) answered(peer string) {
	if l.ho.h != nil && !l.ho.noRead {
		l.ho.lastAnswer[peer] = time.Now()
	}
}

// thinking reports a peer answered less than Think ago (or an answer just
// before the phase) whose next request has not been parked yet.
func (l *loop) thinking(now time.Time) bool {
	think := l.ho.h.Think
	if !l.ho.before.IsZero() && now.Sub(l.ho.before) < think {
		return true
	}
	for peer, t := range l.ho.lastAnswer {
		if now.Sub(t) >= think {
			delete(l.ho.lastAnswer, peer)
			continue
		}
		if !l.ho.lastParked[peer].After(t) {
			return true
		}
	}
	return false
}

// begin starts the park phase once Serve's ctx is done and a handover was
// asked for; false when there is none.
func (l *loop) beginHandover() bool {
	if l.ho.started {
		return l.ho.h != nil
	}
	l.ho.started = true
	h := l.s.handover.Load()
	if h == nil {
		return false
	}
	l.ho.h = h
	l.ho.finish = make(map[string]bool, len(h.Finish))
	for _, n := range h.Finish {
		l.ho.finish[n] = true
	}
	l.ho.start = time.Now()
	l.lastRead = l.ho.start
	l.ho.lastAnswer, l.ho.lastParked = map[string]time.Time{}, map[string]time.Time{}
	// The workers answered within Think before the phase may be computing
	// their next request: each is waited for until it is parked, as one
	// answered in the phase is. When the record of recent answers does not
	// reach back that far (a peer id too long to keep, or more answers
	// than it holds), any worker may be: the phase waits Think after the
	// last answer.
	if !l.recent.since(l.ho.start.Add(-h.Think), l.ho.lastAnswer) {
		l.ho.before = l.lastWrite
	}
	l.s.log.Info("rpc server handing over: parking new requests", "quiet", h.Quiet, "max", h.Max)
	return true
}

// recentAnswers is a ring of the last answers: each one's peer id (up to
// maxPeerKey bytes, copied) and time. A reply costs a clock read and a copy
// of its peer's id into the ring.
type recentAnswers struct {
	keys [recentAnswerCount]peerKey
	at   [recentAnswerCount]time.Time
	n    int // answers noted, ever
}

// recentAnswerCount is how many answers the ring holds: a handover waits
// for each worker it answered within Think (200 ms) before it began, as
// long as the ring reaches back that far (20,000 answers a second).
const recentAnswerCount = 4096

// maxPeerKey bounds the peer ids the ring keeps: libzmq names a peer
// without a routing id of its own with 5 bytes.
const maxPeerKey = 32

// peerKey is a peer id of up to maxPeerKey bytes; long marks a longer one,
// not kept.
type peerKey struct {
	b    [maxPeerKey]byte
	n    uint8
	long bool
}

func keyOf(peer []byte) peerKey {
	var k peerKey
	if len(peer) > maxPeerKey {
		k.long = true
		return k
	}
	k.n = uint8(copy(k.b[:], peer))
	return k
}

// note records an answer to k at t.
func (r *recentAnswers) note(k peerKey, t time.Time) {
	i := r.n % recentAnswerCount
	r.keys[i], r.at[i] = k, t
	r.n++
}

// since puts in last, for each peer answered at or after from, its last
// answer; false when the ring cannot tell them all: it does not reach back
// to from, or an answer since went to a peer id too long to keep.
func (r *recentAnswers) since(from time.Time, last map[string]time.Time) bool {
	kept := min(r.n, recentAnswerCount)
	for j := 1; j <= kept; j++ {
		i := (r.n - j) % recentAnswerCount
		t := r.at[i]
		if t.Before(from) {
			return true
		}
		k := &r.keys[i]
		if k.long {
			return false
		}
		if id := string(k.b[:k.n]); t.After(last[id]) {
			last[id] = t
		}
	}
	return r.n <= recentAnswerCount // the whole history is in the ring
}

// parks reports whether a request of this name is parked now.
func (l *loop) parks(name string) bool {
	return l.ho.h != nil && !l.ho.noRead && !l.ho.finish[name]
}

// handing reports whether the loop goes on in a handover, moving it from
// park to answer when the park phase is over, and ending it once every
// parked request is answered and libzmq has taken the answers.
func (l *loop) handing() bool {
	h := l.ho.h
	now := time.Now()
	running := l.s.stats.inFlight.Load() - int64(len(l.ho.parked))
	if !l.ho.noRead {
		running += l.s.later.Load() + l.s.replying.Load()
		quiet := now.Sub(l.lastRead) >= h.Quiet && running == 0 && !l.thinking(now) && (h.Busy == nil || !h.Busy())
		if !quiet && now.Sub(l.ho.start) < h.Max && len(l.ho.parked) < maxParked {
			return true
		}
		l.ho.noRead = true
		l.ho.quiet = quiet
		l.ho.port = l.s.boundPort()
		if quiet {
			// Every earlier answer left long ago: what the kernel sends on
			// the connections from here on is the parked requests' answers.
			l.ho.fds = acceptedConns(l.ho.port)
			l.ho.base, l.ho.baseOK = bytesSent(l.ho.fds)
			cork(l.ho.fds)
		}
		n := len(l.ho.parked)
		l.s.log.Info("rpc server handing over: answering parked requests", "parked", n,
			"after", now.Sub(l.ho.start).Round(time.Millisecond), "quiet", running == 0)
		if h.Parked != nil {
			h.Parked(n)
		}
		l.s.stats.handoverParked.Add(int64(n))
		// The answers are held until every one is made, then handed to
		// libzmq together: a worker answered early could otherwise send
		// its next request while the others are still being worked on,
		// into a connection that reads no more.
		l.ho.holding = true
		for _, p := range l.ho.parked {
			l.run1(p)
		}
		l.ho.parked = nil
		l.ho.answerStart = now
	}
	l.flush() // take the workers' replies (a deferred answer's among them)
	if now.Sub(l.ho.answerStart) < h.Linger &&
		(l.s.stats.inFlight.Load() > 0 || l.s.replying.Load() > 0 || l.s.later.Load() > 0 || l.s.repliesQueued()) {
		return true
	}
	// Every answer is made: out they go, together, while libzmq takes them
	// (a peer at its HWM keeps its replies here; bounded by the linger).
	l.ho.holding = false
	for l.retry(); l.outBytes > 0 && time.Since(l.ho.answerStart) < h.Linger; l.retry() {
		time.Sleep(50 * time.Microsecond)
	}
	// End the connections now, not after the drain's bookkeeping: each
	// microsecond between a worker's last answer and the connection's end
	// is one in which it may send its next request down the closing
	// connection (see handover_conns.go).
	if l.ho.quiet && l.ho.baseOK && l.ho.port > 0 {
		l.ho.shut = shutWhenWritten(l.ho.fds, l.ho.base, uint64(max(l.ho.wire, 0)), l.ho.port)
	}
	late := l.lateRequests()
	l.s.log.Info("rpc server handed over", "answered_bytes", l.ho.wire, "connections", len(l.ho.fds), "shut", l.ho.shut,
		"unanswered", late)
	l.s.closeRouter()
	return false
}

// lateWait is how long the end reads what still arrives on the shut
// connections: a request a worker sent before its libzmq saw the end.
const lateWait = 20 * time.Millisecond

// lateRequests reads, counts and logs the requests that arrived after the
// last answers (they cannot be answered: the write sides are shut, and the
// next process will not know the peer); the count is what the handover
// lost.
func (l *loop) lateRequests() int {
	n := 0
	deadline := time.Now().Add(lateWait)
	for time.Now().Before(deadline) {
		frames, held, _, _, _, ok := l.rc.recv(l.s.maxMessage(), &l.s.inflight)
		if !ok {
			time.Sleep(100 * time.Microsecond)
			continue
		}
		if len(frames) >= 3 && l.s.limiter.allow("handover_late") {
			l.s.log.Warn("request arrived after the handover's last answer: not answered", "peer", hex.EncodeToString(frames[0]))
		}
		held.release()
		n++
	}
	l.s.stats.handoverLost.Add(int64(n))
	return n
}

// run1 runs a parked request as dispatch would have.
func (l *loop) run1(p parkedJob) {
	j := p.j
	if p.ch == nil {
		defer j.held.release()
		if !j.decoded && !l.s.decodePayload(&j, l.send) {
			l.s.stats.inFlight.Add(-1)
			return
		}
		if r, ok := l.s.execute(l.hctx, j); ok {
			l.send(r)
		}
		return
	}
	select {
	case p.ch <- j:
		l.handedOff = true
	default:
		// The queue is full: wait for room, sending replies meanwhile.
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case p.ch <- j:
				l.handedOff = true
				return
			case <-t.C:
				l.flush()
			}
		}
	}
}

// repliesQueued reports replies made by the workers that the socket
// goroutine has not taken yet.
func (s *Server) repliesQueued() bool {
	s.replyMu.Lock()
	defer s.replyMu.Unlock()
	return len(s.replies) > 0
}

// lingerFor is the close's linger: the handover's, else none.
func (s *Server) lingerFor() time.Duration {
	if h := s.handover.Load(); h != nil {
		return h.Linger
	}
	return 0
}
