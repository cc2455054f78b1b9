package engine

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"kvdock/assets"
	"kvdock/core/rpc"
	"kvdock/settings"
)

// front is the wire server of one configuration; a restart replaces it.
type front struct {
	srv      *rpc.Server
	cancel   context.CancelFunc
	done     chan struct{}
	err      error // Serve's result, valid after done
	stopping atomic.Bool
}

// startFront binds the wire server for cfg over plane p and returns once it
// is bound, or with the bind error.
func (e *Engine) startFront(cfg settings.Config, p *plane) (*front, error) {
	profile, err := assets.Profile(cfg.Server.Protocol)
	if err != nil {
		return nil, err
	}
	srv, err := rpc.New(rpc.Options{
		Host:            cfg.Server.Host,
		Port:            cfg.Server.Port,
		Profile:         profile,
		OrderedWorkers:  cfg.Server.GPUWorkers(),
		SharedWorkers:   cfg.Server.CPUWorkers(),
		MaxMessageBytes: cfg.Server.MaxMessageBytes,
		DrainTimeout:    DrainTimeout,
		Logger:          e.log,
		Observer:        e.opts.Observer,
	})
	if err != nil {
		return nil, fmt.Errorf("wire server: %w", err)
	}
	for name, h := range e.handlers(cfg, p) {
		srv.Handle(name, h)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &front{srv: srv, cancel: cancel, done: make(chan struct{})}
	go func() {
		f.err = srv.Serve(ctx)
		close(f.done)
		if !f.stopping.Load() {
			e.frontFailed(f.err)
		}
	}()
	// Serve binds first; wait for the bind or an early error.
	f.stopping.Store(true) // a bind failure is returned, not reported
	defer func() { f.stopping.Store(false) }()
	select {
	case <-srv.Bound():
	case <-f.done:
		cancel()
		return nil, f.err
	case <-time.After(10 * time.Second):
		cancel()
		<-f.done
		return nil, fmt.Errorf("wire server did not bind %s:%d within 10 s", cfg.Server.Host, cfg.Server.Port)
	}
	e.log.Info("serving", "endpoint", srv.Endpoint(), "protocol", profile.Name)
	if !loopbackEndpoint(srv.Endpoint()) {
		// The wire protocol has no authentication: say so where operators look.
		msg := "ZMQ bound to a non-loopback address: anyone who can reach it can read and write the cache"
		e.log.Warn(msg, "endpoint", srv.Endpoint())
		e.events.add(EventLifecycle, slog.LevelWarn, msg+" ("+srv.Endpoint()+")")
	}
	return f, nil
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

// stop stops reading, drains in-flight requests and closes the socket.
func (f *front) stop(ctx context.Context) error {
	f.stopping.Store(true)
	f.cancel()
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return fmt.Errorf("wire server drain: %w", ctx.Err())
	}
}
