// Package client is a Go LMCache MP client: one ZeroMQ DEALER, a uid counter,
// and many outstanding requests matched by uid, each with its own deadline.
// Requests are named and encoded per a protocol profile. It is what kvdock's
// tests, `kvdock ctl` and the benchmarks talk with.
//
// There is no socket goroutine: a calling goroutine that finds the socket free
// takes it (the leader), sends, and receives until its own reply is in,
// handing replies for other uids to their callers. Callers that find the
// socket taken queue their message, wake the leader to send it, and wait for
// their reply or for the socket to come free. A lone caller (every LMCache
// worker) so sends and receives on its own goroutine, with no hand-off.
package client

import (
	"context"
	"errors"
	"fmt"
	"runtime"
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
	done    chan struct{} // closed once Close has closed the sockets

	// token is a one-slot semaphore: whoever put the value in owns sock,
	// poller and backlog (ZMQ sockets are not thread-safe; the channel
	// hand-off is the memory barrier libzmq asks for when a socket changes
	// threads). Close takes it for good.
	token   chan struct{}
	sock    *zmq.Socket
	poller  *zmq.Poller
	sockID  int
	backlog []outgoing // refused by the DEALER (high-water mark), sent first
	// handedOff is set by the leader when it gave another caller its
	// reply since its last poll.
	handedOff bool

	mu      sync.Mutex
	nextUID int64
	outbox  []outgoing // queued by callers while another goroutine led
	pending map[int64]chan Reply
	closed  bool
	err     error // from closing the sockets
}

type outgoing struct {
	frames [][]byte // uid, type, payload…
}

// leaderPoll bounds one wait in zmq_poll so a leader notices a cancelled
// context (a deadline is honoured exactly) and Close.
const leaderPoll = 20 * time.Millisecond

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
		token: make(chan struct{}, 1), sock: sock, poller: zmq.NewPoller(),
		pending: map[int64]chan Reply{}}
	c.sockID = c.poller.Add(sock, zmq.POLLIN)
	c.poller.Add(w.Socket(), zmq.POLLIN)
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
	if c.profile.Message() {
		// One request struct; the reply struct unwrapped so callers see the
		// result as under a frames profile.
		msg, err := protocol.EncodeMessage(spec, args...)
		if err != nil {
			return Reply{}, err
		}
		r, err := c.CallRaw(ctx, spec.Number, msg)
		if err != nil || !r.Present {
			return r, err
		}
		raw, ok, err := protocol.UnwrapReply(spec, r.Raw, protocol.DefaultLimits())
		if err != nil {
			return Reply{}, err
		}
		return Reply{Present: ok, Raw: raw}, nil
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
	// A call whose context is already done sends nothing: the server would
	// act on a request nobody waits for (a PREPARE_STORE would reserve
	// space until its reservation lapses).
	if err := ctx.Err(); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return Reply{}, fmt.Errorf("request %d: %w: %w", typ, ErrTimeout, err)
		}
		return Reply{}, err
	}
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
	frames := make([][]byte, 0, 2+len(payload))
	c.outbox = append(c.outbox, outgoing{frames: append(append(frames, uidFrame, typFrame), payload...)})
	c.mu.Unlock()

	select {
	case c.token <- struct{}{}:
		return c.lead(ctx, typ, uid, ch)
	default:
	}
	// Another goroutine holds the socket: it sends our message once woken.
	c.wake.Signal()
	for {
		select {
		case r := <-ch:
			return result(r)
		case c.token <- struct{}{}:
			return c.lead(ctx, typ, uid, ch)
		case <-ctx.Done():
			return Reply{}, c.abandon(ctx, typ, uid)
		case <-c.done:
			return Reply{}, ErrClosed
		}
	}
}

func result(r Reply) (Reply, error) {
	if r.Error != nil {
		return r, r.Error
	}
	return r, nil
}

// abandon forgets a call whose context ended and says why.
func (c *Client) abandon(ctx context.Context, typ, uid int64) error {
	c.mu.Lock()
	delete(c.pending, uid)
	c.mu.Unlock()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("request %d uid %d: %w: %w", typ, uid, ErrTimeout, ctx.Err())
	}
	return ctx.Err()
}

// lead runs with the token held: it sends every queued message and reads
// replies, delivering each to its caller, until ch has this call's reply, ctx
// ends or the client closes. The token is released on return; a waiting
// caller then takes it over.
func (c *Client) lead(ctx context.Context, typ, uid int64, ch chan Reply) (Reply, error) {
	defer func() { <-c.token }()
	for {
		c.mu.Lock()
		closed := c.closed
		c.backlog = append(c.backlog, c.outbox...)
		clear(c.outbox)
		c.outbox = c.outbox[:0]
		c.mu.Unlock()
		if closed {
			return Reply{}, ErrClosed
		}
		c.flush()
		select {
		case r := <-ch:
			return result(r)
		default:
		}
		if ctx.Err() != nil {
			return Reply{}, c.abandon(ctx, typ, uid)
		}
		wait := leaderPoll
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, max(time.Until(dl), 0))
		}
		events := zmq.POLLIN
		if len(c.backlog) > 0 {
			events |= zmq.POLLOUT
		}
		_, _ = c.poller.Update(c.sockID, events)
		if c.handedOff {
			// Callers just handed their replies were readied on this
			// goroutine's P, which a cgo call keeps until the runtime's
			// sysmon takes it back (milliseconds when the process was
			// busy elsewhere): let them run before blocking in zmq_poll.
			c.handedOff = false
			runtime.Gosched()
		}
		polled, err := c.poller.Poll(wait)
		if err != nil {
			// EINTR, or a persistent error: do not spin on the latter.
			time.Sleep(time.Millisecond)
			continue
		}
		for _, p := range polled {
			switch {
			case p.Socket == c.sock && p.Events&zmq.POLLIN != 0:
				c.recvUntil(ch)
			case p.Socket == c.wake.Socket():
				c.wake.Drain()
			}
		}
	}
}

// flush sends the backlog as far as the DEALER takes it.
func (c *Client) flush() {
	sent := 0
	for _, o := range c.backlog {
		if !c.send(o.frames) {
			break
		}
		sent++
	}
	clear(c.backlog[:sent])
	c.backlog = c.backlog[sent:]
}

// Close closes the socket; outstanding calls return ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		<-c.done
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	// Wake a leader sleeping in poll; it sees closed and lets go. The token is
	// never given back: no one touches the sockets after this.
	c.wake.Signal()
	c.token <- struct{}{}
	c.err = errors.Join(c.wake.Close(), c.sock.Close(), c.zctx.Term())
	close(c.done)
	return c.err
}

// send reports false when the DEALER would block; a multipart message is
// accepted whole once its first frame is.
func (c *Client) send(frames [][]byte) bool {
	for i, f := range frames {
		flag := zmq.SNDMORE
		if i == len(frames)-1 {
			flag = 0
		}
		if i == 0 {
			flag |= zmq.DONTWAIT
		}
		if _, err := c.sock.SendBytes(f, flag); err != nil {
			return i > 0
		}
	}
	return true
}

// recvUntil reads replies without blocking and delivers them, stopping once
// own (the leader's channel) holds its reply or nothing is left to read.
func (c *Client) recvUntil(own chan Reply) {
	for {
		msg, err := c.sock.RecvMessageBytes(zmq.DONTWAIT)
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
			if ch == own {
				return
			}
			c.handedOff = true
		}
	}
}
