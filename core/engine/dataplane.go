package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"kvdock/core/hostmem"
	"kvdock/core/keys"
	"kvdock/core/kvevents"
	"kvdock/core/l1"
	"kvdock/core/layout"
	"kvdock/core/lookup"
	"kvdock/core/misses"
	"kvdock/core/restart"
	"kvdock/core/rpc"
	"kvdock/core/whatif"
	"kvdock/settings"
	"kvdock/transfer/nongpu"
)

// dataPlane is the data plane: what holds the cache and the worker contexts. A
// restart keeps it; a rebuild replaces it.
type dataPlane struct {
	pool     *l1.Pool
	sessions *keys.Sessions
	layouts  *layout.Registry
	lookup   *lookup.Module
	transfer *nongpu.Module
	tiers    *tiers
	cancel   context.CancelFunc
	done     chan struct{}
	// gate counts the handlers running over this plane: they hold raw views
	// of the mapped pool, so the pool is unmapped only once none runs.
	gate gate
	// closed is closed once the pool has been closed (unmapped, unlinked).
	closed    chan struct{}
	closeOnce sync.Once
	closeErr  error
	log       *slog.Logger
	// hook, when set (tests), runs inside the gate before each handler.
	hook func(*dataPlane)
	// whatif estimates the hit ratio of other pool sizes from this
	// plane's lookups and stores.
	whatif *whatif.Estimator
	// ghost remembers why the pool lost keys, for the miss reasons.
	ghost *misses.Ghost
	// placement is the last reading of where the pool's pages live.
	placement hostmem.PlacementCache
	// adoption is set when the pool was adopted from the previous process
	// (restart.go); keep, when set, is how release ends the pool instead
	// of closing it (a stop that keeps the pool for the next start).
	adoption *adoption
	keep     func(p *dataPlane, kept keptState) error
	// handover is what the keeping stop's wire server handover did, for
	// the record (set before the plane closes).
	handover restart.Handover
	// kv keeps the announced set (nil when neither the stream nor the poll
	// log is on); kvPub publishes it (nil when kv_events.endpoint is empty).
	kv    *kvevents.Tracker
	kvPub *kvevents.Publisher
	// kvLog is LMCache's poll channel (POLL_KV_EVENTS), fed by kv; nil
	// when kv_events.log_size is 0.
	kvLog *kvevents.Log
}

// gate admits handlers until it is shut and says when the last one left.
type gate struct {
	mu      sync.Mutex
	running int
	shut    bool
	idle    chan struct{} // closed once shut with nothing running
	told    bool          // idle is closed
}

// enter admits one handler; false once the gate is shut.
func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut {
		return false
	}
	g.running++
	return true
}

// exit ends a handler admitted by enter.
func (g *gate) exit() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.running--
	g.tell()
}

func (g *gate) tell() {
	if g.shut && g.running == 0 && g.idle != nil && !g.told {
		close(g.idle)
		g.told = true
	}
}

// close admits no more handlers and returns a channel closed once none runs.
func (g *gate) close() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.shut = true
	if g.idle == nil {
		g.idle = make(chan struct{})
	}
	g.tell()
	return g.idle
}

// waitIdle waits for idle until ctx is done; an idle gate wins over a
// ctx that is already done.
func waitIdle(ctx context.Context, idle <-chan struct{}) bool {
	select {
	case <-idle:
		return true
	default:
	}
	select {
	case <-idle:
		return true
	case <-ctx.Done():
		return false
	}
}

// reopen admits handlers again after a close whose wait was abandoned.
func (g *gate) reopen() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.shut, g.idle, g.told = false, nil, false
}

// inFlight is how many handlers run now.
func (g *gate) inFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.running
}

// shmNameSource renders where --shm-name came from, for the SHM reason.
func shmNameSource(src map[string]settings.Source) string {
	s, ok := src["server.shm_name"]
	if !ok {
		return ""
	}
	switch s.Kind {
	case settings.SourceFlag:
		return "on the command line"
	case settings.SourceEnv:
		return "by " + s.Detail
	case settings.SourceFile:
		return "in " + s.Detail
	case settings.SourceDashboard:
		return "in the dashboard"
	}
	return ""
}

// buildDataPlane is upstream's context construction plus _build_modules: the pool
// carrying out the seed plan (PlanSegment, made once here), then the modules,
// which read the server settings themselves but take the SHM decision from
// the pool.
func (e *Engine) buildDataPlane(cfg settings.Config) (*dataPlane, error) {
	if cfg.Server.TransferMode != "non_gpu" {
		return nil, fmt.Errorf("transfer mode %q is not served: kvdock serves non-GPU workers only (CUDA IPC transfer needs LMCache's own server)", cfg.Server.TransferMode)
	}
	plan := nongpu.PlanSegment(cfg.Server, cfg.L1, e.opts.PID, shmNameSource(e.sources))
	est := whatif.New(whatif.Served(cfg.L1.SizeBytes()))
	ghost := misses.NewGhost(misses.DefaultGhostEntries)
	kv, kvLog := newKVTracker(cfg)
	pool, adopted, err := e.openPool(cfg, l1.Options{
		Size:      cfg.L1.SizeBytes(),
		Align:     int64(cfg.L1.AlignBytes),
		Plan:      plan,
		Prefault:  cfg.L1.Prefault,
		WriteTTL:  time.Duration(cfg.L1.WriteTTLSeconds) * time.Second,
		ReadTTL:   time.Duration(cfg.L1.ReadTTLSeconds) * time.Second,
		Policy:    cfg.Eviction.Policy,
		Watermark: cfg.Eviction.TriggerWatermark,
		Ratio:     cfg.Eviction.Ratio,
		Logger:    e.log.With("component", "l1"),
		Bytes:     settings.BytesText,

		ReadCapRefused: func(reason string) {
			e.events.add(EventRefused, slog.LevelWarn, "lookup locks refused, the chunks count as refused: "+reason)
		},
		OwnerLockShare: cfg.L1.MaxLockedSharePerInstance,
		TotalLockShare: cfg.L1.MaxLockedShare,
		Observer:       insight{est, ghost, kv},
		ObserveMax:     ghost.Entries(),
	})
	if err != nil {
		return nil, fmt.Errorf("L1 pool: %w", err)
	}
	d := pool.Decision()
	e.log.Info("L1 pool", "segment", d.Segment, "size", d.Size, "shared", d.Shared, "reason", d.Reason)

	hasher, err := keys.NewHasher(cfg.Server.ChunkSize, cfg.Server.HashAlgorithm)
	if err != nil {
		_ = pool.Close()
		return nil, fmt.Errorf("token hasher: %w", err)
	}
	p := &dataPlane{
		pool:     pool,
		sessions: keys.NewSessions(hasher, 600*time.Second, e.opts.Now),
		layouts:  layout.NewRegistry(),
		whatif:   est,
		ghost:    ghost,
		closed:   make(chan struct{}),
		log:      e.log,
		hook:     e.handlerHook,
		adoption: adopted,
		kv:       kv,
		kvLog:    kvLog,
	}
	if kv != nil {
		// LOOKUP answers only for registered layouts: the announced set
		// follows them (an unregister removes, a registration again
		// re-announces).
		p.layouts.Observe(func(model string, worldSize int, ids []uint64, groups []int) {
			kv.Registered(model, worldSize, kvevents.Layouts{IDs: ids, Groups: groups})
		})
	}
	if cfg.KVEvents.Endpoint != "" {
		if p.kvPub, err = startKVPublisher(cfg, kv, e.log); err != nil {
			_ = pool.Close()
			return nil, err
		}
	}
	p.sessions.SetLimits(sessionLimits(cfg))
	set, err := e.buildTiers(cfg.L2, pool, p.layouts, kv)
	if err != nil {
		p.closeKV()
		_ = pool.Close()
		return nil, err
	}
	p.tiers = &tiers{}
	p.tiers.swap(cfg.L2, set)
	p.lookup = lookup.New(p.sessions, pool, p.layouts, lookup.Options{
		JobTTL: time.Duration(cfg.L1.ReadTTLSeconds) * time.Second,
		Logger: e.log.With("component", "lookup"),
		Tiers:  p.tiers,
		Misses: misses.NewClassifier(pool, ghost),
		WhatIf: est,
	})
	p.transfer, err = nongpu.New(nongpu.Deps{
		Pool:      pool,
		Keys:      p.sessions,
		Layouts:   p.layouts,
		Logger:    e.log.With("component", "nongpu"),
		Events:    e.transferEvent,
		Published: p.tiers.Enqueue,
		Committed: p.kvCommitted(),
	}, cfg.Server, cfg.L1)
	if err != nil {
		p.closeKV()
		p.tiers.close()
		_ = pool.Close()
		return nil, fmt.Errorf("non-GPU transfer module: %w", err)
	}
	e.restoreRegistrations(p, adopted)
	e.restoreTransfers(p, adopted)
	// After the registrations the restart restored, which the adopted
	// chunks count for: the tracker is held from here, before the plane
	// serves, so the re-announcement (one of the loops below, which the
	// release waits for) leads the new stream.
	reannounce := e.reannounceKV(cfg, kv, adopted)

	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.done = make(chan struct{})
	loops := []func(context.Context){
		every(l1.MaintainEvery, pool.Maintain),
		every(keys.SessionSweepPeriod, func() { p.sessions.Sweep() }),
		func(ctx context.Context) {
			every(lookup.JobSweepPeriod, func() { p.lookup.Sweep() })(ctx)
			p.lookup.Stop() // nothing touches the pool once the loops end
		},
		every(nongpu.SweepEvery, p.transfer.Sweep),
		p.transfer.RunReaper,
	}
	if reannounce != nil {
		set := p.tiers.current()
		loops = append(loops, func(context.Context) { reannounce(pool, set) })
	}
	finished := make(chan struct{}, len(loops))
	for _, run := range loops {
		go func() {
			run(ctx)
			finished <- struct{}{}
		}()
	}
	go func() {
		for range loops {
			<-finished
		}
		close(p.done)
	}()
	return p, nil
}

// close stops admitting handlers, waits until ctx is done for the running
// ones, then releases the plane. When ctx ends first the pool stays mapped:
// those handlers hold raw views of it, and unmapping under them faults the
// process. The last of them to finish releases it; if the process exits
// first, the kernel drops the mapping and the next start's stale-segment
// cleanup removes the name (its flock died with the process).
func (p *dataPlane) close(ctx context.Context) error {
	idle := p.gate.close()
	if waitIdle(ctx, idle) {
		return p.release()
	}
	n := p.gate.inFlight()
	go func() {
		<-idle
		if err := p.release(); err != nil {
			p.log.Warn("closing the pool after the last request", "err", err)
		}
	}()
	return fmt.Errorf("%w: %d request(s) still running hold views of the pool; it stays mapped until they finish", ErrDrainTimeout, n)
}

// release discards pending transfers, stops the loops and closes the pool
// (the segment is unlinked), or keeps it when the stop keeps it (p.keep,
// told the registrations before the module forgets them, and the lookups
// answered and not queried once their tier phases ended; the pending
// transfers' holds are abandoned first, so they are kept as held). Only
// once no handler runs.
func (p *dataPlane) release() error {
	p.closeOnce.Do(func() {
		var kept keptState
		if p.keep != nil {
			// The carried transfers leave the pending maps before Close, so
			// their reservations stay live and their holds in force.
			kept.regs = p.transfer.Registrations()
			kept.transfers, kept.carryKey = p.transfer.Carry()
		}
		// The plane stopping is no unregister: the stream ends with it
		// (a restart's new stream resets the pod), so the registrations
		// the module forgets now remove nothing.
		p.layouts.Observe(nil)
		p.transfer.Close()
		p.cancel()
		<-p.done // the lookups' tier phases have ended
		set := p.tiers.current()
		p.tiers.close()
		if p.keep != nil && p.kv != nil && set != nil {
			// Once the tiers stopped: their writes behind have landed or
			// gone.
			kept.tierHeld = set.Held()
		}
		p.closeKV()
		if p.keep != nil {
			kept.lookups = keptLookups(p.lookup.Answers())
			p.closeErr = p.keep(p, kept)
		} else if err := p.pool.Close(); err != nil {
			p.closeErr = fmt.Errorf("close L1 pool: %w", err)
		}
		close(p.closed)
	})
	return p.closeErr
}

// guard runs h inside the gate: refused once the plane closes, counted
// while it runs.
func (p *dataPlane) guard(h rpc.Handler) rpc.Handler {
	return func(ctx context.Context, req *rpc.Request) (any, error) {
		if !p.gate.enter() {
			return nil, errStopping
		}
		defer p.gate.exit()
		if p.hook != nil {
			p.hook(p)
		}
		return h(ctx, req)
	}
}

// ErrDrainTimeout says requests were still running when a stop's drain
// ended; the pool was left mapped for them.
var ErrDrainTimeout = errors.New("drain timed out")

// errStopping answers requests that arrive while the plane closes.
var errStopping = errors.New("kvdock is stopping")

// errNotRunning answers faces that ask a stopped engine for work.
var errNotRunning = errors.New("engine is not running")

// sessionLimits are the key sessions' bounds from cfg: the wire refuses a
// longer token list at decode, and the sessions refuse it again so that no
// other path can hash or keep more.
func sessionLimits(cfg settings.Config) keys.Limits {
	return keys.Limits{MaxRequestTokens: cfg.Server.MaxTokensPerRequest}
}

// shmText says whether the plane's pool is shared and why: the start's
// event, and part of a rebuild's.
func (p *dataPlane) shmText() string {
	info := p.transfer.PoolInfo()
	if info.Shared() {
		return fmt.Sprintf("SHM on: %s (%s)", info.ShmName, info.Reason)
	}
	return "SHM off: " + info.Reason
}
