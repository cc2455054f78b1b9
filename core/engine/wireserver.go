package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"sync/atomic"

	"kvdock/assets"
	"kvdock/core/layout"
	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/settings"
)

// wireServer is the wire server of one configuration; a restart replaces it.
type wireServer struct {
	srv      *rpc.Server
	cancel   context.CancelFunc
	done     chan struct{}
	err      error // Serve's result, valid after done
	stopping atomic.Bool
}

// startWireServer binds the wire server for cfg over plane p and returns once it
// is bound, or with the bind error.
func (e *Engine) startWireServer(cfg settings.Config, p *dataPlane) (*wireServer, error) {
	profile, detect, err := profiles(cfg.Server)
	if err != nil {
		return nil, err
	}
	p.transfer.SetLiveness(livenessFor(cfg, profile, detect))
	opts := rpc.Options{
		Host:                   cfg.Server.Host,
		Port:                   cfg.Server.Port,
		Profile:                profile,
		Detect:                 detect,
		Instances:              p.transfer,
		OrderedWorkers:         cfg.Server.GPUWorkers(),
		SharedWorkers:          cfg.Server.CPUWorkers(),
		MaxMessageBytes:        cfg.Server.MaxMessageBytes,
		MessageCap:             messageCap(cfg, p.layouts),
		MaxTokensPerRequest:    cfg.Server.MaxTokensPerRequest,
		QueuedRequestBytes:     cfg.Server.QueuedRequestBytes,
		PeerQueuedRequestBytes: cfg.Server.QueuedRequestBytes / 4,
		ReplyBytesPerPeer:      cfg.Server.QueuedReplyBytesPerPeer,
		ReplyBytes:             8 * cfg.Server.QueuedReplyBytesPerPeer,
		InFlightBytes:          int64(cfg.Server.MaxInflightPickleMB) << 20,
		// In-memory and non-blocking (a lookup's tier phase runs in the
		// background): answered on the socket goroutine when small.
		FastShared:   []string{protocol.Lookup, protocol.QueryPrefetchStatus, protocol.QueryPrefetchLookupHits},
		DrainTimeout: DrainTimeout,
		Logger:       e.log,
		Observer:     observer{r: e.rates, next: e.opts.Observer},
	}
	// The socket the previous image listened on, for the first start
	// after its exec only (the wire server closes it if it is not used).
	opts.Listener, opts.ListenerFor = e.listener, e.listenerFor
	e.listener, e.listenerFor = nil, ""
	if e.wireOptions != nil {
		e.wireOptions(&opts)
	}
	names := make([]string, 0, len(profile.Requests))
	for _, r := range profile.Requests {
		names = append(names, r.Name)
	}
	e.rates.kinds(names)
	srv, err := rpc.New(opts)
	if err != nil {
		return nil, fmt.Errorf("wire server: %w", err)
	}
	// The plane outlives a restart: its pickle gate takes this start's limit.
	p.transfer.SetMaxInflightPickle(opts.InFlightBytes)
	for name, h := range e.handlers(cfg, p, pollTables(profile, detect)) {
		srv.Handle(name, h)
	}
	// Bind here, so a bind error is returned to the caller and nothing runs;
	// only a server that bound is served, and only its own failure (never a
	// stop) reaches wireServerFailed.
	if err := srv.Bind(); err != nil {
		return nil, err
	}
	e.restartBound(p)
	ctx, cancel := context.WithCancel(context.Background())
	f := &wireServer{srv: srv, cancel: cancel, done: make(chan struct{})}
	go func() {
		f.err = srv.Serve(ctx)
		close(f.done)
		if !f.stopping.Load() {
			e.wireServerFailed(f.err)
		}
	}()
	e.log.Info("serving", "endpoint", srv.Endpoint(), "protocol", profile.Name)
	if !loopbackEndpoint(srv.Endpoint()) {
		// The wire protocol has no authentication: say so where operators look.
		msg := "ZMQ bound to a non-loopback address: anyone who can reach it can read and write the cache"
		e.log.Warn(msg, "endpoint", srv.Endpoint())
		e.events.add(EventLifecycle, slog.LevelWarn, msg+" ("+srv.Endpoint()+")")
	}
	return f, nil
}

// KeepListener returns a duplicate of the wire server's listening socket
// that an exec keeps (rpc.Server.KeepListener) and the endpoint it was
// bound for, so that the next image serves on it (Options.Listener).
func (e *Engine) KeepListener() (fd int, endpoint string, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.wireServer == nil {
		return -1, "", errors.New("no wire server")
	}
	return e.wireServer.srv.KeepListener()
}

// loopbackEndpoint reports whether a bound "tcp://host:port" endpoint is
// reachable from this host only.
func loopbackEndpoint(endpoint string) bool {
	host, _, err := net.SplitHostPort(strings.TrimPrefix(endpoint, "tcp://"))
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// stop stops reading, drains in-flight requests and closes the socket. It
// returns nil only when no handler is running any more; an error wrapping
// rpc.ErrHandlersRunning means handlers may still use the pool.
func (f *wireServer) stop(ctx context.Context) error {
	f.stopping.Store(true)
	f.cancel()
	if err := f.srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("wire server drain: %w", err)
	}
	<-f.done
	if errors.Is(f.err, rpc.ErrHandlersRunning) || errors.Is(f.err, rpc.ErrServerClosed) {
		// Serve's drain timed out, but Shutdown saw the handlers finish; or
		// a Stop right after Start won the race with Serve: nothing ran.
		return nil
	}
	return f.err
}

// messageCap is the largest message a legal request needs now: a key of the
// most tokens allowed (5 bytes each at most) with its frames, and, once a
// layout is registered, the largest legal commit: every chunk of such a key
// (no more than the pool holds) of the largest registered layout, each with
// a pickle's per-tensor overhead. --max-message-bytes stays the upper bound.
func messageCap(cfg settings.Config, layouts *layout.Registry) func() int64 {
	maxTokens := int64(cfg.Server.MaxTokensPerRequest)
	if maxTokens <= 0 {
		maxTokens = protocol.DefaultMaxTokens // what the wire server applies then
	}
	chunk := int64(max(cfg.Server.ChunkSize, 1))
	pool := cfg.L1.SizeBytes()
	base := 5*maxTokens + 1<<20
	const perTensor = 4 << 10
	return func() int64 {
		lb := layouts.MaxBytes()
		if lb <= 0 {
			return base
		}
		chunks := (maxTokens+chunk-1)/chunk + 1
		if pool > 0 {
			chunks = min(chunks, pool/lb+1)
		}
		per := lb + perTensor
		if chunks > (math.MaxInt64-base)/per {
			return math.MaxInt64
		}
		return base + chunks*per
	}
}

// profiles are the wire tables of cfg: the one profile, or under auto the
// auto default and every profile to detect among, newest first (the
// detection's tie-break order).
func profiles(cfg settings.ServerConfig) (*protocol.Profile, []*protocol.Profile, error) {
	if cfg.Protocol != settings.ProtocolAuto {
		p, err := protocol.Load(cfg.Protocol, assets.Protocol)
		return p, nil, err
	}
	var def *protocol.Profile
	var all []*protocol.Profile
	for _, name := range slices.Backward(settings.ProtocolProfiles()) {
		p, err := protocol.Load(name, assets.Protocol)
		if err != nil {
			return nil, nil, err
		}
		if name == cfg.ProtocolAutoDefault {
			def = p
		}
		all = append(all, p)
	}
	if def == nil {
		return nil, nil, fmt.Errorf("protocol auto: default %q is not a profile", cfg.ProtocolAutoDefault)
	}
	return def, all, nil
}

// handover is how a stop that keeps the pool ends the wire server
// (rpc.Handover): the requests that finish work begun are served while the
// rest are parked, the transfers the last answers begin are carried to the
// next process, and no request a worker sent is left unread.
func (e *Engine) handover(p *dataPlane) *rpc.Handover {
	return &rpc.Handover{
		Finish: []string{protocol.CommitStore, protocol.CommitStoreGroup, protocol.CommitRetrieve,
			protocol.QueryPrefetchStatus, protocol.WaitPrefetchStatus, protocol.QueryPrefetchLookupHits,
			protocol.FreeLookupLocks, protocol.EndSession, protocol.UnregisterKVCache,
			protocol.UnregisterKVCacheNonGPUContext},
		Busy: func() bool { return p.transfer.Busy() || p.lookup.Busy() },
		Parked: func(n int) {
			if err := p.transfer.StartCarrying(); err != nil {
				e.log.Warn("handover: transfers will not be carried", "err", err)
			}
			e.log.Info("handover: answering the parked requests", "parked", n)
		},
	}
}
