// Package resp is the L2 tier on a Redis or Valkey server or cluster, shared
// by every kvdock host that points at it. It talks RESP through valkey-go
// (chosen over go-redis by a measured bake-off; docs/RELIABILITY.md says
// why it stays), keeps this host's own values (its earlier runs' too, see
// share.go) under max_capacity_gb, counted at what the server says they
// take, by evicting them least recently used first, and watches the
// connection: a failure marks the tier down with the reason (a connection
// the server closed only when a fresh PING fails too), calls then fail
// at once instead of waiting on a dead server, and a background probe with
// exponential backoff brings the tier back up by itself. While up, a PING
// every few seconds checks the server also when no call touches the tier.
// The write-behind's values go out through connections of the tier's own,
// streamed a piece at a time from their L1 bytes (stream.go). The password
// never appears in a log line, an error or the snapshot.
package resp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"kvdock/core/tierstate"
	"kvdock/settings"
	"kvdock/transfer/tier"
)

// Time bounds of the client. A dead server on loopback or a LAN answers with
// a reset at once; these bound the cases where nothing answers at all.
const (
	dialTimeout  = 2 * time.Second
	probeTimeout = 2 * time.Second
	// startWait bounds how long Open waits for the server before the tier
	// starts down and dials in the background: kvdock serves once its
	// tiers are open, and a restart must answer well inside a worker's
	// timeout (upstream's SHM worker raises after 2 s), however long a
	// silent server takes to fail the dial. A refused password or
	// certificate still refuses the start when the answer comes within it.
	startWait = 250 * time.Millisecond
	// connWriteTimeout bounds a write to a connection and how long a
	// connection may go without an answer before the client drops it.
	connWriteTimeout = 30 * time.Second
	// healthEvery spaces the PINGs that check an up tier's server, so a
	// server that dies while nothing touches the tier shows down within
	// seconds rather than at the next call.
	healthEvery = 2 * time.Second
	// pingPatience is how long a health PING may go unanswered before the
	// tier is marked down: a server that long silent misses every
	// lookup's load timeout anyway.
	pingPatience = 3 * time.Second
	// closeWait bounds how long Close waits for the clients to close:
	// valkey-go ends each connection with a PING it waits a second for, so
	// a server that stopped answering would hold a stop (a restart) a
	// second per connection. Past it the close finishes in the background;
	// no call that reads the caller's memory is left by then (Put runs to
	// its end, PutParts goes through streams, closed first).
	closeWait  = 200 * time.Millisecond
	backoffMin = 50 * time.Millisecond
	backoffMax = 5 * time.Second
	hasBatch   = 128 // EXISTS per pipeline round trip
	// maxValueBytes is the largest value written: Redis's and Valkey's
	// default proto-max-bulk-len (512 MB).
	maxValueBytes = 512 << 20
	// callTimeout bounds every call to the server that has no shorter
	// deadline of its caller's: a server that keeps answering without
	// ever finishing (a reply a byte at a time) holds a worker no longer.
	callTimeout = 2 * connWriteTimeout
	// maxRedirects is how many MOVED or ASK one call follows; more is a
	// redirect loop, and the tier goes down with the two nodes named.
	maxRedirects = 3
	// clientBuffer is the valkey-go clients' read and write buffer per
	// connection: their replies are small (guard.go) and a value written
	// through them passes the buffer by.
	clientBuffer = 64 << 10
	// connsPerNode is what the two clients may open to one node: each
	// pipelines on up to four connections per node.
	connsPerNode = 8
	// minNodes is how many nodes the connection bound has room for at the
	// least; a larger cluster is given room for its startup nodes.
	minNodes = 16
)

// ErrDown is wrapped by every call made while the tier is down.
var ErrDown = errors.New("resp tier is down")

// ErrClosed is wrapped by calls made after Close.
var ErrClosed = errors.New("resp tier is closed")

// Tier is a resp backend; it implements tier.Backend.
type Tier struct {
	cfg    RESPConfig
	log    *slog.Logger
	target string
	opt    valkey.ClientOption
	sem    chan struct{} // bounds value calls (SET, GET) in flight to num_workers
	// smallSem bounds the small calls (EXISTS, DEL) in flight, apart from
	// sem: a lookup never waits for a worker slot behind large writes.
	smallSem chan struct{}
	idx      *index
	absent   *absentKeys // recent "absent" answers (see absentFor)

	mu     sync.Mutex
	client *clients // nil until the first connection succeeds
	state  tierstate.State
	reason string
	since  time.Time
	closed bool

	wake chan struct{} // poked when the tier goes down
	stop chan struct{}
	done chan struct{}

	streams *streams // the write-behind's SET connections (PutParts)

	// bg is the context of the background calls (refreshAbsent, the health
	// PING), ended by Close, which then waits for them (refreshes; Add
	// under mu, only while not closed).
	bg        context.Context
	stopBg    context.CancelFunc
	refreshes sync.WaitGroup
	// refreshing counts the refreshes under way (at most half the small
	// calls' worker slots, at least one).
	refreshing atomic.Int32

	readBytes, writeBytes atomic.Uint64
	// malformed counts the replies the guard refused (guard.go), the
	// backend's Corrupt: each failed its call as a miss.
	malformed atomic.Uint64
	notify    atomic.Pointer[func(tierstate.Tier)]

	// conns counts the connections open, the clients' and the tier's own,
	// bounded by maxConns (dialConn).
	conns    atomic.Int64
	maxConns int64
	// redirect is the last MOVED or ASK a client was answered, which names
	// the loop when a call ends on one (redirectLoop).
	redirect atomic.Pointer[redirectSeen]
	// legal is the longest value length this process wrote or asked for,
	// the bound of a Get (read.go); 0 until there is one.
	legal atomic.Int64
	// pinging is set while a health PING is under way (healthPing).
	pinging atomic.Bool
	// recheck shares one confirming PING among the calls that found their
	// connection closed at once (stillAnswers).
	recheck recheck
	// instance names this host's share of the server (share.go).
	instance string
	// noMemoryUsage is set once the server refused MEMORY USAGE (sizes).
	noMemoryUsage atomic.Bool
}

var (
	_ tier.Backend       = (*Tier)(nil)
	_ tier.StateNotifier = (*Tier)(nil)
	_ tier.AbsenceKnower = (*Tier)(nil)
	_ tier.PartsPutter   = (*Tier)(nil)
)

// Open connects to the server (or cluster) of cfg. A server that refuses the
// credentials, or a TLS setup that cannot be built, is an error. A server
// that cannot be reached is not: the tier starts down with the reason and
// comes up by itself once the server answers, while L1 serves on.
func Open(ctx context.Context, cfg RESPConfig, log *slog.Logger) (*Tier, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg.NumWorkers = settings.PositiveOr(cfg.NumWorkers, DefaultNumWorkers)
	cfg.CapacityBytes = settings.PositiveOr(cfg.CapacityBytes, DefaultCapacityGB<<30)
	if cfg.Host == "" {
		cfg.Host = DefaultHost
	}
	if cfg.Port == 0 {
		cfg.Port = DefaultPort
	}
	if cfg.Cluster && len(cfg.StartupNodes) == 0 {
		cfg.StartupNodes = []string{cfg.addr()}
	}
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	t := &Tier{
		cfg:      cfg,
		log:      log.With("target", cfg.Target()), // the set's logger names the tier
		target:   cfg.Target(),
		instance: instanceName(cfg),
		sem:      make(chan struct{}, cfg.NumWorkers),
		smallSem: make(chan struct{}, cfg.NumWorkers),
		idx:      newIndex(cfg.CapacityBytes, cfg.TTL),
		absent:   newAbsentKeys(),
		state:    tierstate.Up,
		since:    time.Now(),
		wake:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		// The clients' connections to every node, then the tier's own:
		// NumWorkers in flight and as many idle (stream.go).
		maxConns: int64(connsPerNode*max(minNodes, len(cfg.StartupNodes)) + 2*cfg.NumWorkers),
		opt: valkey.ClientOption{
			InitAddress:       cfg.addrs(),
			Username:          cfg.Username,
			Password:          cfg.Password,
			TLSConfig:         tc,
			ForceSingleClient: !cfg.Cluster,
			// No client-side cache (the values are large and written
			// by other hosts too) and no silent retries: a failure
			// marks the tier down and the probe takes over.
			DisableCache:     true,
			DisableRetry:     true,
			Dialer:           net.Dialer{Timeout: cmp.Or(cfg.DialTimeout, dialTimeout)},
			ConnWriteTimeout: connWriteTimeout,
			// A node that redirects to itself, or two that redirect to
			// each other, would otherwise be followed until the call's
			// context ends (with a fresh connection per turn for a node
			// that names itself).
			ClusterOption:       valkey.ClusterOption{MaxMovedRedirections: maxRedirects},
			ReadBufferEachConn:  clientBuffer,
			WriteBufferEachConn: clientBuffer,
		},
	}
	t.opt.DialCtxFn = t.dialClient
	t.streams = newStreams(t)
	t.bg, t.stopBg = context.WithCancel(context.Background())
	startCtx, cancel := context.WithTimeout(ctx, startWait)
	client, err := t.dial(startCtx)
	cancel()
	if err != nil {
		if isAuth(err) {
			t.stopBg()
			return nil, fmt.Errorf("resp tier %s: %w", t.target, t.clean(err))
		}
		if ctx.Err() != nil {
			t.stopBg()
			return nil, fmt.Errorf("resp tier %s: %w", t.target, ctx.Err())
		}
		t.state, t.reason = tierstate.Down, t.clean(err).Error()
		if errors.Is(err, context.DeadlineExceeded) {
			t.reason = fmt.Sprintf("no answer within %v at start", startWait)
		}
		t.log.Warn("resp tier down at start; retrying in the background", "reason", t.reason)
		t.wake <- struct{}{}
	} else {
		t.client = client
		t.log.Info("resp tier connected", "config", cfg)
	}
	go t.monitor()
	t.refreshes.Add(1)
	go t.loadShare()
	return t, nil
}

// clients are the tier's two valkey-go clients, on connections of their
// own. valkey-go pipelines every call of a client on one connection per
// node, in order: an EXISTS queued behind a 32 MiB SET waits for the whole
// value to cross the socket (a lookup measured ×0.03 of its rate without a
// tier while the tier was saturated with writes). So the values (SET, GET)
// go through bulk and the small commands (EXISTS, DEL) through small.
type clients struct {
	bulk, small valkey.Client
}

// close closes both clients at once: each may wait on a silent server.
func (c *clients) close() {
	var wg sync.WaitGroup
	wg.Go(c.bulk.Close)
	c.small.Close()
	wg.Wait()
}

// dial makes the clients, giving up when ctx ends (the client's own dial
// is bounded by dialTimeout per address, not by ctx).
func (t *Tier) dial(ctx context.Context) (*clients, error) {
	type result struct {
		c   *clients
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// Both at once: a dial (a TLS handshake) costs its time once.
		var small valkey.Client
		var serr error
		made := make(chan struct{})
		go func() {
			defer close(made)
			small, serr = valkey.NewClient(t.opt)
		}()
		bulk, err := valkey.NewClient(t.opt)
		<-made
		// Of two failures, the one that says more: a refused certificate or
		// password rather than the other dial's timeout.
		if serr != nil && (err == nil || isTimeout(err) && !isTimeout(serr)) {
			err = serr
		}
		if err != nil {
			if bulk != nil {
				bulk.Close()
			}
			if small != nil {
				small.Close()
			}
			ch <- result{nil, err}
			return
		}
		ch <- result{&clients{bulk: bulk, small: small}, nil}
	}()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.c != nil {
				r.c.close()
			}
		}()
		return nil, ctx.Err()
	}
}

// begin hands out the client for one call (the small commands' client
// when small), failing at once while the tier is down or closed, and takes
// a worker slot of that client (honouring ctx).
func (t *Tier) begin(ctx context.Context, small bool) (valkey.Client, func(), error) {
	c, sem, err := t.usable(small)
	if err != nil {
		return nil, nil, err
	}
	select {
	case sem <- struct{}{}:
		return c, func() { <-sem }, nil
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("resp tier %s: waiting for a worker: %w", t.target, ctx.Err())
	}
}

// beginNow is begin that does not wait: ok is false while the tier is down
// or closed, or every worker slot is taken.
func (t *Tier) beginNow(small bool) (c valkey.Client, release func(), ok bool) {
	c, sem, err := t.usable(small)
	if err != nil {
		return nil, nil, false
	}
	select {
	case sem <- struct{}{}:
		return c, func() { <-sem }, true
	default:
		return nil, nil, false
	}
}

// usable returns the client for small or value calls and its worker slots,
// or why neither can be used now.
func (t *Tier) usable(small bool) (valkey.Client, chan struct{}, error) {
	t.mu.Lock()
	cs, state, reason, closed := t.client, t.state, t.reason, t.closed
	t.mu.Unlock()
	switch {
	case closed:
		return nil, nil, ErrClosed
	case state == tierstate.Down || cs == nil:
		return nil, nil, fmt.Errorf("%w (%s): %s", ErrDown, t.target, reason)
	}
	if small {
		return cs.small, t.smallSem, nil
	}
	return cs.bulk, t.sem, nil
}

// detached runs f on a worker slot and returns when f does or as soon as
// the caller's ctx ends. The client never sees the caller's deadline:
// valkey-go answers a deadline that ends mid-call by closing the connection
// that every concurrent call shares (auto-pipelining), failing them all and
// the tier with them. So f gets a context of its own, ending only after
// callTimeout; a server that stops answering is caught sooner by the
// client's connWriteTimeout (deadlines on the connection and its keep-alive
// PINGs). An abandoned f finishes in the background and keeps its worker
// slot until then, so num_workers still bounds the calls and bytes in
// flight.
func (t *Tier) detached(ctx context.Context, op string, small bool, f func(valkey.Client, context.Context) error) error {
	c, release, err := t.begin(ctx, small)
	if err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
	if ctx.Done() == nil {
		// A context that never ends needs no watching.
		defer release()
		defer cancel()
		return t.contained(op, c, dctx, f)
	}
	done := make(chan error, 1)
	go func() {
		defer release()
		defer cancel()
		done <- t.contained(op, c, dctx, f)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("resp tier %s: %s: %w", t.target, op, ctx.Err())
	}
}

// contained runs f, turning a panic of the client library into the call's
// error: the guard (guard.go) checks every reply before the client reads
// it, and this is what stands if the client still fails on one. The
// clients go (their connections may be mid-reply), the tier is down with
// the reason and the probe dials fresh ones. A panic on the client's own
// reader goroutine is out of reach here; the guard is what keeps it from
// happening.
func (t *Tier) contained(op string, c valkey.Client, ctx context.Context, f func(valkey.Client, context.Context) error) (err error) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		reason := fmt.Sprintf("the client library failed on a reply: %v", r)
		t.log.Error("resp tier: "+reason, "op", op, "stack", string(debug.Stack()))
		t.mu.Lock()
		old := t.client
		t.client = nil
		t.mu.Unlock()
		if old != nil {
			go old.close() // may wait on the broken connection's state
		}
		t.setState(tierstate.Down, reason)
		err = fmt.Errorf("resp tier %s: %s: %s", t.target, op, reason)
	}()
	return f(c, ctx)
}

// serverKey is key_prefix + key. Redis Cluster hashes only the part between
// the first '{' and the next '}' when there is one (a hash tag): a model name
// with braces would put all its chunks in one slot, on one node. An empty
// tag "{}" in front makes the server hash the whole key; a prefix that holds
// a '{' of its own is the operator's deliberate choice and is kept as is.
func (t *Tier) serverKey(key string) string {
	if strings.IndexByte(key, '{') >= 0 && strings.IndexByte(t.cfg.KeyPrefix, '{') < 0 {
		return "{}" + t.cfg.KeyPrefix + key
	}
	return t.cfg.KeyPrefix + key
}

// Close stops the probe and the client; calls after it fail with ErrClosed.
func (t *Tier) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.mu.Unlock()
	close(t.stop)
	<-t.done
	t.stopBg()
	t.streams.flush(true)
	t.mu.Lock()
	c := t.client
	t.client = nil
	t.mu.Unlock()
	closed := make(chan struct{})
	go func() {
		if c != nil {
			c.close()
		}
		// After the client: closing it ends a refresh that a server does
		// not answer, which the cancelled context alone does not.
		t.refreshes.Wait()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(closeWait):
		t.log.Warn("resp tier: its server does not answer; the client's connections close in the background", "waited", closeWait)
	}
	return nil
}

// clean strips the password from an error's text, should a library ever
// quote it, keeping the error chain for errors.Is.
func (t *Tier) clean(err error) error {
	if err == nil || t.cfg.Password == "" || !strings.Contains(err.Error(), t.cfg.Password) {
		return err
	}
	return &redacted{msg: strings.ReplaceAll(err.Error(), t.cfg.Password, redactedPasswordText), err: err}
}

type redacted struct {
	msg string
	err error
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }

// serverErr returns the text of an error reply from the server, as opposed
// to a network failure (the client may return the reply wrapped).
func serverErr(err error) (string, bool) {
	var ve *valkey.ValkeyError
	if errors.As(err, &ve) && !valkey.IsValkeyNil(ve) {
		return ve.Error(), true
	}
	var re *replyError
	if errors.As(err, &re) {
		return re.msg, true
	}
	return "", false
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

func isAuth(err error) bool {
	msg, ok := serverErr(err)
	return ok && hasPrefix(msg, "WRONGPASS", "NOAUTH", "NOPERM")
}

func hasPrefix(s string, prefixes ...string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
