package rpc

import (
	"encoding/hex"
	"sync"
	"sync/atomic"
	"time"

	"kvdock/core/protocol"
)

// replyPeers is the reply state of every peer, shared by the goroutines
// that make replies (workers, and the socket goroutine for its own) and
// the socket goroutine that sends them. A reply is admitted to its peer's
// budget and copied out of Go memory by the goroutine that made it, right
// after its handler returned: a reply over budget is dropped before it is
// copied, and the Go buffer of every reply is garbage at once, so neither
// piles up in the Go heap while the socket goroutine catches up.
//
// Counters are C memory written by libzmq's I/O thread; a peer's counter
// is recycled (never freed) while Serve runs, and only once no goroutine
// uses it and nothing is charged to it or waits for its peer.
type replyPeers struct {
	mu     sync.Mutex
	m      map[string]*peerOut
	spare  []heldCounter
	users  int  // admissions in progress, all peers
	closed bool // counters freed: nothing more is admitted
	n      atomic.Int64
	total  heldCounter
}

type peerOut struct {
	held  heldCounter
	users int      // admissions in progress (under replyPeers.mu)
	q     []outMsg // waiting replies: socket goroutine only
}

// pending is an admitted reply on its way to the socket goroutine.
type pending struct {
	po *peerOut
	m  outMsg
	// peer names the reply's peer during a handover (see handover.go),
	// "" otherwise.
	peer string
	// key is the peer's id, copied without an allocation, for the loop's
	// record of recent answers (recentAnswers, handover.go).
	key peerKey
}

// acquire returns peer's state for an admission (created if new), or nil
// once the counters are freed.
func (rp *replyPeers) acquire(peer []byte) (*peerOut, error) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if rp.closed {
		return nil, nil
	}
	po := rp.m[string(peer)]
	if po == nil {
		var h heldCounter
		if k := len(rp.spare); k > 0 {
			h, rp.spare = rp.spare[k-1], rp.spare[:k-1]
		} else {
			var err error
			if h, err = newHeldCounter(); err != nil {
				return nil, err
			}
		}
		po = &peerOut{held: h}
		rp.m[string(peer)] = po
		rp.n.Store(int64(len(rp.m)))
	}
	po.users++
	rp.users++
	return po, nil
}

func (rp *replyPeers) release(po *peerOut) {
	rp.mu.Lock()
	po.users--
	rp.users--
	rp.mu.Unlock()
}

// admit reports whether a reply of n bytes fits the budgets: what is charged
// to its peer (waiting here and held by libzmq) stays within the peer's
// budget, and what is charged to all peers within the total. A reply is
// always admitted to a peer with nothing charged while the total allows it,
// and when nothing at all is charged: one reply of any legal size goes.
// Admissions racing for one peer may pass it by a reply each.
func (rp *replyPeers) admit(po *peerOut, n, perPeer, total int64) bool {
	h, tot := po.held.load(), rp.total.load()
	return (h == 0 || h+n <= perPeer) && (tot == 0 || tot+n <= total)
}

// prepare admits r to its peer's budget and copies it out of Go memory;
// false when it was dropped (counted and logged). The caller hands the
// result to the socket goroutine and then calls rp.release(p.po).
func (s *Server) prepare(r *reply) (pending, bool) {
	p, ok := s.admitReply(r)
	if !ok && r.buf != nil {
		r.buf.c.release() // not adopted: freed uncharged
	}
	if ok {
		p.key = keyOf(r.peer)
		if s.handover.Load() != nil {
			p.peer = string(r.peer)
		}
	}
	return p, ok
}

func (s *Server) admitReply(r *reply) (pending, bool) {
	rp := s.rp
	po, err := rp.acquire(r.peer)
	if err != nil {
		s.stats.bad(protocol.KindSendFailed)
		return pending{}, false
	}
	if po == nil {
		return pending{}, false // shut down
	}
	n := r.size()
	if !rp.admit(po, n, s.opts.ReplyBytesPerPeer, s.opts.ReplyBytes) {
		s.stats.repliesDropped.Add(1)
		peerHex := hex.EncodeToString(r.peer)
		if s.limiter.allow("reply_dropped|" + peerHex) {
			s.log.Warn("reply dropped: the peer does not read its replies and its reply budget is full",
				"peer", peerHex, "reply_bytes", n, "charged_to_peer", po.held.load(), "charged_total", rp.total.load(),
				"budget_per_peer", s.opts.ReplyBytesPerPeer, "budget_total", s.opts.ReplyBytes)
		}
		rp.release(po)
		return pending{}, false
	}
	m, err := copyReply(r, po.held, rp.total)
	if err != nil {
		s.stats.bad(protocol.KindSendFailed)
		rp.release(po)
		return pending{}, false
	}
	s.churn.add(m.size)
	return pending{po: po, m: m}, true
}

// copyReply copies r's frames (identity, uid, type, results) into C memory
// charged to peer and total: the small ones in one C call, a large result on
// its own. A result frame written into a ReplyBuffer is adopted, not copied.
func copyReply(r *reply, peer, total heldCounter) (outMsg, error) {
	all := append([][]byte{r.peer, r.uid, r.typ}, r.frames...)
	m := outMsg{frames: make([]cbuf, 0, 3+len(r.frames)), size: r.size(), wire: zmtpBytes(all[1:])}
	packed := 0
	for packed < len(all) && packed < maxPacked && (packed < 3 || r.buf == nil) {
		n := 0
		for _, f := range all[:packed+1] {
			n += len(f)
		}
		if n > packBytes {
			break
		}
		packed++
	}
	var err error
	if packed > 0 {
		if m.frames, err = copyOutPacked(m.frames, all[:packed], peer, total); err != nil {
			return outMsg{}, err
		}
	}
	for i := packed; i < len(all); i++ {
		if i == 3 && r.buf != nil {
			m.frames = append(m.frames, r.buf.adopt(len(all[i]), peer, total))
			r.buf = nil
			continue
		}
		c, err := copyOut(all[i], peer, total)
		if err != nil {
			m.release()
			return outMsg{}, err
		}
		m.frames = append(m.frames, c)
	}
	return m, nil
}

// forgetIdle recycles the counters of peers with nothing charged, waiting
// or being admitted (socket goroutine, under rp.mu).
func (rp *replyPeers) forgetIdleLocked() {
	for key, po := range rp.m {
		if po.users == 0 && len(po.q) == 0 && po.held.load() == 0 {
			delete(rp.m, key)
			rp.spare = append(rp.spare, po.held)
		}
	}
	if len(rp.spare) > 64 {
		for _, h := range rp.spare[64:] {
			h.free()
		}
		rp.spare = rp.spare[:64]
	}
	rp.n.Store(int64(len(rp.m)))
}

// free releases every counter once libzmq has released every message (the
// context is terminated) and no admission is in progress; later admissions
// are refused.
func (rp *replyPeers) free() {
	rp.mu.Lock()
	rp.closed = true
	for rp.users > 0 {
		// An admission copies one reply: it ends soon.
		rp.mu.Unlock()
		time.Sleep(time.Millisecond)
		rp.mu.Lock()
	}
	for key, po := range rp.m {
		po.held.free()
		delete(rp.m, key)
	}
	for _, h := range rp.spare {
		h.free()
	}
	rp.spare = nil
	rp.total.free()
	rp.n.Store(0)
	rp.mu.Unlock()
}

// zmtpBytes is what frames take on a ZMTP 3 connection: each a flags byte
// and a 1-byte length (up to 255 bytes) or an 8-byte one, then its bytes.
func zmtpBytes(frames [][]byte) int64 {
	var n int64
	for _, f := range frames {
		n += int64(len(f)) + 2
		if len(f) > 255 {
			n += 7
		}
	}
	return n
}
