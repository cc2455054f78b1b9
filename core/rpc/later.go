package rpc

import (
	"errors"
	"fmt"
	"sync"

	"kvdock/core/protocol"
)

// HeldBytes counts the bytes of reply buffers charged to it
// (Later.ReplyBuffer) that are not released yet: being written, waiting in
// kvdock, or held by libzmq until the peer's connection took them. libzmq's
// I/O thread uncharges a buffer when it is done with it, so a flow control
// that admits large replies can see when one has really left the process.
// The count lives outside the Go heap: Free it once Load reads 0 and
// nothing more will be charged to it.
type HeldBytes struct{ c heldCounter }

// NewHeldBytes returns a counter at 0.
func NewHeldBytes() (*HeldBytes, error) {
	c, err := newHeldCounter()
	if err != nil {
		return nil, err
	}
	return &HeldBytes{c: c}, nil
}

// Load is the bytes charged and not yet released.
func (h *HeldBytes) Load() int64 { return h.c.load() }

// Free releases the counter; only once Load reads 0 and nothing will be
// charged to it again (a buffer still charged would write freed memory).
func (h *HeldBytes) Free() { h.c.free() }

// Later is a deferred answer (Request.Defer): made from any goroutine
// after the handler returned, possibly from reply buffers allocated then.
type Later struct {
	mu     sync.Mutex
	bufs   []replyBuf
	answer func(res any, err error, adopted *replyBuf) // nil: not a running server's request
	done   bool
}

// Defer answers the request later: the handler's own return value is
// ignored, and the reply is made from the first Later.Answer (from any
// goroutine; later calls do nothing), as if the handler had returned its
// arguments then. A request whose answer never comes gets no reply. For flow
// control: a handler that must not block its worker (which serves other
// requests) but may not answer yet.
func (r *Request) Defer() *Later {
	r.deferred.Store(true)
	return &Later{answer: r.laterAnswer()}
}

// ReplyBuffer is Request.ReplyBuffer for a deferred answer: n bytes outside
// the Go heap, sent without a copy when the answer is a protocol.Raw that
// starts at its first byte. When charge is set, the buffer's n bytes are
// charged to it until the buffer is released: by libzmq once the reply was
// written to the peer's connection, or here when it was not used, the reply
// was dropped, or the server stopped. Buffers may not be used after Answer.
func (l *Later) ReplyBuffer(n int, charge *HeldBytes) ([]byte, error) {
	if n < 0 {
		return nil, fmt.Errorf("rpc: reply buffer of %d bytes", n)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return nil, errors.New("rpc: reply buffer asked for after the answer")
	}
	rb, err := allocReply(n)
	if err != nil {
		return nil, err
	}
	if charge != nil {
		rb.charge(charge.c)
	}
	l.bufs = append(l.bufs, rb)
	return rb.b[:0:n], nil
}

// Answer makes the reply from res and err as if the handler had returned
// them now (once; later calls do nothing). A buffer from ReplyBuffer that
// holds res is sent as it is; the others are freed.
func (l *Later) Answer(res any, err error) {
	l.mu.Lock()
	if l.done {
		l.mu.Unlock()
		return
	}
	l.done = true
	bufs := l.bufs
	l.bufs = nil
	l.mu.Unlock()
	var adopted *replyBuf
	if raw, ok := res.(protocol.Raw); ok && err == nil && l.answer != nil {
		for i := range bufs {
			if bufs[i].holds(raw) {
				adopted = &bufs[i]
				break
			}
		}
	}
	for i := range bufs {
		if &bufs[i] != adopted {
			bufs[i].c.release()
		}
	}
	if l.answer != nil {
		l.answer(res, err, adopted)
	}
}
