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
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// redirectSeen is a redirect answered by the node at from, to the node at to.
type redirectSeen struct{ from, to string }

// NotifyState implements tier.StateNotifier.
func (t *Tier) NotifyState(f func(tierstate.Tier)) { t.notify.Store(&f) }

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
	client, err := t.dial(ctx)
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

// Put stores value under key (SET, with EX when a TTL is configured), first
// deleting this process's least recently used values past the capacity.
// Put does not return while the client may still read value; so once the
// SET has started it runs to its end (at most connWriteTimeout on a server
// that stopped answering) even if ctx ends first.
func (t *Tier) Put(ctx context.Context, key string, value []byte) error {
	c, release, err := t.begin(ctx, false)
	if err != nil {
		return err
	}
	defer release()
	// Past this point the caller's ctx is not handed to the client (see
	// detached and the SET below); the evictions get a bound of their own.
	if err := t.reserve(ctx, c, key, int64(len(value))); err != nil {
		return err
	}
	set := c.B().Set().Key(t.serverKey(key)).Value(valkey.BinaryString(value))
	var cmd valkey.Completed
	if t.cfg.TTL > 0 {
		cmd = set.ExSeconds(int64(t.cfg.TTL / time.Second)).Build()
	} else {
		cmd = set.Build()
	}
	// The command holds value itself (no copy). Given a context that can
	// end, the client may return on it while the command still waits in
	// its write queue and reads value later, after the caller has reused
	// the memory: the server would store other bytes under key. So the
	// SET runs to its end, bounded by the connection's write timeout and
	// the dead-connection check (connWriteTimeout), or Close, not by ctx;
	// the caller's ctx bounds the wait for a worker and is checked once
	// more here, before the SET starts.
	if err := ctx.Err(); err != nil {
		t.idx.remove(key)
		return fmt.Errorf("resp tier %s: put: %w", t.target, err)
	}
	if err := c.Do(context.WithoutCancel(ctx), cmd).Error(); err != nil {
		t.idx.remove(key)
		return t.fail(context.WithoutCancel(ctx), "put", err)
	}
	t.written(ctx, key, int64(len(value)))
	return nil
}

// reserve makes room for size bytes under key in this process's budget,
// deleting the least recently used values past it (through c).
func (t *Tier) reserve(ctx context.Context, c valkey.Client, key string, size int64) error {
	victims, err := t.idx.reserve(key, size, time.Now())
	if err != nil {
		return fmt.Errorf("resp tier %s: put: %w", t.target, err)
	}
	if len(victims) == 0 {
		return nil
	}
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout) // see detached
	defer cancel()
	if err := t.evict(ectx, c, "evict", victims); err != nil {
		t.idx.remove(key)
		return err
	}
	return nil
}

// PutParts implements tier.PartsPutter: it stores head ‖ payload under key
// like Put, streaming payload from where it lies, a piece after each pace
// (see streams). valid false (asked before the SET's last byte) abandons
// the SET unfinished, and nothing is stored.
func (t *Tier) PutParts(ctx context.Context, key string, head, payload []byte, valid func() bool, pace func()) error {
	c, release, err := t.begin(ctx, false)
	if err != nil {
		return err
	}
	defer release()
	size := int64(len(head) + len(payload))
	if size > maxValueBytes {
		// The server would answer with a protocol error and close the
		// connection, which reads as the tier failing.
		return fmt.Errorf("resp tier %s: put: value of %d bytes exceeds the server's default bulk limit (%d)", t.target, size, maxValueBytes)
	}
	if err := t.reserve(ctx, c, key, size); err != nil {
		return err
	}
	if err := t.streams.set(ctx, t.serverKey(key), head, payload, t.cfg.TTL, valid, pace); err != nil {
		t.idx.remove(key)
		err = t.clean(err)
		switch {
		case errors.Is(err, errUnfinished) && ctx.Err() == nil:
			return fmt.Errorf("resp tier %s: put of %d bytes discarded: %w", t.target, size, tier.ErrSourceChanged)
		case errors.Is(err, ErrClosed):
			return fmt.Errorf("resp tier %s: put: %w", t.target, err)
		}
		return t.fail(ctx, "put", err)
	}
	t.written(ctx, key, size)
	return nil
}

// Has counts how many leading keys are present, with pipelined EXISTS,
// asking only up to the first key the server said was absent less than
// absentFor ago.
func (t *Tier) Has(ctx context.Context, keys []string) (int, error) {
	asked := t.absent.ask()
	keys = keys[:t.absent.firstFresh(keys, asked.at)]
	if len(keys) == 0 {
		return 0, nil
	}
	// The call may outlive Has (see detached): it reads a copy of keys.
	keys = slices.Clone(keys)
	n := 0
	err := t.detached(ctx, "has", true, func(c valkey.Client, dctx context.Context) error {
		found := 0
		defer func() { n = found }()
		for len(keys) > 0 {
			batch := keys[:min(len(keys), hasBatch)]
			keys = keys[len(batch):]
			cmds := make(valkey.Commands, len(batch))
			for i, k := range batch {
				cmds[i] = c.B().Exists().Key(t.serverKey(k)).Build()
			}
			for i, r := range c.DoMulti(dctx, cmds...) {
				v, err := r.AsInt64()
				if err != nil {
					return t.fail(dctx, "has", err)
				}
				if v == 0 {
					t.absent.add(batch[i], asked)
					return nil
				}
				found++
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// KnownAbsent implements tier.AbsenceKnower: the server said key was
// absent less than absentFor ago (and we have not written it since). An
// answer past refreshAfter is asked again in the background, so a prefix
// that keeps being looked up (a scheduler asks at every step while the
// request waits) is answered from memory throughout instead of waiting on
// the server every absentFor; the answer relied on is still never older
// than absentFor.
func (t *Tier) KnownAbsent(key string) bool {
	absent, refresh := t.absent.knownAbsent(key, time.Now())
	if refresh {
		t.refreshAbsent(key)
	}
	return absent
}

// refreshAbsent asks the server about key in the background and remembers
// the answer. It takes a small-call worker slot only if one is free now and
// refreshes hold at most half of them (one of a single slot), so lookups
// that must ask the server find a slot or wait at most for one EXISTS; a
// refresh not made lets the answer age out as before. Close waits for it.
func (t *Tier) refreshAbsent(key string) {
	if t.refreshing.Add(1) > int32(max(1, t.cfg.NumWorkers/2)) {
		t.refreshing.Add(-1)
		t.absent.drop(key)
		return
	}
	c, release, ok := t.beginNow(true)
	if !ok {
		t.refreshing.Add(-1)
		t.absent.drop(key)
		return
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		release()
		t.refreshing.Add(-1)
		t.absent.drop(key)
		return
	}
	t.refreshes.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.refreshes.Done()
		defer t.refreshing.Add(-1)
		defer release()
		q := t.absent.ask()
		ctx, cancel := context.WithTimeout(t.bg, callTimeout)
		defer cancel()
		v, err := c.Do(ctx, c.B().Exists().Key(t.serverKey(key)).Build()).AsInt64()
		switch {
		case err != nil:
			t.absent.drop(key)
			_ = t.fail(ctx, "has", err)
		case v == 0:
			t.absent.add(key, q)
		default:
			t.absent.present(key)
		}
	}()
}

// Delete removes key; an absent key is not an error.
func (t *Tier) Delete(ctx context.Context, key string) error {
	return t.detached(ctx, "delete", true, func(c valkey.Client, dctx context.Context) error {
		t.idx.remove(key)
		return t.evict(dctx, c, "delete", []string{key})
	})
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

// Stats is the backend's part of the tier's snapshot.
func (t *Tier) Stats() tierstate.Tier {
	used, objects := t.idx.usage(time.Now())
	t.mu.Lock()
	defer t.mu.Unlock()
	return tierstate.Tier{
		Type:          "resp",
		Target:        t.target,
		State:         t.state,
		Reason:        t.reason,
		Since:         t.since,
		UsedBytes:     used,
		CapacityBytes: t.cfg.CapacityBytes,
		Objects:       objects,
		ReadBytes:     t.readBytes.Load(),
		WriteBytes:    t.writeBytes.Load(),
		Corrupt:       t.malformed.Load(),
	}
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

// fail turns a client error into the call's error, changing the tier's
// state when the error says the server is unreachable or unwell.
func (t *Tier) fail(ctx context.Context, op string, err error) error {
	err = t.clean(err)
	if callerGaveUp(ctx) {
		// The caller's deadline (or ours) ran out: slow, not down.
		return fmt.Errorf("resp tier %s: %s: %w", t.target, op, err)
	}
	if msg, ok := serverErr(err); ok {
		switch {
		case isAuth(err), hasPrefix(msg, "LOADING", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN"):
			t.setState(tierstate.Down, msg)
		case hasPrefix(msg, "OOM"):
			t.setState(tierstate.Degraded, "server out of memory: "+msg)
		case hasPrefix(msg, "MOVED", "ASK") && !t.cfg.Cluster:
			t.setState(tierstate.Degraded, "server is a cluster node; set \"cluster\": true")
		case hasPrefix(msg, "MOVED", "ASK") && !errors.As(err, new(*replyError)):
			// The client follows maxRedirects of them; one that comes
			// back is a loop. (The tier's own connections follow none:
			// theirs fetch the slot map again.)
			t.setState(tierstate.Down, t.redirectLoop(msg))
		}
		return fmt.Errorf("resp tier %s: %s: %w", t.target, op, err)
	}
	if connClosed(err) && t.stillAnswers() {
		// The connection predates a restart of the server (or its idle
		// timeout): this call fails, the tier is not down.
		return fmt.Errorf("resp tier %s: %s: %w", t.target, op, err)
	}
	t.setState(tierstate.Down, err.Error())
	return fmt.Errorf("resp tier %s: %s: %w", t.target, op, err)
}

// connClosed tells a connection the server closed (EOF, reset, broken
// pipe) from other failures: a malformed reply or a timeout marks the tier
// down at once, a closed connection only when the server does not answer a
// fresh PING either.
func connClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed)
}

// recheckTimeout bounds the confirming PING: a server that answers does so
// in well under it, a killed one refuses the connection at once.
const recheckTimeout = time.Second

// recheck is one confirming PING, shared by the calls that ask while it runs.
type recheck struct {
	mu      sync.Mutex
	running chan struct{} // closed when the PING under way ends; nil when none
	ok      bool          // its outcome, once running is closed
}

// stillAnswers PINGs every node through the small commands' client, twice
// at most (the first may meet the same stale connection, which the client
// then replaces): true when the server answers, so the call's closed
// connection was the connection's fault, not the server's.
func (t *Tier) stillAnswers() bool {
	r := &t.recheck
	r.mu.Lock()
	if ch := r.running; ch != nil {
		r.mu.Unlock()
		<-ch
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.ok
	}
	ch := make(chan struct{})
	r.running = ch
	r.mu.Unlock()
	ok := t.pingAll()
	r.mu.Lock()
	r.ok, r.running = ok, nil
	r.mu.Unlock()
	close(ch)
	return ok
}

// pingAll is stillAnswers' PING of every node, tried twice.
func (t *Tier) pingAll() bool {
	t.mu.Lock()
	c, down := t.client, t.state == tierstate.Down || t.closed
	t.mu.Unlock()
	if c == nil || down {
		return false
	}
	ctx, cancel := context.WithTimeout(t.bg, recheckTimeout)
	defer cancel()
	for try := 0; try < 2; try++ {
		ok := true
		for _, node := range c.small.Nodes() {
			if node.Do(ctx, node.B().Ping().Build()).Error() != nil {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
	}
	return false
}

// callerGaveUp tells a call cut short by its context from a server failure.
// A deadline shows in the network error (i/o timeout) a moment before
// ctx.Err() is set, so the deadline itself is checked too.
func callerGaveUp(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// recovered clears a degraded state after a successful write.
func (t *Tier) recovered() {
	t.mu.Lock()
	degraded := t.state == tierstate.Degraded
	t.mu.Unlock()
	if degraded {
		t.setState(tierstate.Up, "")
	}
}

func (t *Tier) setState(s tierstate.State, reason string) {
	t.mu.Lock()
	if t.closed || (t.state == s && t.reason == reason) {
		t.mu.Unlock()
		return
	}
	if t.state == s {
		// Same state, new reason (the probe saw another error): no event.
		t.reason = reason
		t.mu.Unlock()
		return
	}
	t.state, t.reason, t.since = s, reason, time.Now()
	st := tierstate.Tier{Type: "resp", Target: t.target, State: s, Reason: reason, Since: t.since}
	t.mu.Unlock()
	if f := t.notify.Load(); f != nil {
		(*f)(st)
	}
	switch s {
	case tierstate.Up:
		t.log.Info("resp tier up")
	case tierstate.Down:
		t.log.Warn("resp tier down", "reason", reason)
		t.streams.flush(false) // they may be dead; fresh ones after
		select {
		case t.wake <- struct{}{}:
		default:
		}
	default:
		t.log.Warn("resp tier degraded", "reason", reason)
	}
}

// monitor PINGs the server every healthEvery while the tier is up, so a
// server that dies while no call touches it shows down within seconds, and
// probes a down server with exponential backoff until it answers.
func (t *Tier) monitor() {
	defer close(t.done)
	health := time.NewTicker(healthEvery)
	defer health.Stop()
	var answer <-chan error // the health PING under way; nil when none
	var asked time.Time
	for {
		select {
		case <-t.stop:
			return
		case err := <-answer:
			answer = nil
			t.healthAnswered(err)
			continue
		case <-health.C:
			switch {
			case answer == nil:
				answer, asked = t.healthPing(), time.Now()
			case time.Since(asked) >= pingPatience:
				t.setState(tierstate.Down, fmt.Sprintf("health check: no answer to a PING in %v", time.Since(asked).Round(time.Second)))
			}
			continue
		case <-t.wake:
		}
		answer = nil // the probe's answers are the ones that count now
		wait := backoffMin
		for {
			// Jitter keeps many hosts from probing a restarted server in step.
			d := wait/2 + rand.N(wait/2+1)
			select {
			case <-t.stop:
				return
			case <-time.After(d):
			}
			err := t.probe()
			if err == nil {
				t.setState(tierstate.Up, "")
				break
			}
			t.setState(tierstate.Down, t.clean(err).Error())
			wait = min(wait*2, backoffMax)
		}
	}
}

// healthPing PINGs every node through the small commands' client (whose
// replies never wait behind a value) in the background and returns where
// the outcome will be sent; nil when the tier is down or closing (the probe
// has it) or the last health PING has not ended yet. The PING gets the
// deadline of any call, not a short one: valkey-go answers a deadline
// ending mid-call by closing the connection the lookups share; the monitor
// instead gives up waiting after pingPatience.
func (t *Tier) healthPing() <-chan error {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.client
	if c == nil || t.state == tierstate.Down || t.closed || !t.pinging.CompareAndSwap(false, true) {
		return nil
	}
	t.refreshes.Add(1) // Close waits for it
	out := make(chan error, 1)
	go func() {
		defer t.refreshes.Done()
		defer t.pinging.Store(false)
		ctx, cancel := context.WithTimeout(t.bg, callTimeout)
		defer cancel()
		for addr, node := range c.small.Nodes() {
			if err := node.Do(ctx, node.B().Ping().Build()).Error(); err != nil {
				out <- pingFailed(addr, err)
				return
			}
		}
		out <- nil
	}()
	return out
}

// healthAnswered acts on a health PING's outcome: an error marks the tier
// down (an error reply, as fail reads it).
func (t *Tier) healthAnswered(err error) {
	if err == nil || t.bg.Err() != nil {
		return
	}
	if _, reply := serverErr(err); reply {
		_ = t.fail(context.Background(), "health check", err)
		return
	}
	t.setState(tierstate.Down, "health check: "+t.clean(err).Error())
}

// probe PINGs every node (making the client first when Open could not)
// and, in a cluster, asks each whether the cluster is whole.
func (t *Tier) probe() error {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	// Close waits for the monitor: it does not wait out a probe of a
	// server that does not answer.
	go func() {
		select {
		case <-t.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	t.mu.Lock()
	c := t.client
	t.mu.Unlock()
	if c == nil {
		nc, err := t.dial(ctx)
		if err != nil {
			return err
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			nc.close()
			return ErrClosed
		}
		t.client, c = nc, nc
		t.mu.Unlock()
	}
	// Both clients' connections must answer: either may be the one that broke.
	for addr, node := range c.small.Nodes() {
		if err := node.Do(ctx, node.B().Ping().Build()).Error(); err != nil {
			return pingFailed(addr, err)
		}
	}
	for addr, node := range c.bulk.Nodes() {
		if err := node.Do(ctx, node.B().Ping().Build()).Error(); err != nil {
			return pingFailed(addr, err)
		}
		if !t.cfg.Cluster {
			continue
		}
		// A node back from a crash answers PING before the cluster
		// takes it in again; until then keys answer CLUSTERDOWN.
		info, err := node.Do(ctx, node.B().ClusterInfo().Build()).ToString()
		if err != nil {
			return fmt.Errorf("cluster info %s: %w", addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("node %s: cluster state is not ok", addr)
		}
	}
	if t.cfg.Cluster {
		// A keyed command, routed and redirected as the calls are: nodes
		// that all answer PING may still redirect in a loop.
		key := t.serverKey(probeKey)
		if err := c.small.Do(ctx, c.small.B().Exists().Key(key).Build()).Error(); err != nil {
			if msg, ok := serverErr(err); ok && hasPrefix(msg, "MOVED", "ASK") {
				return errors.New(t.redirectLoop(msg))
			}
			return fmt.Errorf("exists %s: %w", key, err)
		}
	}
	return nil
}

// probeKey is the key the probe asks about: no chunk's key looks like it.
const probeKey = "probe"

// sawRedirect remembers a MOVED or ASK reply of the node at from.
func (t *Tier) sawRedirect(from, msg string) {
	if f := strings.Fields(msg); len(f) == 3 {
		t.redirect.Store(&redirectSeen{from: from, to: f[2]})
	}
}

// redirectLoop is the reason of a call that ended on msg, a MOVED or ASK
// left after maxRedirects: the loop's two nodes, as far as known.
func (t *Tier) redirectLoop(msg string) string {
	to := ""
	if f := strings.Fields(msg); len(f) == 3 {
		to = f[2]
	}
	r := t.redirect.Load()
	switch {
	case r == nil || r.to != to:
		return fmt.Sprintf("redirect loop: more than %d redirects, the last to %s", maxRedirects, to)
	case r.from == r.to:
		return fmt.Sprintf("redirect loop between %s and itself", r.to)
	}
	return fmt.Sprintf("redirect loop between %s and %s", r.from, r.to)
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
