// Package wake lets goroutines wake a goroutine that sleeps in zmq_poll: a pair
// of inproc PAIR sockets whose receiving end joins the poller. ZMQ sockets are
// not thread-safe, so the sending end is guarded, and a wake byte is sent only
// when none is pending (a race can leave one extra: a spurious wake-up).
package wake

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	zmq "github.com/pebbe/zmq4"
)

// Wake is one notifier. Producers publish their work first, then call Signal;
// the owner, when Socket() polls readable, calls Drain and then takes the work.
type Wake struct {
	mu      sync.Mutex
	tx      *zmq.Socket
	rx      *zmq.Socket
	closed  bool
	pending atomic.Bool
}

// New creates the socket pair in zctx.
func New(zctx *zmq.Context) (*Wake, error) {
	w := &Wake{}
	addr := fmt.Sprintf("inproc://kvdock-wake-%p", w)
	rx, err := zctx.NewSocket(zmq.PAIR)
	if err != nil {
		return nil, fmt.Errorf("wake socket: %w", err)
	}
	if err := rx.Bind(addr); err != nil {
		rx.Close()
		return nil, fmt.Errorf("wake bind %s: %w", addr, err)
	}
	tx, err := zctx.NewSocket(zmq.PAIR)
	if err != nil {
		rx.Close()
		return nil, fmt.Errorf("wake socket: %w", err)
	}
	if err := tx.Connect(addr); err != nil {
		rx.Close()
		tx.Close()
		return nil, fmt.Errorf("wake connect %s: %w", addr, err)
	}
	_ = rx.SetLinger(0)
	_ = tx.SetLinger(0)
	w.rx, w.tx = rx, tx
	return w, nil
}

// Socket is the receiving end, to add to the owner's poller for POLLIN.
func (w *Wake) Socket() *zmq.Socket { return w.rx }

// Signal wakes the owner unless a wake is already outstanding. Safe for
// concurrent use; a no-op after Close.
func (w *Wake) Signal() {
	if !w.pending.CompareAndSwap(false, true) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	// DONTWAIT: an inproc PAIR with an idle peer never fills (one byte
	// outstanding), and a failed hint must not block a worker.
	_, _ = w.tx.SendBytes([]byte{1}, zmq.DONTWAIT)
}

// Drain consumes wake bytes; call it from the owner before taking work.
func (w *Wake) Drain() {
	// Read first, then clear: a Signal that lands in between finds pending
	// still set and sends nothing, but its work was published before it, so
	// the owner's take after Drain sees it. Clearing first could leave pending
	// set with no byte outstanding, and every later Signal would be lost.
	// One read: a Signal racing a Drain can leave a second byte behind, which
	// costs one spurious wake-up later; reading until EAGAIN would cost an
	// extra libzmq call on every wake-up instead.
	_, _ = w.rx.RecvBytes(zmq.DONTWAIT)
	w.pending.Store(false)
}

// Close closes both sockets; later Signals do nothing.
func (w *Wake) Close() error {
	w.mu.Lock()
	w.closed = true
	err := w.tx.Close()
	w.mu.Unlock()
	return errors.Join(err, w.rx.Close())
}
