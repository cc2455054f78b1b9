package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"

	"kvdock/settings"
)

// Runner keeps the HTTP API serving beside the engine on the http.* settings
// and moves it when they change. Restart binds the new address before it lets
// go of the old one, so a taken port fails with the old API still serving.
type Runner struct {
	eng  Engine
	opts Options // Token comes from the settings

	mu      sync.Mutex
	base    context.Context // Start's: the life of every Serve
	cfg     settings.HTTPConfig
	running *serving // nil while disabled or stopped
}

// serving is one Serve on one listener.
type serving struct {
	addr   net.Addr
	cancel context.CancelFunc
	done   chan struct{}
	// tokenFile is the local token written for this Serve ("" none),
	// removed when it stops: a stopped API's token opens nothing.
	tokenFile string
}

// NewRunner returns a stopped runner of the API over eng; opts.Token is
// ignored (http.token is the settings').
func NewRunner(eng Engine, opts Options) *Runner {
	return &Runner{eng: eng, opts: opts}
}

// Start binds and serves cfg (a taken port fails here, at once); port 0
// disables the API. The API serves until Stop or until ctx ends.
func (r *Runner) Start(ctx context.Context, cfg settings.HTTPConfig) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running != nil {
		return errors.New("HTTP API: already started")
	}
	r.base = ctx
	if cfg.Port == 0 {
		r.logger().Info("HTTP API disabled (--http-port 0)")
		r.cfg = cfg
		return nil
	}
	ln, err := Listen(cfg.Host, cfg.Port)
	if err != nil {
		return err
	}
	r.serveLocked(cfg, ln)
	return nil
}

// Restart moves the API to cfg; an unchanged cfg does nothing. The new
// address is bound first: when that fails the API keeps serving the old
// settings and the error says why. Only a change of token alone (the same
// address) stops the old server before binding, and rebinds the old settings
// if the address cannot be had again.
func (r *Runner) Restart(cfg settings.HTTPConfig) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.base == nil {
		return errors.New("HTTP API: not running (restart before Start or after Stop)")
	}
	if cfg == r.cfg {
		return nil
	}
	old := r.cfg
	if cfg.Port == 0 {
		r.stopLocked()
		r.cfg = cfg
		r.logger().Info("HTTP API disabled (--http-port 0)")
		return nil
	}
	if r.running != nil && cfg.Host == old.Host && cfg.Port == old.Port {
		r.stopLocked()
		ln, err := Listen(cfg.Host, cfg.Port)
		if err != nil {
			return r.rebindLocked(old, err)
		}
		r.serveLocked(cfg, ln)
		return nil
	}
	ln, err := Listen(cfg.Host, cfg.Port)
	if err != nil {
		return err
	}
	r.stopLocked()
	r.serveLocked(cfg, ln)
	return nil
}

// rebindLocked brings the old settings back after the same address could
// not be bound again.
func (r *Runner) rebindLocked(old settings.HTTPConfig, cause error) error {
	ln, err := Listen(old.Host, old.Port)
	if err != nil {
		r.cfg = settings.HTTPConfig{}
		return errors.Join(cause, fmt.Errorf("HTTP API down: the old settings could not be restored: %w", err))
	}
	r.serveLocked(old, ln)
	return cause
}

// Stop shuts the API down and waits for it (requests in flight get up to
// 5 s, see Serve); a later Restart fails rather than serve again.
func (r *Runner) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopLocked()
	r.base = nil
}

// Addr is the address the API listens on; nil while it is disabled or stopped.
func (r *Runner) Addr() net.Addr {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running == nil {
		return nil
	}
	return r.running.addr
}

func (r *Runner) serveLocked(cfg settings.HTTPConfig, ln net.Listener) {
	opts := r.opts
	opts.Token = cfg.Token
	tokenFile := ""
	if opts.Token == "" && opts.StateDir != "" {
		tok, err := WriteLocalToken(opts.StateDir, cfg.Port)
		if err != nil {
			r.logger().Warn("HTTP API: no local token for kvdock ctl restart; a restart needs --http-token", "err", err)
		} else {
			tokenFile = LocalTokenFile(opts.StateDir, cfg.Port)
		}
		opts.LocalToken = tok
	}
	api := New(r.eng, opts)
	ctx, cancel := context.WithCancel(r.base)
	s := &serving{addr: ln.Addr(), cancel: cancel, done: make(chan struct{}), tokenFile: tokenFile}
	log := r.logger()
	go func() {
		defer close(s.done)
		if err := api.Serve(ctx, ln); err != nil {
			log.Error("HTTP API stopped", "err", err)
		}
	}()
	r.running, r.cfg = s, cfg
}

func (r *Runner) stopLocked() {
	if s := r.running; s != nil {
		r.running = nil
		s.cancel()
		<-s.done
		if s.tokenFile != "" {
			_ = os.Remove(s.tokenFile)
		}
	}
}

func (r *Runner) logger() *slog.Logger {
	if r.opts.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.opts.Logger
}
