package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"kvdock/settings"
)

// ApplyResult says what Apply did.
type ApplyResult struct {
	Changes []settings.Change
	// Class is the strongest class among Changes.
	Class settings.Class
	// RolledBack is true when the new config failed to start and the
	// engine went back to the running one.
	RolledBack bool
}

// Apply moves the engine to cfg: live keys change in place; next-start keys
// are recorded and take effect when kvdock starts again; restart keys restart
// the wire server with the pool and registered contexts kept; rebuild keys
// re-create the pool (cache and contexts dropped, old segment unlinked). The
// faces' own keys (http.*) go to Options.OnApply first. A face or a restart
// or rebuild that fails rolls back to the running config and returns the
// failure; the engine (and the faces) keep serving the old config then.
// Every apply that changes something records one event: the keys, their
// class and how it ended.
func (e *Engine) Apply(ctx context.Context, cfg settings.Config, sources map[string]settings.Source) (ApplyResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.publish()
	old := e.cfg
	changes := settings.Diff(old, cfg)
	res := ApplyResult{Changes: changes, Class: settings.Strongest(changes)}
	if len(changes) == 0 {
		return res, nil
	}
	keys := make([]string, len(changes))
	for i, c := range changes {
		keys[i] = c.Key
	}
	// Errors say "restart (k1, k2)"; the event "(live): k1, k2", not
	// "live: live (k1, k2)".
	what := fmt.Sprintf("%s (%s)", res.Class, strings.Join(keys, ", "))
	changed := fmt.Sprintf("(%s): %s", res.Class, strings.Join(keys, ", "))
	if err := e.checkMemoryLocked(old, cfg, sources); err != nil {
		e.events.add(EventError, slog.LevelError, fmt.Sprintf("apply %s refused: %v", changed, err))
		return res, fmt.Errorf("apply: %w", err)
	}
	oldSources := e.sources
	if sources != nil {
		e.sources = sources
	}
	if e.dataPlane == nil {
		// Not running: the next Start uses the new config.
		e.cfg = cfg
		e.events.add(EventRestart, slog.LevelInfo, "applied "+changed+"; the engine is not running: they take effect when it starts")
		return res, nil
	}

	// The faces first: moving the HTTP API back is cheap, a rebuilt pool is not.
	if err := e.applyFaces(ctx, old, cfg); err != nil {
		res.RolledBack = true
		e.sources = oldSources
		e.events.add(EventError, slog.LevelError, fmt.Sprintf("apply %s failed, kept the running config: %v", changed, err))
		return res, fmt.Errorf("apply %s: %w (rolled back to the running config)", what, err)
	}

	class := engineClass(changes)
	if class < settings.Restart {
		e.applyLive(cfg)
		e.cfg = cfg
		e.events.add(EventRestart, slog.LevelInfo, "applied "+changed+nextStartNote(changes))
		return res, nil
	}

	// The state says RESTARTING meanwhile; the event comes with the outcome.
	e.setState(Restarting, nil)
	stopCtx, cancel := context.WithTimeout(ctx, DrainTimeout)
	defer cancel()
	f := e.wireServer
	e.wireServer = nil
	e.publish()
	if err := f.stop(stopCtx); err != nil {
		e.log.Warn("wire server stop during apply", "err", err)
	}

	var err error
	dropped := 0
	if class == settings.Rebuild {
		dropped, err = e.rebuildLocked(stopCtx, cfg)
	} else {
		err = e.restartFrontLocked(cfg)
	}
	if err == nil {
		e.applyLive(cfg)
		e.cfg = cfg
		e.setState(Serving, nil)
		msg, lv := "applied "+changed+nextStartNote(changes), slog.LevelInfo
		if class == settings.Rebuild {
			msg += "; pool rebuilt, cache cleared"
			if dropped > 0 {
				msg += fmt.Sprintf(", %d worker contexts dropped (workers must re-register)", dropped)
				lv = slog.LevelWarn
			}
			msg += "; " + e.dataPlane.shmText()
		}
		e.events.add(EventRestart, lv, msg)
		return res, nil
	}

	// Roll back to the running config: the engine, then the faces.
	res.RolledBack = true
	e.sources = oldSources
	e.log.Warn("apply failed, rolling back", "change", what, "err", err)
	var rbErr error
	if e.dataPlane == nil {
		_, rbErr = e.rebuildLocked(context.Background(), old)
	} else {
		rbErr = e.restartFrontLocked(old)
	}
	if rbErr != nil {
		e.setState(Failed, rbErr)
		rbErr = fmt.Errorf("rollback: %w", rbErr)
	} else {
		e.setState(Serving, nil)
	}
	if ferr := e.applyFaces(context.WithoutCancel(ctx), cfg, old); ferr != nil {
		rbErr = errors.Join(rbErr, fmt.Errorf("rollback of the faces: %w", ferr))
	}
	if rbErr != nil {
		e.events.add(EventError, slog.LevelError, fmt.Sprintf("apply %s failed: %v; %v", changed, err, rbErr))
		return res, errors.Join(fmt.Errorf("apply %s: %w", what, err), rbErr)
	}
	e.events.add(EventError, slog.LevelError, fmt.Sprintf("apply %s failed, rolled back to the running config: %v", changed, err))
	return res, fmt.Errorf("apply %s: %w (rolled back to the running config)", what, err)
}

// nextStartNote tells which of changes wait for the next start ("" for none).
func nextStartNote(changes []settings.Change) string {
	var keys []string
	for _, c := range changes {
		if c.Class == settings.NextStart {
			keys = append(keys, c.Key)
		}
	}
	if len(keys) == 0 {
		return ""
	}
	return "; " + strings.Join(keys, ", ") + " take effect at the next start"
}

// restartFrontLocked starts a wire server for cfg over the kept plane.
func (e *Engine) restartFrontLocked(cfg settings.Config) error {
	f, err := e.startWireServer(cfg, e.dataPlane)
	if err != nil {
		return err
	}
	e.wireServer = f
	return nil
}

// rebuildLocked replaces the data plane (pool, sessions, contexts) and the
// wire server; it returns how many worker contexts the old pool dropped.
// The old pool is closed first: its segment is unlinked and its contexts are
// dropped, so no worker is ever handed offsets into a segment it has not
// attached. Requests of the old wire server still running when ctx ends hold
// views of the old pool: the rebuild is then refused and the plane kept.
func (e *Engine) rebuildLocked(ctx context.Context, cfg settings.Config) (dropped int, err error) {
	if p := e.dataPlane; p != nil {
		if !waitIdle(ctx, p.gate.close()) {
			n := p.gate.inFlight()
			p.gate.reopen()
			return 0, fmt.Errorf("pool not rebuilt: %w: %d request(s) still running hold views of it", ErrDrainTimeout, n)
		}
		dropped = p.transfer.Stats().Instances
		e.dataPlane = nil
		e.publish()
		if err := p.release(); err != nil {
			e.log.Warn("closing the old pool", "err", err)
		}
		e.st.Lock()
		e.rebuilt = Rebuilt{At: e.opts.Now(), DroppedContexts: dropped}
		e.st.Unlock()
	}
	return dropped, e.startLocked(cfg)
}

// applyLive changes the live keys of cfg in place.
func (e *Engine) applyLive(cfg settings.Config) {
	e.applyTiersLocked(cfg.L2)
	if p := e.dataPlane; p != nil {
		if err := p.pool.SetEviction(cfg.Eviction.Policy, cfg.Eviction.TriggerWatermark, cfg.Eviction.Ratio); err != nil {
			e.log.Warn("eviction settings", "err", err)
		}
		w := time.Duration(cfg.L1.WriteTTLSeconds) * time.Second
		r := time.Duration(cfg.L1.ReadTTLSeconds) * time.Second
		if err := p.pool.SetTTLs(w, r); err != nil {
			e.log.Warn("TTL settings", "err", err)
		}
		p.transfer.SetTTLs(w, r)
		p.transfer.SetMaxInstances(cfg.Server.MaxInstances)
		if f := e.wireServer; f != nil {
			p.transfer.SetLiveness(livenessFor(cfg, f.srv.Profile(), f.srv.Detect()))
		}
		p.sessions.SetLimits(sessionLimits(cfg))
		if err := p.pool.SetLockShares(cfg.L1.MaxLockedSharePerInstance, cfg.L1.MaxLockedShare); err != nil {
			e.log.Warn("lock cap settings", "err", err)
		}
	}
	if e.opts.LogLevel != nil {
		var lv slog.Level
		if err := lv.UnmarshalText([]byte(cfg.Log.Level)); err == nil {
			e.opts.LogLevel.Set(lv)
		}
	}
	if e.opts.GPU != nil && cfg.UI.Refresh > 0 {
		e.opts.GPU.SetInterval(cfg.UI.Refresh)
	}
}

// applyFaces hands a config change to Options.OnApply. It runs with e.mu
// held (Apply's caller waits for the face to move); the hook must not call
// back into the engine's lifecycle.
func (e *Engine) applyFaces(ctx context.Context, old, cfg settings.Config) error {
	if e.opts.OnApply == nil {
		return nil
	}
	return e.opts.OnApply(ctx, old, cfg)
}

// engineClass is the strongest class among the changes the engine itself
// acts on: the faces' own keys (http.*) are OnApply's; next-start keys and
// live ones restart nothing.
func engineClass(changes []settings.Change) settings.Class {
	var own []settings.Change
	for _, c := range changes {
		if !strings.HasPrefix(c.Key, "http.") {
			own = append(own, c)
		}
	}
	return settings.Strongest(own)
}

// checkMemoryLocked refuses a new pool size larger than the host's
// available memory plus what the running pool gives back (a rebuild closes
// it first): a pool past the host prefaults, or fills, until the OOM killer
// ends kvdock. An unchanged size checks nothing.
func (e *Engine) checkMemoryLocked(old, cfg settings.Config, sources map[string]settings.Source) error {
	if e.opts.Memory == nil || cfg.L1.SizeBytes() == old.L1.SizeBytes() {
		return nil
	}
	avail, err := e.opts.Memory.MemAvailable()
	if err != nil {
		e.log.Warn("host memory unknown: pool size not checked", "err", err)
		return nil
	}
	if p := e.dataPlane; p != nil {
		st := p.pool.Stats()
		avail += min(st.Size, max(st.Prefaulted, st.UsedBytes))
	}
	if sources == nil {
		sources = e.sources
	}
	if err := settings.CheckMemory(cfg, sources, avail); err != nil {
		return err
	}
	e.warnMemoryAt(cfg, avail)
	return nil
}
