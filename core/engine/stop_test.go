package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"kvdock/core/protocol"
)

// stuckHandler makes the first request handled by e hold a view of the pool
// until release is closed, then write through it: a write into an unmapped
// pool is "fatal error: fault", which no recover catches.
type stuckHandler struct {
	once    sync.Once
	started chan struct{}
	release chan struct{}
	wrote   chan struct{}
	plane   *plane
}

func newStuckHandler(e *Engine) *stuckHandler {
	s := &stuckHandler{started: make(chan struct{}), release: make(chan struct{}), wrote: make(chan struct{})}
	e.handlerHook = func(p *plane) {
		first := false
		s.once.Do(func() { first = true })
		if !first {
			return
		}
		view := p.pool.Bytes(0, 1<<20)
		s.plane = p
		close(s.started)
		<-s.release
		for i := range view {
			view[i] = 0xA5
		}
		close(s.wrote)
	}
	return s
}

// TestStopLeavesThePoolMappedWhileAHandlerRuns: Stop's drain times out with
// a handler still using the pool; the pool must stay mapped until the
// handler is done, then be closed and its segment name unlinked.
func TestStopLeavesThePoolMappedWhileAHandlerRuns(t *testing.T) {
	cfg, seg := testConfig(t)
	e := New(cfg, Options{})
	stuck := newStuckHandler(e)
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	go func() { _, _ = c.Call(context.Background(), protocol.Noop) }()
	<-stuck.started

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	// Errorf, not Fatalf: the handler must still get to write (that write
	// is what faults when the pool was unmapped).
	err := e.Stop(ctx)
	if !errors.Is(err, ErrDrainTimeout) {
		t.Errorf("Stop with a handler still running: %v, want ErrDrainTimeout", err)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", seg)); err != nil {
		t.Errorf("segment gone while a handler still uses the pool: %v", err)
	}
	if s := e.Snapshot(); s.State != Stopped {
		t.Errorf("state after stop: %v", s.State)
	}
	close(stuck.release)
	<-stuck.wrote // the process did not fault
	select {
	case <-stuck.plane.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("pool not closed after the last handler finished")
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", seg)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("segment left after the last handler finished: %v", err)
	}
}

// TestRebuildRefusedWhileAHandlerRuns: a rebuild whose drain times out must
// not close the pool under the handler; the apply fails instead.
func TestRebuildRefusedWhileAHandlerRuns(t *testing.T) {
	cfg, seg := testConfig(t)
	e := New(cfg, Options{})
	stuck := newStuckHandler(e)
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	go func() { _, _ = c.Call(context.Background(), protocol.Noop) }()
	<-stuck.started

	next := cfg
	name := *cfg.Server.ShmName + "_b"
	next.Server.ShmName = &name
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := e.Apply(ctx, next, nil)
	if !errors.Is(err, ErrDrainTimeout) {
		t.Errorf("rebuild with a handler still running: %v, want ErrDrainTimeout", err)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", seg)); err != nil {
		t.Errorf("old segment gone while a handler still uses it: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", seg+"_b")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("new segment created although the rebuild was refused: %v", err)
	}
	close(stuck.release)
	<-stuck.wrote // the process did not fault
	if err := e.Stop(context.Background()); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Logf("stop after a refused rebuild: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", seg)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("segment left after Stop: %v", err)
	}
}

func TestStopTimeoutCoversTheDrain(t *testing.T) {
	if StopTimeout < DrainTimeout+poolCloseAllowance || poolCloseAllowance <= 0 {
		t.Fatalf("StopTimeout %v does not cover the drain %v and the pool close", StopTimeout, DrainTimeout)
	}
}
