package main

import (
	"context"
	"log/slog"
	"sync"

	"kvdock/core/engine"
	"kvdock/settings"
	"kvdock/ui/httpapi"
	"kvdock/ui/metrics"
)

// httpFace runs the operator HTTP API beside the engine and restarts it when
// an applied config changes the http settings.
type httpFace struct {
	eng     *engine.Engine
	metrics *metrics.Metrics
	logger  *slog.Logger

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// start binds the API (a taken port fails here, at once); port 0 disables it.
func (h *httpFace) start(ctx context.Context, cfg settings.HTTPConfig) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cfg.Port == 0 {
		h.logger.Info("HTTP API disabled (--http-port 0)")
		return nil
	}
	ln, err := httpapi.Listen(cfg.Host, cfg.Port)
	if err != nil {
		return err
	}
	api := httpapi.New(h.eng, httpapi.Options{Token: cfg.Token, Metrics: h.metrics, Logger: h.logger})
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	h.cancel, h.done = cancel, done
	go func() {
		defer close(done)
		if err := api.Serve(sctx, ln); err != nil {
			h.logger.Error("HTTP API stopped", "err", err)
		}
	}()
	return nil
}

// stop shuts the API down and waits for it.
func (h *httpFace) stop() {
	h.mu.Lock()
	cancel, done := h.cancel, h.done
	h.cancel, h.done = nil, nil
	h.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// restart moves the API to new settings; a failure is logged and the API
// stays down until the next apply.
func (h *httpFace) restart(ctx context.Context, cfg settings.HTTPConfig) {
	h.stop()
	if err := h.start(ctx, cfg); err != nil {
		h.logger.Error("HTTP API not restarted", "err", err)
	}
}
