package engine

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"kvdock/settings"
)

// lockedBuffer is a log sink the engine's goroutines may write together.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestStopLogsTierClosedAtInfo: a normal stop closes the fs tier; that is
// not a fault, so the log says it closed at INFO and nothing about a tier
// going down, at WARN or at all.
func TestStopLogsTierClosedAtInfo(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg.L2.Adapters = []settings.Adapter{{Type: "fs", FS: settings.FSAdapter{BasePath: t.TempDir()}}}
	var logs lockedBuffer
	e := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err := e.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := e.Stop(context.Background()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	out := logs.String()
	var closed bool
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "tier") && (strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") || strings.Contains(l, "tier down")) {
			t.Errorf("stop logged a tier fault: %s", l)
		}
		closed = closed || strings.Contains(l, `level=INFO msg="fs tier closed"`)
	}
	if !closed {
		t.Fatalf("no INFO line says the tier closed:\n%s", out)
	}
}
