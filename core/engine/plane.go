package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/layout"
	"kvdock/core/lookup"
	"kvdock/settings"
	"kvdock/transfer/nongpu"
)

// plane is the data plane: what holds the cache and the worker contexts. A
// restart keeps it; a rebuild replaces it.
type plane struct {
	pool     *l1.Pool
	sessions *keys.Sessions
	layouts  *layout.Registry
	lookup   *lookup.Module
	transfer *nongpu.Module
	cancel   context.CancelFunc
	done     chan struct{}
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

// buildPlane is upstream's context construction plus _build_modules: the pool
// under the segment the seed decision names, then the modules, which read the
// server settings themselves.
func (e *Engine) buildPlane(cfg settings.Config) (*plane, error) {
	if cfg.Server.TransferMode != "non_gpu" {
		return nil, fmt.Errorf("transfer mode %q is not served: kvdock serves non-GPU workers only (CUDA IPC transfer needs LMCache's own server)", cfg.Server.TransferMode)
	}
	segment, reason := nongpu.PlanSegment(cfg.Server, cfg.L1, e.opts.PID, shmNameSource(e.sources))
	pool, err := l1.Open(l1.Options{
		Size:        cfg.L1.SizeBytes(),
		Align:       int64(cfg.L1.AlignBytes),
		Segment:     segment,
		NoShmReason: reason,
		Prefault:    cfg.L1.Prefault,
		WriteTTL:    time.Duration(cfg.L1.WriteTTLSeconds) * time.Second,
		ReadTTL:     time.Duration(cfg.L1.ReadTTLSeconds) * time.Second,
		Policy:      cfg.Eviction.Policy,
		Watermark:   cfg.Eviction.TriggerWatermark,
		Ratio:       cfg.Eviction.Ratio,
		Logger:      e.log.With("component", "l1"),

		OwnerLockShare: cfg.L1.MaxLockedSharePerInstance,
		TotalLockShare: cfg.L1.MaxLockedShare,
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
	p := &plane{
		pool:     pool,
		sessions: keys.NewSessions(hasher, 600*time.Second, e.opts.Now),
		layouts:  layout.NewRegistry(),
	}
	p.lookup = lookup.New(p.sessions, pool, p.layouts, lookup.Options{
		JobTTL: time.Duration(cfg.L1.ReadTTLSeconds) * time.Second,
		Logger: e.log.With("component", "lookup"),
	})
	p.transfer, err = nongpu.New(nongpu.Deps{
		Pool:    pool,
		Keys:    p.sessions,
		Layouts: p.layouts,
		Logger:  e.log.With("component", "nongpu"),
		Events:  e.transferEvent,
	}, cfg.Server, cfg.L1)
	if err != nil {
		_ = pool.Close()
		return nil, fmt.Errorf("non-GPU transfer module: %w", err)
	}
	info := p.transfer.PoolInfo()
	if info.Shared() {
		e.events.add(EventLifecycle, slog.LevelInfo, fmt.Sprintf("SHM on: %s (%s)", info.ShmName, info.Reason))
	} else {
		e.events.add(EventLifecycle, slog.LevelInfo, "SHM off: "+info.Reason)
	}

	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.done = make(chan struct{})
	loops := []func(context.Context){pool.Run, p.sessions.Run, p.lookup.Run, p.transfer.Run}
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

// close discards pending transfers, stops the loops and closes the pool
// (the segment is unlinked).
func (p *plane) close() error {
	p.transfer.Close()
	p.cancel()
	<-p.done
	if err := p.pool.Close(); err != nil {
		return fmt.Errorf("close L1 pool: %w", err)
	}
	return nil
}

// errNotRunning answers faces that ask a stopped engine for work.
var errNotRunning = errors.New("engine is not running")
