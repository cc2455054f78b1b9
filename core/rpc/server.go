// Package rpc is kvdock's LMCache MP transport: a ZeroMQ ROUTER server that
// decodes requests under a protocol profile, runs them inline, on a per-peer
// FIFO worker or on a shared pool, and sends the replies from the one
// goroutine that owns the socket. Requests are [identity, uid, type,
// payload…]; replies echo uid and type byte for byte, with no result frame
// when the handler returns nil. Bad input is counted and logged
// (rate-limited), never stops the loop and, in the seed profiles, is never
// answered.
//
// A peer controls how much it sends and whether it reads, so everything it
// can make the server hold is bounded: frames by ZMQ_MAXMSGSIZE (libzmq
// drops the peer) and messages by Options.MessageCap; queued requests by a
// byte budget per peer and in total (over it the socket goroutine stops
// reading, dropping nothing); replies by ReplyBytesPerPeer and ReplyBytes,
// charged until libzmq has written them (an unread reply is dropped, never
// waited for); connections that do not finish the ZMTP handshake by
// HandshakeTimeout. Freed memory goes back to the OS when the server idles
// (malloc.go).
package rpc

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"unsafe"

	zmq "github.com/pebbe/zmq4"
	"golang.org/x/sys/unix"

	"kvdock/core/protocol"
	"kvdock/core/rpc/internal/wake"
)

// Request is one decoded request as a handler sees it. Args follow the
// profile's payload types (protocol.Type*); []byte args are slices of the
// received frame, valid only while the handler runs, and so is Peer (a
// request answered on the socket goroutine is read into a buffer that the
// next message reuses): copy what is kept.
type Request struct {
	Peer []byte // ZMQ identity of the sender
	Name string // wire name in the active profile
	Args []any
	Spec *protocol.Spec
	// Tentative (--protocol auto): the sender's table is not decided yet,
	// and Spec is the reading of one of several tables that read this
	// request alike.
	Tentative bool

	bufs     []replyBuf
	srv      *Server // nil: not a running server's request (a test's own)
	head     job     // what a deferred reply needs (peer, uid, type, profile)
	deferred atomic.Bool
}

// laterAnswer returns what answers r once its handler has returned: it keeps
// copies of what the reply needs (made now, while the frames are valid),
// not the message's buffer with its payload, so a waiting request holds
// little. Nil when r is not a running server's request.
func (r *Request) laterAnswer() func(res any, err error, adopted *replyBuf) {
	s := r.srv
	if s == nil {
		return nil
	}
	j := r.head
	later := job{peer: bytes.Clone(j.peer), uid: bytes.Clone(j.uid), typ: bytes.Clone(j.typ), prof: j.prof, spec: j.spec, start: j.start}
	s.later.Add(1)
	return func(res any, err error, adopted *replyBuf) {
		defer s.later.Add(-1)
		if rep, ok := s.result(later, adopted, res, err, false); ok {
			s.reply(rep)
		}
	}
}

// ReplyBuffer returns n bytes outside the Go heap for the handler to encode
// its reply into: a protocol.Raw result that starts at the buffer's first
// byte (and is no longer than n) is sent from it as it is, without the copy
// out of Go memory that every other reply takes. Buffers not returned that
// way are freed when the handler returns; none may be used after it. For
// large replies (pickled chunks), so that they never live on the Go heap.
func (r *Request) ReplyBuffer(n int) ([]byte, error) {
	if n < 0 {
		return nil, fmt.Errorf("rpc: reply buffer of %d bytes", n)
	}
	rb, err := allocReply(n)
	if err != nil {
		return nil, err
	}
	r.bufs = append(r.bufs, rb)
	return rb.b[:0:n], nil
}

// Handler serves one canonical request. A nil result sends no result frame; an
// error is counted and logged and, in the seed profiles, not answered.
type Handler func(ctx context.Context, req *Request) (any, error)

// Observer receives one call per dispatched request (for metrics). Outcome is
// "ok", "error" or "dropped". It is called from several goroutines.
type Observer interface {
	OnRequest(name, outcome string, dur time.Duration)
}

// Outcomes passed to Observer and counted in Stats.
const (
	OutcomeOK      = "ok"
	OutcomeError   = "error"
	OutcomeDropped = "dropped"
)

// Options configure a Server. Zero values take the documented defaults.
type Options struct {
	Host string // "localhost" is resolved to 127.0.0.1; default localhost
	// Port 0 binds an ephemeral port (see Endpoint).
	Port int
	// Listener, when set, is a listening socket kept across a restart's
	// exec (KeepListener) for the endpoint ListenerFor: Bind serves on it
	// instead of binding one when it is a listening TCP socket kept for
	// this server's endpoint, and closes it either way (listener.go).
	Listener    *os.File
	ListenerFor string
	Profile     *protocol.Profile // required; the default when Detect is set
	// Detect, when set, makes the server tell each peer's table from its
	// messages among these profiles, newest first (--protocol auto; see
	// auto.go); Profile must be one of them.
	Detect []*protocol.Profile
	// MaxDetectPeers bounds the peers whose detection state is kept, in
	// each of the undecided and decided tables (default 16384; least
	// recently seen dropped first).
	MaxDetectPeers int
	// Instances, with Detect, names the tables registered instances were
	// registered through: a message naming one is served under its table,
	// and a peer holding one speaks its table, whatever the detection
	// tables hold (auto.go).
	Instances Instances
	// OrderedWorkers serve the per-peer FIFO class (default 1).
	OrderedWorkers int
	// SharedWorkers serve the shared class (default 1).
	SharedWorkers int
	// MaxMessageBytes is ZMQ_MAXMSGSIZE and the limit on a whole message
	// (default 1 GiB); an upper bound on MessageCap.
	MaxMessageBytes int64
	// MessageCap, when set, is the current limit on a whole message, asked
	// once per message and clamped to MaxMessageBytes (the engine derives it
	// from the registered layouts: the largest legal commit).
	MessageCap func() int64
	// MaxTokensPerRequest caps the token ids of one key (default
	// protocol.DefaultMaxTokens): checked at decode, before allocating.
	MaxTokensPerRequest int
	// SendHWM is the ROUTER send high-water mark in messages per peer
	// (default 1000); replies beyond it wait in kvdock under the reply budget.
	SendHWM int
	// HandshakeTimeout is ZMQ_HANDSHAKE_IVL: a connection that has not
	// completed its ZMTP handshake within it is closed (default 5 s).
	HandshakeTimeout time.Duration
	// RecvHWM is the ROUTER receive high-water mark in messages per peer
	// (default 16): what libzmq holds for a peer while the server does not read.
	RecvHWM int
	// QueueDepth is the job queue length per worker group (default 1024);
	// when full, the socket goroutine stops reading (backpressure).
	QueueDepth int
	// QueuedRequestBytes bounds the payload bytes of requests queued for
	// the workers, in total (default 256 MiB) and per peer (default 64 MiB);
	// over either the socket goroutine stops reading. A message is always
	// admitted when nothing of its peer (or nothing at all) is queued.
	QueuedRequestBytes     int64
	PeerQueuedRequestBytes int64
	// ReplyBytesPerPeer bounds the reply bytes kept for one peer, waiting
	// in kvdock or held by libzmq (sent but not yet written to its
	// connection: the peer does not read), default 128 MiB; a reply past it
	// is dropped and counted. ReplyBytes bounds the same for all peers
	// (default 1 GiB). A reply is always admitted to a peer with nothing
	// kept while the total allows it, and when nothing is kept at all.
	ReplyBytes        int64
	ReplyBytesPerPeer int64
	// InFlightBytes bounds the large request frames (1 MiB and more: pickled
	// chunks) held from their receive until their handler is done: over it
	// the socket goroutine reads no further message until enough is released
	// (default 256 MiB). A message is always read when nothing is in flight.
	InFlightBytes int64
	// FastShared names shared-class handlers that are cheap and never
	// block (a lookup in memory, a status read): with a payload of at most
	// FastSharedBytes (default 64 KiB) they run on the socket goroutine like
	// the inline class, so their reply leaves without a hand-off to a worker
	// and back. Larger payloads (a key of many tokens to hash) still go to
	// the shared workers, so no peer stalls the socket goroutine for long.
	FastShared      []string
	FastSharedBytes int
	// PollFault, when set, is called before each poll and a non-nil error
	// counts as a failed poll: fault injection for tests of the failure path.
	PollFault func() error
	// DrainTimeout bounds the wait for in-flight handlers on shutdown
	// (default 5 s).
	DrainTimeout time.Duration
	// StopGrace is how long a stop keeps reading and answering while
	// requests are in flight or still arriving (quiet for stopQuiet ends it
	// sooner), so that a worker's request sent just before the stop is
	// answered rather than dropped unread (0: none). Off by default: across
	// a restart it turns some unanswered requests into a prepare answered by
	// the old process and a commit refused by the new one.
	StopGrace time.Duration
	// LogInterval is the rate limit for bad-input logs: once per kind per peer
	// per interval (default 10 s).
	LogInterval time.Duration
	Logger      *slog.Logger
	Observer    Observer
}

func (o *Options) defaults() error {
	if o.Profile == nil {
		return errors.New("rpc: Options.Profile is required")
	}
	if o.Host == "" {
		o.Host = "localhost"
	}
	if o.Port < 0 || o.Port > 65535 {
		return fmt.Errorf("rpc: port %d out of range 0-65535", o.Port)
	}
	o.OrderedWorkers = positiveOr(o.OrderedWorkers, 1)
	o.SharedWorkers = positiveOr(o.SharedWorkers, 1)
	o.MaxMessageBytes = positiveOr(o.MaxMessageBytes, 1<<30)
	o.MaxTokensPerRequest = positiveOr(o.MaxTokensPerRequest, protocol.DefaultMaxTokens)
	o.SendHWM = positiveOr(o.SendHWM, 1000)
	o.RecvHWM = positiveOr(o.RecvHWM, 16)
	o.HandshakeTimeout = positiveOr(o.HandshakeTimeout, 5*time.Second)
	o.QueueDepth = positiveOr(o.QueueDepth, 1024)
	o.QueuedRequestBytes = positiveOr(o.QueuedRequestBytes, 256<<20)
	o.PeerQueuedRequestBytes = positiveOr(o.PeerQueuedRequestBytes, 64<<20)
	o.ReplyBytes = positiveOr(o.ReplyBytes, 1<<30)
	o.ReplyBytesPerPeer = positiveOr(o.ReplyBytesPerPeer, 128<<20)
	o.FastSharedBytes = positiveOr(o.FastSharedBytes, 64<<10)
	o.InFlightBytes = positiveOr(o.InFlightBytes, 256<<20)
	o.DrainTimeout = positiveOr(o.DrainTimeout, 5*time.Second)
	o.LogInterval = positiveOr(o.LogInterval, 10*time.Second)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// maxFrames caps the frames kept per message; no profile request has more
// than 4 payload frames, so anything longer is wrong arity anyway.
const maxFrames = 16

// errorMarker is the mid-era error reply frame (spec 1.6).
const errorMarker = "LMCACHE_RPC_ERROR_V1"

// ErrHandlersRunning is returned (wrapped) by Serve and Shutdown when the
// drain ended with handlers still running: they may still use what they were
// given (views of the pool), so the caller must not free it yet.
var ErrHandlersRunning = errors.New("rpc: handlers still running after the drain")

// ErrServerClosed is returned by a Serve that Shutdown overtook before it
// ran: nothing was served, nothing is in flight.
var ErrServerClosed = errors.New("rpc: server shut down before Serve ran")

// Server is the ROUTER server. Create with New, register handlers with Handle,
// then Bind (optional: Serve binds if needed) and Serve.
type Server struct {
	detect *detector // nil unless Options.Detect: only the socket goroutine uses it
	opts   Options
	log    *slog.Logger
	lim    protocol.Limits

	hmu      sync.RWMutex
	handlers map[string]Handler

	stats    *stats
	limiter  *limiter
	endpoint atomic.Value  // string
	bound    chan struct{} // closed once bound

	// Sockets, set by Bind and owned by Serve's goroutine from then on.
	bindMu sync.Mutex
	zctx   *zmq.Context
	router *zmq.Socket
	raw    unsafe.Pointer // router's libzmq handle
	// routerClosed: closeRouter ran (the socket goroutine, or closeSockets
	// under bindMu, once Serve is done).
	routerClosed bool
	monitor      *zmq.Socket

	replyMu sync.Mutex
	replies []pending // admitted replies for the socket goroutine
	closed  bool
	wake    *wake.Wake
	rp      *replyPeers // set by Serve before anything replies

	in    inBudget
	churn churn // large message bytes since memory was last given back
	// inflight is the bytes of large request frames borrowed from libzmq
	// (received, their handler not done yet).
	inflight atomic.Int64

	serving      atomic.Bool
	draining     atomic.Bool // set once reading stopped: queued jobs are dropped
	handover     atomic.Pointer[Handover]
	later        atomic.Int64  // deferred answers not made yet
	replying     atomic.Int64  // workers between a handler's end and its reply's queueing
	abandon      chan struct{} // closed when a Shutdown's ctx ended: stop draining
	abandonOnce  sync.Once
	stopMu       sync.Mutex
	stopReq      bool
	stopServe    context.CancelFunc
	served       chan struct{} // closed when Serve has returned
	handlersDone chan struct{} // closed when no handler runs any more
}

type job struct {
	peer, uid, typ []byte
	prof           *protocol.Profile // the table the request was read under
	spec           *protocol.Spec
	payload        [][]byte // frames after type, until decoded into args
	decoded        bool
	args           []any
	tentative      bool // read before its peer's table was decided
	start          time.Time
	cost           int64     // payload bytes charged to the inbound budget
	held           *borrowed // payload frames still in libzmq's buffers
}

type reply struct {
	peer, uid, typ []byte
	frames         [][]byte // result frames after uid and type (0, 1 or 2)
	// buf, when set, holds frames[0] (written by the handler into a
	// ReplyBuffer): it is adopted instead of copied, or freed if dropped.
	buf *replyBuf
}

func (r *reply) size() int64 {
	n := int64(len(r.peer) + len(r.uid) + len(r.typ))
	for _, f := range r.frames {
		n += int64(len(f))
	}
	return n
}

// New checks the options; nothing is bound until Bind or Serve.
func New(opts Options) (*Server, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	s := &Server{
		opts:         opts,
		log:          opts.Logger.With("protocol", opts.Profile.Name),
		lim:          protocol.Limits{MaxTokens: opts.MaxTokensPerRequest, MaxString: protocol.DefaultMaxString},
		handlers:     map[string]Handler{},
		stats:        newStats(append([]*protocol.Profile{opts.Profile}, opts.Detect...)...),
		limiter:      newLimiter(opts.LogInterval),
		bound:        make(chan struct{}),
		in:           inBudget{peer: map[string]int64{}, freed: make(chan struct{}, 1)},
		served:       make(chan struct{}),
		handlersDone: make(chan struct{}),
		abandon:      make(chan struct{}),
	}
	if len(opts.Detect) > 0 {
		d, err := newDetector(opts.Detect, opts.Profile, opts.MaxDetectPeers)
		if err != nil {
			return nil, err
		}
		s.detect = d
		s.log = opts.Logger.With("protocol", "auto")
	}
	s.endpoint.Store("")
	return s, nil
}

// Handle registers h under a canonical request name (protocol.CanonicalNames).
// Handlers may be registered before or during Serve.
func (s *Server) Handle(name string, h Handler) {
	s.hmu.Lock()
	s.handlers[name] = h
	s.hmu.Unlock()
}

func (s *Server) handler(name string) Handler {
	s.hmu.RLock()
	defer s.hmu.RUnlock()
	return s.handlers[name]
}

// Endpoint is the bound endpoint (e.g. "tcp://127.0.0.1:5555"), "" before bind.
func (s *Server) Endpoint() string { return s.endpoint.Load().(string) }

// Bound is closed once the socket is bound (Endpoint is then set); a bind
// error is returned by Bind (or Serve) instead.
func (s *Server) Bound() <-chan struct{} { return s.bound }

// HandlersDone is closed once Serve has returned and no handler is running.
func (s *Server) HandlersDone() <-chan struct{} { return s.handlersDone }

// Profile is the active protocol profile.
func (s *Server) Profile() *protocol.Profile { return s.opts.Profile }

// Detect returns the tables detected per peer (--protocol auto), nil for a
// server of one profile.
func (s *Server) Detect() []*protocol.Profile { return s.opts.Detect }

// fastShared reports whether a shared request runs on the socket goroutine.
func (s *Server) fastShared(spec *protocol.Spec, payload [][]byte) bool {
	if !slices.Contains(s.opts.FastShared, spec.Handler) {
		return false
	}
	n := 0
	for _, f := range payload {
		n += len(f)
	}
	return n <= s.opts.FastSharedBytes
}

// LastMessage is when the server last read a request or queued a reply,
// the zero time before the first: the tiers' write-behind writers wait for
// a quiet moment on the request path before each piece they write.
func (s *Server) LastMessage() time.Time {
	if n := s.churn.last.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// maxMessage is the limit on the message being read now.
func (s *Server) maxMessage() int64 {
	limit := s.opts.MaxMessageBytes
	if s.opts.MessageCap != nil {
		if c := s.opts.MessageCap(); c > 0 && c < limit {
			limit = c
		}
	}
	return limit
}

// resolveTimeout bounds the name lookup of the bind host.
const resolveTimeout = 10 * time.Second

// endpointFor resolves the bind host: libzmq accepts names, but we want the
// endpoint we log and expose to be an address.
func endpointFor(host string, port int) (ep string, ipv6 bool, err error) {
	portStr := "*"
	if port > 0 {
		portStr = strconv.Itoa(port)
	}
	switch host {
	case "localhost":
		host = "127.0.0.1"
	case "*", "0.0.0.0":
		return "tcp://" + host + ":" + portStr, false, nil
	}
	ip := net.ParseIP(host)
	if ip == nil {
		// Bind runs under the engine's lifecycle lock: a stuck resolver
		// must not hold it for long.
		ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
		addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
		cancel()
		if err != nil || len(addrs) == 0 {
			return "", false, fmt.Errorf("resolve host %q: %w", host, err)
		}
		ip = addrs[0].IP
		for _, c := range addrs {
			if c.IP.To4() != nil {
				ip = c.IP
				break
			}
		}
	}
	if ip.To4() != nil {
		return "tcp://" + ip.String() + ":" + portStr, false, nil
	}
	return "tcp://[" + ip.String() + "]:" + portStr, true, nil
}

// Bind creates and binds the socket, so a bind error (port taken) reaches
// the caller before anything runs; Serve then serves it. Binding twice is an
// error.
func (s *Server) Bind() error {
	s.bindMu.Lock()
	defer s.bindMu.Unlock()
	if s.router != nil {
		return errors.New("rpc: already bound")
	}
	ep, ipv6, err := endpointFor(s.opts.Host, s.opts.Port)
	if err != nil {
		return fmt.Errorf("rpc: %w", err)
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		return fmt.Errorf("rpc: zmq context: %w", err)
	}
	router, err := zctx.NewSocket(zmq.ROUTER)
	if err != nil {
		_ = zctx.Term()
		return fmt.Errorf("rpc: router socket: %w", err)
	}
	fail := func(err error) error {
		_ = router.SetLinger(0)
		_ = router.Close()
		_ = zctx.Term()
		return err
	}
	for _, set := range []func() error{
		func() error { return router.SetMaxmsgsize(s.opts.MaxMessageBytes) },
		func() error { return router.SetSndhwm(s.opts.SendHWM) },
		func() error { return router.SetRcvhwm(s.opts.RecvHWM) },
		// A connection that says nothing holds a file until this ends.
		func() error { return router.SetHandshakeIvl(s.opts.HandshakeTimeout) },
		// Refuse (EAGAIN), not drop, a reply to a peer at the HWM, and say
		// when a peer is gone (EHOSTUNREACH): the server budgets what waits.
		func() error { return router.SetRouterMandatory(1) },
		func() error { return router.SetLinger(0) },
		func() error { return router.SetIpv6(ipv6) },
	} {
		if err := set(); err != nil {
			return fail(fmt.Errorf("rpc: socket option: %w", err))
		}
	}
	raw, err := rawSocket(router)
	if err != nil {
		return fail(err)
	}
	if fd, err := s.takeListener(ep); err != nil {
		s.log.Warn("rpc: the listening socket kept across the restart is not used; binding a new one", "err", err)
	} else if fd >= 0 {
		if err := router.SetUseFd(fd); err != nil {
			_ = unix.Close(fd)
			s.log.Warn("rpc: the listening socket kept across the restart is not used; binding a new one", "err", err)
		} else {
			s.log.Info("rpc: serving on the listening socket kept across the restart", "endpoint", ep)
		}
	}
	if err := router.Bind(ep); err != nil {
		return fail(fmt.Errorf("bind %s: %w", ep, err))
	}
	bound, _ := router.GetLastEndpoint()
	if bound == "" {
		bound = ep
	}
	monAddr := fmt.Sprintf("inproc://kvdock-rpc-monitor-%p", s)
	var monitor *zmq.Socket
	if err := router.Monitor(monAddr, zmq.EVENT_DISCONNECTED); err == nil {
		if monitor, err = zctx.NewSocket(zmq.PAIR); err == nil {
			if err = monitor.Connect(monAddr); err != nil {
				monitor.Close()
				monitor = nil
			}
		}
	}
	w, err := wake.New(zctx)
	if err != nil {
		if monitor != nil {
			_ = router.Monitor("", 0)
			_ = monitor.SetLinger(0)
			_ = monitor.Close()
		}
		return fail(fmt.Errorf("rpc: %w", err))
	}
	s.zctx, s.router, s.raw, s.monitor = zctx, router, raw, monitor
	s.replyMu.Lock()
	s.wake, s.closed, s.replies = w, false, nil
	s.replyMu.Unlock()
	s.endpoint.Store(bound)
	close(s.bound)
	return nil
}

// openFilesLimit is the soft RLIMIT_NOFILE (the Go runtime raises it to the
// hard limit at start): the bound on ZMQ connections with everything else
// kvdock opens; -1 if unknown.
func openFilesLimit() int64 {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > math.MaxInt64 {
		return -1
	}
	return int64(lim.Cur)
}

// closeRouter closes the ROUTER socket (once). A handover's last answers
// are in libzmq's queues: they go out before the connections close
// (bounded by the linger).
func (s *Server) closeRouter() {
	if s.router == nil || s.routerClosed {
		return
	}
	s.routerClosed = true
	_ = s.router.SetLinger(s.lingerFor())
	_ = s.router.Close()
}

// closeSockets releases what Bind created (the caller owns the sockets).
func (s *Server) closeSockets() {
	s.replyMu.Lock()
	for i := range s.replies {
		s.replies[i].m.release()
	}
	s.closed, s.replies = true, nil
	w := s.wake
	s.replyMu.Unlock()
	if w != nil {
		_ = w.Close()
	}
	if s.monitor != nil {
		_ = s.router.Monitor("", 0)
		_ = s.monitor.SetLinger(0)
		_ = s.monitor.Close()
	}
	s.closeRouter()
	if s.zctx != nil {
		_ = s.zctx.Term()
	}
}

// Serve binds (unless Bind did) and runs the socket loop until ctx is done
// or Shutdown is called, then stops reading, drops the requests still
// queued (counted as dropped), lets the running handlers finish (bounded by
// DrainTimeout, or by the ctx of a Shutdown), sends their replies and closes
// the socket with linger 0. It returns a bind error at once; an error wrapping
// ErrHandlersRunning when the drain timed out; and an error when the socket
// failed (polls failing repeatedly), which is the only way it returns by
// itself.
func (s *Server) Serve(ctx context.Context) error {
	if !s.serving.CompareAndSwap(false, true) {
		s.stopMu.Lock()
		stopped := s.stopReq
		s.stopMu.Unlock()
		if stopped {
			return ErrServerClosed
		}
		return errors.New("rpc: Serve called twice")
	}
	defer close(s.served)
	s.bindMu.Lock()
	needBind := s.router == nil
	s.bindMu.Unlock()
	if needBind {
		if err := s.Bind(); err != nil {
			close(s.handlersDone)
			return err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.stopMu.Lock()
	s.stopServe = cancel
	if s.stopReq {
		cancel()
	}
	s.stopMu.Unlock()

	router, w := s.router, s.wake
	bound := s.Endpoint()
	total, err := newHeldCounter()
	if err != nil {
		s.bindMu.Lock()
		s.closeSockets()
		s.bindMu.Unlock()
		close(s.handlersDone)
		return err
	}
	s.rp = &replyPeers{m: map[string]*peerOut{}, total: total}
	s.log.Info("rpc server listening", "endpoint", bound, "ordered_workers", s.opts.OrderedWorkers,
		"shared_workers", s.opts.SharedWorkers, "max_message_bytes", s.opts.MaxMessageBytes,
		"handshake_timeout", s.opts.HandshakeTimeout, "max_open_files", openFilesLimit())

	// Handlers get a context that survives ctx (so drains finish) but is
	// cancelled once the drain timeout is up.
	hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hcancel()

	ordered := make([]chan job, s.opts.OrderedWorkers)
	shared := make(chan job, s.opts.QueueDepth)
	var workers sync.WaitGroup
	for i := range ordered {
		ordered[i] = make(chan job, s.opts.QueueDepth)
		workers.Add(1)
		go s.worker(hctx, ordered[i], &workers)
	}
	for range s.opts.SharedWorkers {
		workers.Add(1)
		go s.worker(hctx, shared, &workers)
	}

	// Reading stops with ctx, or, in a handover, when the loop ends it.
	rctx, rcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer rcancel()
	stop := context.AfterFunc(ctx, func() {
		if s.handover.Load() == nil {
			rcancel()
		}
		w.Signal()
	})
	defer stop()
	// Idle: no request queued or running (replies held for peers that do
	// not read them stay charged, and do not keep the memory of others).
	sctx, scancel := context.WithCancel(ctx)
	scavenged := make(chan struct{})
	go func() {
		defer close(scavenged)
		s.churn.scavenge(sctx, func() bool {
			return s.stats.inFlight.Load() == 0 && s.in.queued() == 0
		}, s.log)
	}()

	l := &loop{s: s, router: router, raw: s.raw, rc: newReceiver(s.raw), monitor: s.monitor, wake: w, ordered: ordered, shared: shared,
		ctx: rctx, stop: ctx, endRead: rcancel, hctx: hctx, retryWait: retryFirst}
	loopErr := l.run()
	scancel()
	<-scavenged

	// Drain: no more reads; the handlers running finish, the requests still
	// queued are dropped (a rebuild or exit under load must not wait for a
	// backlog of work), and the workers exit.
	s.log.Info("rpc server draining", "endpoint", bound, "in_flight", s.stats.inFlight.Load(), "timeout", s.opts.DrainTimeout)
	s.draining.Store(true)
	for _, ch := range ordered {
		close(ch)
	}
	close(shared)
	var done atomic.Bool
	go func() {
		workers.Wait()
		done.Store(true)
		close(s.handlersDone)
		w.Signal()
	}()
	timer := time.AfterFunc(s.opts.DrainTimeout, w.Signal)
	deadline := time.Now().Add(s.opts.DrainTimeout)
	drained := make(chan struct{})
	go func() {
		select {
		case <-s.abandon:
			w.Signal()
		case <-drained:
		}
	}()
	l.drain(func() bool { return done.Load() || time.Now().After(deadline) || isClosed(s.abandon) })
	close(drained)
	timer.Stop()
	var drainErr error
	if !done.Load() {
		n := s.stats.inFlight.Load()
		s.log.Warn("rpc drain timeout: handlers still running, their replies are dropped",
			"in_flight", n, "timeout", s.opts.DrainTimeout)
		drainErr = fmt.Errorf("%w: %d in flight after %v", ErrHandlersRunning, n, s.opts.DrainTimeout)
	}
	hcancel()
	l.dropPending()
	s.closeSockets()
	s.rp.free()
	s.log.Info("rpc server stopped", "endpoint", bound)
	return errors.Join(loopErr, drainErr)
}

// Shutdown stops Serve (as cancelling its context does) and waits, bounded
// by ctx, for Serve to return and every handler to finish. It returns nil
// only when no handler is running any more; otherwise an error wrapping
// ErrHandlersRunning (and ctx's error), and HandlersDone says when they end.
// Shutdown of a server that was bound but never served releases the socket.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopMu.Lock()
	s.stopReq = true
	if s.stopServe != nil {
		s.stopServe()
	}
	s.stopMu.Unlock()
	if s.serving.CompareAndSwap(false, true) {
		// Serve never ran: nothing is in flight; release what Bind made.
		s.bindMu.Lock()
		s.closeSockets()
		s.bindMu.Unlock()
		close(s.handlersDone)
		close(s.served)
		return nil
	}
	select {
	case <-s.served:
	case <-ctx.Done():
		return s.abandonDrain(ctx)
	}
	select {
	case <-s.handlersDone:
		return nil
	case <-ctx.Done():
		return s.abandonDrain(ctx)
	}
}

// abandonGrace is how long a Shutdown whose ctx ended still waits for Serve
// to close the socket: only a handler run by the socket goroutine itself
// (the inline class) holds it longer.
const abandonGrace = time.Second

// abandonDrain ends Serve's drain now (the replies of handlers still running
// are dropped) and waits, briefly, for the socket to be closed, so that the
// caller may bind the port again.
func (s *Server) abandonDrain(ctx context.Context) error {
	s.abandonOnce.Do(func() { close(s.abandon) })
	t := time.NewTimer(abandonGrace)
	defer t.Stop()
	select {
	case <-s.served:
	case <-t.C:
	}
	return fmt.Errorf("%w (%d in flight): %w", ErrHandlersRunning, s.stats.inFlight.Load(), ctx.Err())
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// reply admits and copies out a reply made by a worker and queues it for
// the socket goroutine.
func (s *Server) reply(r reply) {
	p, ok := s.prepare(&r)
	if !ok {
		return
	}
	s.replyMu.Lock()
	if s.closed {
		p.m.release()
	} else {
		s.replies = append(s.replies, p)
	}
	w := s.wake
	s.replyMu.Unlock()
	s.rp.release(p.po)
	w.Signal()
}

func (s *Server) takeReplies(buf []pending) []pending {
	s.replyMu.Lock()
	buf = append(buf[:0], s.replies...)
	clear(s.replies)
	s.replies = s.replies[:0]
	s.replyMu.Unlock()
	return buf
}

func (s *Server) worker(ctx context.Context, jobs <-chan job, wg *sync.WaitGroup) {
	defer wg.Done()
	for j := range jobs {
		if s.draining.Load() {
			// Not started before the stop: dropped, not run.
			s.stats.inFlight.Add(-1)
			s.in.release(j.peer, j.cost)
			j.held.release()
			s.finish(j, OutcomeDropped)
			continue
		}
		if !j.decoded && !s.decodePayload(&j, s.reply) {
			s.stats.inFlight.Add(-1)
			s.in.release(j.peer, j.cost)
			j.held.release()
			continue
		}
		// replying covers the time between the handler's end (execute
		// counts it out of inFlight) and its reply's queueing, so a
		// handover never ends between the two.
		s.replying.Add(1)
		if r, ok := s.execute(ctx, j); ok {
			s.reply(r)
		}
		s.replying.Add(-1)
		// The handler is done with the payload's frames (its []byte args).
		j.held.release()
		s.in.release(j.peer, j.cost)
	}
}

// decodePayload decodes j's payload frames into j.args; on failure it counts,
// logs and answers (through send) as decodeFailed does and reports false.
func (s *Server) decodePayload(j *job, send func(reply)) bool {
	args, err := j.prof.DecodePayloadLimits(j.spec, j.payload, s.lim)
	if err != nil {
		s.decodeFailed(*j, err, send)
		return false
	}
	j.args, j.payload, j.decoded = args, nil, true
	return true
}

// decodeFailed handles a request that did not decode: counted and logged as
// its kind, finished as dropped when its type was known, and answered (error
// marker profiles only) through send.
func (s *Server) decodeFailed(j job, err error, send func(reply)) {
	var de *protocol.DecodeError
	kind := protocol.KindPayload
	if errors.As(err, &de) {
		kind = de.Kind
	}
	s.badInput(kind, j.peer, j.spec, err)
	switch {
	case j.spec != nil:
		s.finish(j, OutcomeDropped)
		if r, ok := s.errorReply(j, "DecodeError", err.Error()); ok {
			send(r)
		}
	case kind == protocol.KindUnknownType:
		if r, ok := s.errorReply(j, "UnknownRequestType", err.Error()); ok {
			send(r)
		}
	}
}

// execute runs the handler of j with panic recovery and returns the reply to
// send, if any.
func (s *Server) execute(ctx context.Context, j job) (r reply, send bool) {
	h := s.handler(j.spec.Handler)
	defer s.stats.inFlight.Add(-1)
	if h == nil {
		s.badInput(protocol.KindNoHandler, j.peer, j.spec, fmt.Errorf("no handler registered for %s", j.spec.Handler))
		s.finish(j, OutcomeDropped)
		return s.errorReply(j, "NoHandler", "no handler for "+j.spec.Name)
	}
	req := &Request{Peer: j.peer, Name: j.spec.Name, Args: j.args, Spec: j.spec, Tentative: j.tentative, srv: s,
		head: job{peer: j.peer, uid: j.uid, typ: j.typ, prof: j.prof, spec: j.spec, start: j.start}}
	res, err, panicked := s.call(ctx, h, j, req)
	deferred := req.deferred.Load() && !panicked
	var adopted *replyBuf
	if raw, ok := res.(protocol.Raw); ok && err == nil && !deferred {
		for i := range req.bufs {
			if req.bufs[i].holds(raw) {
				adopted = &req.bufs[i]
				break
			}
		}
	}
	for i := range req.bufs {
		if &req.bufs[i] != adopted {
			req.bufs[i].c.release()
		}
	}
	req.bufs = nil
	if deferred {
		return reply{}, false
	}
	req.srv, req.head = nil, job{}
	return s.result(j, adopted, res, err, panicked)
}

// result makes the reply to j from its handler's result (res written into
// adopted when set), finishing j with its outcome.
func (s *Server) result(j job, adopted *replyBuf, res any, err error, panicked bool) (r reply, send bool) {
	if err != nil {
		if !panicked {
			s.badInput(protocol.KindHandlerErr, j.peer, j.spec, err)
		}
		s.finish(j, OutcomeError)
		return s.errorReply(j, "HandlerError", err.Error())
	}
	r = reply{peer: j.peer, uid: j.uid, typ: j.typ}
	if x, ok := res.(protocol.Raw); ok && !j.prof.Wraps(j.spec) {
		// Already encoded (a large pickle reply): sent without a copy,
		// from the C buffer it was written into when there is one.
		r.frames = [][]byte{x}
		r.buf = adopted
	} else {
		b, has, err := j.prof.ReplyFrame(j.spec, res)
		if adopted != nil {
			// ReplyFrame wrapped a copy of it into a reply struct.
			adopted.c.release()
		}
		if err != nil {
			s.badInput(protocol.KindHandlerErr, j.peer, j.spec, fmt.Errorf("encode result: %w", err))
			s.finish(j, OutcomeError)
			return s.errorReply(j, "EncodeError", err.Error())
		}
		if has {
			r.frames = [][]byte{b}
		}
	}
	s.finish(j, OutcomeOK)
	return r, true
}

func (s *Server) call(ctx context.Context, h Handler, j job, req *Request) (res any, err error, panicked bool) {
	defer func() {
		if p := recover(); p != nil {
			s.badInput(protocol.KindPanic, j.peer, j.spec, fmt.Errorf("panic: %v", p))
			res, err, panicked = nil, fmt.Errorf("handler %s panicked: %v", j.spec.Handler, p), true
		}
	}()
	res, err = h(ctx, req)
	return res, err, false
}

// errorReply builds the LMCACHE_RPC_ERROR_V1 reply when the profile allows it.
func (s *Server) errorReply(j job, errType, msg string) (reply, bool) {
	if j.prof == nil || !j.prof.ErrorMarker || j.uid == nil {
		return reply{}, false
	}
	const maxMsg = 4096
	if len(msg) > maxMsg {
		msg = msg[:maxMsg]
		for !utf8.ValidString(msg) {
			msg = msg[:len(msg)-1]
		}
	}
	body, err := protocol.Encode(map[string]string{"error_type": errType, "message": msg})
	if err != nil {
		return reply{}, false
	}
	return reply{peer: j.peer, uid: j.uid, typ: j.typ, frames: [][]byte{[]byte(errorMarker), body}}, true
}

func (s *Server) finish(j job, outcome string) {
	d := time.Since(j.start)
	s.stats.request(j.spec.Name, outcome, d)
	if o := s.opts.Observer; o != nil {
		o.OnRequest(j.spec.Name, outcome, d)
	}
}

// badInput counts and logs (rate-limited per kind and peer) one bad request.
func (s *Server) badInput(kind string, peer []byte, spec *protocol.Spec, err error) {
	s.stats.bad(kind)
	peerHex := hex.EncodeToString(peer)
	if kind == protocol.KindArity || kind == protocol.KindPayload {
		// A wrong --protocol shows up as payloads of one type failing to decode.
		n := s.stats.decodeFail(spec.Name)
		if s.limiter.allow("mismatch|" + spec.Name) {
			s.log.Warn(fmt.Sprintf("protocol mismatch suspected (profile %s, type %d decoded as %s failed: %v)",
				spec.Profile, spec.Number, spec.Name, err), "peer", peerHex, "failures", n)
		}
		return
	}
	if kind == protocol.KindCUDAUnsupported || (spec != nil && kind == spec.Unsupported) {
		if s.limiter.once(kind + "|" + peerHex) {
			s.log.Warn("GPU-path request dropped: kvdock serves the non-GPU transfer path only; "+
				"point CUDA workers at LMCache's own server", "peer", peerHex, "request", spec.Name)
		}
		return
	}
	if s.limiter.allow(kind + "|" + peerHex) {
		attrs := []any{"kind", kind, "peer", peerHex, "reason", err}
		if spec != nil {
			attrs = append(attrs, "request", spec.Name)
		}
		s.log.Warn("bad rpc request dropped", attrs...)
	}
}

// peerWorker picks the ordered worker for an identity.
func peerWorker(peer []byte, n int) int {
	h := fnv.New32a()
	_, _ = h.Write(peer)
	return int(h.Sum32() % uint32(n))
}

// positiveOr is v, or def where v is not positive: an option left unset
// takes its default. Each core leaf keeps its own, so none imports settings.
func positiveOr[T ~int | ~int64 | ~float64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}
