// Package client is a Go LMCache MP client: one ZeroMQ DEALER owned by one
// goroutine, a uid counter, and many outstanding requests matched by uid, each
// with its own deadline. Requests are named and encoded per a protocol profile.
// It is what kvdock's tests, `kvdock ctl` and the benchmarks talk with.
package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"kvdock/core/protocol"
	"kvdock/core/rpc/internal/wake"
)

// ErrTimeout is returned (wrapped) when no reply arrived in time.
var ErrTimeout = errors.New("no reply")

// ErrClosed is returned by calls on a closed client.
var ErrClosed = errors.New("client closed")

// Reply is a server reply. Present is false when the reply had no result
// frame (the handler returned None).
type Reply struct {
	Present bool
	Raw     msgpack.RawMessage
	// Error holds the decoded LMCACHE_RPC_ERROR_V1 body when the profile has
	// error markers and the server sent one.
	Error *RemoteError
}

// Decode unmarshals the result into v; it fails when there was no result.
func (r Reply) Decode(v any) error {
	if !r.Present {
		return errors.New("reply has no result frame")
	}
	if err := msgpack.Unmarshal(r.Raw, v); err != nil {
		return fmt.Errorf("decode reply: %w", err)
	}
	return nil
}

// RemoteError is a mid-era error reply.
type RemoteError struct {
	Type    string `msgpack:"error_type"`
	Message string `msgpack:"message"`
}

func (e *RemoteError) Error() string { return e.Type + ": " + e.Message }

// Options configure a client.
type Options struct {
	// Timeout applies to calls whose context has no deadline (default 5 s).
	Timeout time.Duration
	// MaxMessageBytes sets ZMQ_MAXMSGSIZE on the DEALER (0: no limit).
	MaxMessageBytes int64
}

// Client is safe for concurrent use.
type Client struct {
	profile *protocol.Profile
	opts    Options
	zctx    *zmq.Context
	wake    *wake.Wake
	done    chan struct{}

	mu      sync.Mutex
	nextUID int64
	outbox  []outgoing
	pending map[int64]chan Reply
	closed  bool
	err     error // why the socket goroutine stopped
}

type outgoing struct {
	frames [][]byte // uid, type, payload…
}

// Dial connects a DEALER to endpoint ("tcp://host:port"); like ZMQ, it does not
// wait for the server to be up.
func Dial(endpoint string, profile *protocol.Profile, opts Options) (*Client, error) {
	if profile == nil {
		return nil, errors.New("client: profile is required")
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("client: zmq context: %w", err)
	}
	sock, err := zctx.NewSocket(zmq.DEALER)
	if err != nil {
		zctx.Term()
		return nil, fmt.Errorf("client: dealer socket: %w", err)
	}
	fail := func(err error) (*Client, error) {
		sock.Close()
		zctx.Term()
		return nil, err
	}
	if err := sock.SetLinger(0); err != nil {
		return fail(fmt.Errorf("client: linger: %w", err))
	}
	if opts.MaxMessageBytes > 0 {
		if err := sock.SetMaxmsgsize(opts.MaxMessageBytes); err != nil {
			return fail(fmt.Errorf("client: maxmsgsize: %w", err))
		}
	}
	if err := sock.Connect(endpoint); err != nil {
		return fail(fmt.Errorf("client: connect %s: %w", endpoint, err))
	}
	w, err := wake.New(zctx)
	if err != nil {
		return fail(fmt.Errorf("client: %w", err))
	}
	c := &Client{profile: profile, opts: opts, zctx: zctx, wake: w, done: make(chan struct{}),
		pending: map[int64]chan Reply{}}
	go c.run(sock)
	return c, nil
}

// Profile is the profile the client encodes with.
func (c *Client) Profile() *protocol.Profile { return c.profile }

// Call sends request name (a wire or canonical name of the profile) with args
// encoded as msgpack documents, one frame each, and waits for its reply until
// ctx is done or, without a deadline, the client timeout. []byte args go as
// bin; pass protocol types (Key, RegisterPayload) for structs.
func (c *Client) Call(ctx context.Context, name string, args ...any) (Reply, error) {
	spec, ok := c.profile.ByName(name)
	if !ok {
		return Reply{}, fmt.Errorf("request %q is not in profile %s", name, c.profile.Name)
	}
	frames := make([][]byte, 0, len(args))
	for i, a := range args {
		b, err := protocol.Encode(a)
		if err != nil {
			return Reply{}, fmt.Errorf("%s arg %d: %w", name, i, err)
		}
		frames = append(frames, b)
	}
	return c.CallRaw(ctx, spec.Number, frames...)
}

// CallRaw sends already-encoded payload frames under a type number.
func (c *Client) CallRaw(ctx context.Context, typ int64, payload ...[]byte) (Reply, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.Timeout)
		defer cancel()
	}
	typFrame, err := protocol.Encode(typ)
	if err != nil {
		return Reply{}, err
	}
	ch := make(chan Reply, 1)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return Reply{}, ErrClosed
	}
	uid := c.nextUID
	c.nextUID++
	uidFrame, _ := protocol.Encode(uid)
	c.pending[uid] = ch
	c.outbox = append(c.outbox, outgoing{frames: append([][]byte{uidFrame, typFrame}, payload...)})
	c.mu.Unlock()
	c.wake.Signal()

	select {
	case r := <-ch:
		if r.Error != nil {
			return r, r.Error
		}
		return r, nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, uid)
		c.mu.Unlock()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return Reply{}, fmt.Errorf("request %d uid %d: %w: %w", typ, uid, ErrTimeout, ctx.Err())
		}
		return Reply{}, ctx.Err()
	case <-c.done:
		return Reply{}, ErrClosed
	}
}

// Close stops the socket goroutine; outstanding calls return ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.wake.Signal()
	<-c.done
	return c.err
}

func (c *Client) run(sock *zmq.Socket) {
	defer close(c.done)
	poller := zmq.NewPoller()
	sockID := poller.Add(sock, zmq.POLLIN)
	poller.Add(c.wake.Socket(), zmq.POLLIN)
	// backlog holds messages the DEALER refused (high-water mark reached):
	// the socket goroutine must never block in send, or replies would stall.
	var backlog []outgoing
	for {
		c.wake.Drain()
		c.mu.Lock()
		closed := c.closed
		backlog = append(backlog, c.outbox...)
		clear(c.outbox)
		c.outbox = c.outbox[:0]
		c.mu.Unlock()
		if closed {
			break
		}
		sent := 0
		for _, o := range backlog {
			if !c.send(sock, o.frames) {
				break
			}
			sent++
		}
		clear(backlog[:sent])
		backlog = backlog[sent:]
		events := zmq.POLLIN
		if len(backlog) > 0 {
			events |= zmq.POLLOUT
		}
		_, _ = poller.Update(sockID, events)
		polled, err := poller.Poll(-1)
		if err != nil {
			continue
		}
		for _, p := range polled {
			if p.Socket == sock && p.Events&zmq.POLLIN != 0 {
				c.recvAll(sock)
			}
		}
	}
	c.err = errors.Join(c.wake.Close(), sock.Close(), c.zctx.Term())
}

// send reports false when the DEALER would block; a multipart message is
// accepted whole once its first frame is.
func (c *Client) send(sock *zmq.Socket, frames [][]byte) bool {
	for i, f := range frames {
		flag := zmq.SNDMORE
		if i == len(frames)-1 {
			flag = 0
		}
		if i == 0 {
			flag |= zmq.DONTWAIT
		}
		if _, err := sock.SendBytes(f, flag); err != nil {
			return i > 0
		}
	}
	return true
}

func (c *Client) recvAll(sock *zmq.Socket) {
	for {
		msg, err := sock.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			return
		}
		if len(msg) < 2 {
			continue
		}
		uidV, err := protocol.DecodeValue(protocol.TypeInt, msg[0])
		if err != nil {
			continue
		}
		uid := uidV.(int64)
		r := Reply{}
		switch {
		case len(msg) >= 4 && string(msg[2]) == "LMCACHE_RPC_ERROR_V1":
			var e RemoteError
			if err := msgpack.Unmarshal(msg[3], &e); err != nil {
				e = RemoteError{Type: "undecodable", Message: err.Error()}
			}
			r.Error = &e
		case len(msg) >= 3:
			r.Present, r.Raw = true, msg[2]
		}
		c.mu.Lock()
		ch := c.pending[uid]
		delete(c.pending, uid)
		c.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
}
