// Package engine is kvdock's lifecycle and module wiring: it builds the L1
// pool, sessions, lookup and transfer modules from a settings.Config, puts
// their handlers behind the wire server, and offers Start, Stop, Apply (a new
// config, live or with a restart), Snapshot and an event stream to the faces.
// It knows no screen.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"kvdock/core/restart"
	"kvdock/core/rpc"
	"kvdock/settings"
	"kvdock/transfer/tier"
)

// State is where the engine is in its life.
type State int

// The engine states; Snapshot names them for the faces.
const (
	Stopped State = iota
	Starting
	Serving
	Restarting
	Failed
)

// String is the label the faces show (never colour alone).
func (s State) String() string {
	switch s {
	case Starting:
		return "starting"
	case Serving:
		return "serving"
	case Restarting:
		return "restarting"
	case Failed:
		return "failed"
	}
	return "stopped"
}

// Options are the engine's collaborators; only Logger matters to most callers.
type Options struct {
	Logger *slog.Logger
	// LogLevel, when set, is changed in place by Apply for log.level.
	LogLevel *slog.LevelVar
	// Sources says where each config value came from (for reasons and /conf).
	Sources map[string]settings.Source
	// PID names the default segment (lmcache_l1_pool_<pid>); 0 = os.Getpid().
	PID int
	// Version is shown in snapshots.
	Version string
	// GPU samples GPU memory; nil = none.
	GPU GPUSampler
	// Observer sees every request's outcome and latency (metrics).
	Observer Observer
	// OnApply moves the faces that own settings of their own (http.*) from
	// old to new. Apply calls it with the engine's lock held, before the
	// engine's own changes, and again with the arguments swapped when those
	// fail; an error makes Apply fail and roll back, so it must leave the
	// face on old. It must not call back into Start, Stop or Apply.
	OnApply func(ctx context.Context, old, new settings.Config) error
	// Memory reads the host's available memory: Apply refuses a new pool
	// size that does not fit it (settings.CheckMemory), whichever face
	// asked. Nil checks nothing.
	Memory settings.MemoryProbe
	Now    func() time.Time
	// TierOpeners open the L2 backends by adapter type ("fs", "resp"):
	// the binary passes the real ones, tests a fake.
	TierOpeners map[string]tier.Opener
	// Listener is the wire server's listening socket that the previous
	// process image kept across a restart's exec (KeepListener), for the
	// endpoint ListenerFor: the first start serves on it when it is the
	// one for its endpoint (rpc.Options.Listener); nil binds.
	Listener    *os.File
	ListenerFor string
}

// Engine runs one kvdock configuration at a time.
type Engine struct {
	opts   Options
	log    *slog.Logger
	events *eventLog
	rates  *rates

	// mu serialises lifecycle changes (Start, Stop, Apply); readers use cur,
	// so a snapshot never waits for a restart.
	mu  sync.Mutex
	cur atomic.Pointer[current]
	// failed is closed once when the wire server dies by itself.
	failed     chan struct{}
	failOnce   sync.Once
	cfg        settings.Config
	sources    map[string]settings.Source
	dataPlane  *dataPlane
	wireServer *wireServer
	bg         context.CancelFunc // background loops of the engine itself
	// wireOptions, set by tests only, adjusts each wire server's options
	// (fault injection).
	wireOptions func(*rpc.Options)

	// st guards the state fields read by Snapshot.
	st      sync.RWMutex
	state   State
	lastErr string
	started time.Time
	rebuilt Rebuilt
	restart Restart

	// handlerHook, when set (tests), runs inside each plane's gate before
	// every handler.
	handlerHook func(*dataPlane)

	// listener and listenerFor are Options.Listener until the first wire
	// server takes them (under mu).
	listener    *os.File
	listenerFor string
}

// DrainTimeout bounds the wait for requests in flight when the wire server
// stops (Stop, a restart, a rebuild); the wire server is given the same.
const DrainTimeout = 5 * time.Second

// poolCloseAllowance is the time unmapping and unlinking a large pool may
// take after the drain (freeing the pages of a populated tmpfs file).
const poolCloseAllowance = 5 * time.Second

// StopTimeout is the most Stop needs: the drain, then closing the pool.
// Callers that bound a shutdown give Stop at least this long.
const StopTimeout = DrainTimeout + poolCloseAllowance

// New returns a stopped engine for cfg, which must have passed settings.Validate.
func New(cfg settings.Config, opts Options) *Engine {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.PID == 0 {
		opts.PID = os.Getpid()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Sources == nil {
		opts.Sources = map[string]settings.Source{}
	}
	e := &Engine{
		opts:    opts,
		log:     opts.Logger,
		events:  newEventLog(256, opts.Now),
		rates:   newRates(),
		cfg:     cfg,
		sources: opts.Sources,
		failed:  make(chan struct{}),

		listener: opts.Listener, listenerFor: opts.ListenerFor,
	}
	e.rates.countFromZero()
	e.publish()
	return e
}

// current is what readers see of the lifecycle fields, published after
// every change under mu.
type current struct {
	cfg        settings.Config
	sources    map[string]settings.Source
	dataPlane  *dataPlane
	wireServer *wireServer
}

func (e *Engine) publish() {
	e.cur.Store(&current{cfg: e.cfg, sources: e.sources, dataPlane: e.dataPlane, wireServer: e.wireServer})
}

// Config returns the running configuration and the source of each value.
func (e *Engine) Config() (settings.Config, map[string]settings.Source) {
	c := e.cur.Load()
	return c.cfg, c.sources
}

func (e *Engine) setState(s State, err error) {
	e.st.Lock()
	e.state = s
	if err != nil {
		e.lastErr = err.Error()
	} else if s == Serving {
		e.lastErr = ""
	}
	e.st.Unlock()
}

// Start builds the pool and modules and binds the wire server; it returns
// once the server is bound (or failed to). ctx bounds the engine's life.
func (e *Engine) Start(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.publish()
	if e.dataPlane != nil {
		return errors.New("engine already started")
	}
	e.setState(Starting, nil)
	bgCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.bg = cancel
	if e.opts.GPU != nil {
		go e.opts.GPU.Run(bgCtx, e.cfg.UI.Refresh)
	}
	go every(SampleEvery, e.sampleRates)(bgCtx)
	e.warnMemory(e.cfg)
	if err := e.startLocked(e.cfg); err != nil {
		cancel()
		e.bg = nil
		e.setState(Failed, err)
		e.events.add(EventError, slog.LevelError, "start failed: "+err.Error())
		return err
	}
	e.events.add(EventLifecycle, slog.LevelInfo, e.dataPlane.shmText())
	e.st.Lock()
	e.started = e.opts.Now()
	e.st.Unlock()
	e.setState(Serving, nil)
	return nil
}

// startLocked builds a data plane and a wire server for cfg; on failure nothing is left.
func (e *Engine) startLocked(cfg settings.Config) error {
	release, err := e.claimStart(cfg)
	if err != nil {
		return err
	}
	defer release()
	p, err := e.buildDataPlane(cfg)
	if err != nil {
		return err
	}
	f, err := e.startWireServer(cfg, p)
	if err != nil {
		// Nothing was served: no handler can be running.
		_ = p.close(context.Background())
		return err
	}
	e.dataPlane, e.wireServer = p, f
	return nil
}

// Stop stops serving: the socket stops reading, in-flight requests drain
// (for DrainTimeout at most, less if ctx ends first), pending transfers are
// discarded and the pool is closed (segment unlinked). Requests still running
// after the drain hold views of the pool: it is then left mapped for them
// and Stop returns an error wrapping ErrDrainTimeout.
func (e *Engine) Stop(ctx context.Context) error { return e.stop(ctx, false) }

// StopKeeping is Stop that keeps the pool for the next start instead of
// removing it: once the requests received are answered and no handler
// runs, the object table, the registrations and the time the server
// stopped reading are recorded in the state directory and the segment is
// left in place (l1.Pool.Keep). A pool that cannot be kept (private
// memory, a drain that timed out, a state directory that is not ours) is
// closed as Stop closes it and the error says why.
func (e *Engine) StopKeeping(ctx context.Context) error { return e.stop(ctx, true) }

func (e *Engine) stop(ctx context.Context, keep bool) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.publish()
	if e.dataPlane == nil {
		return nil
	}
	var errs []error
	f, p := e.wireServer, e.dataPlane
	e.wireServer, e.dataPlane = nil, nil
	e.publish()
	dctx, cancel := context.WithTimeout(ctx, DrainTimeout)
	defer cancel()
	if keep {
		p.keep = e.keeper(e.cfg, e.opts.Now())
		if f != nil {
			f.srv.SetHandover(e.handover(p))
		}
	}
	if f != nil {
		errs = append(errs, f.stop(dctx))
		if keep {
			st := f.srv.Stats()
			p.handover = restart.Handover{Parked: st.HandoverParked, Lost: st.HandoverLost}
		}
	}
	if err := p.close(dctx); err != nil {
		errs = append(errs, err)
		e.events.add(EventError, slog.LevelWarn, "stop: "+err.Error())
	}
	if e.bg != nil {
		e.bg()
		e.bg = nil
	}
	e.setState(Stopped, nil)
	e.events.add(EventLifecycle, slog.LevelInfo, "engine stopped")
	return errors.Join(errs...)
}

// Failed is closed when the wire server stops on its own (a socket
// failure), never by Stop or Apply; callers select on it to notice.
func (e *Engine) Failed() <-chan struct{} { return e.failed }

// wireServerFailed records a wire server that stopped by itself.
func (e *Engine) wireServerFailed(err error) {
	if err == nil {
		err = errors.New("wire server stopped")
	}
	e.setState(Failed, err)
	e.events.add(EventError, slog.LevelError, "wire server failed: "+err.Error())
	e.failOnce.Do(func() { close(e.failed) })
}

// ClearOrigin says who asked for a clear, for the events pane and the log.
type ClearOrigin string

// The origins of a clear.
const (
	ClearByCtl    ClearOrigin = "kvdock ctl"
	ClearByHTTP   ClearOrigin = "HTTP API"
	ClearByWorker ClearOrigin = "a worker (ZMQ CLEAR)"
	// ClearByDashboard: the operator, in the dashboard (instance removal).
	ClearByDashboard ClearOrigin = "the dashboard"
)

// Cleared is what a clear dropped: live objects (locked ones included; their
// space follows when the transfer ends) and their sizes rounded to the
// pool's alignment.
type Cleared struct {
	Objects int
	Bytes   int64
}

// ClearCache drops every unlocked object in the pool (CLEAR, /clear-cache);
// objects held by a transfer go when it ends (see l1.Pool.Clear). by names
// the requester in the event it records.
func (e *Engine) ClearCache(by ClearOrigin) (Cleared, error) {
	p := e.cur.Load().dataPlane
	if p == nil || !p.gate.enter() {
		return Cleared{}, errNotRunning
	}
	c := e.clearDataPlane(p, by)
	p.gate.exit()
	return c, nil
}

// clearDataPlane clears p's pool and records who did it and what went.
func (e *Engine) clearDataPlane(p *dataPlane, by ClearOrigin) Cleared {
	n, b := p.pool.ClearCounted()
	e.events.add(EventLifecycle, slog.LevelInfo, fmt.Sprintf("cache cleared by %s: %d objects, %s dropped", by, n, settings.BytesText(b)))
	return Cleared{Objects: n, Bytes: b}
}
