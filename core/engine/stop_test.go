package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"kvdock/assets"
	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/settings"
)

// stuckHandler makes the first request handled by e hold a view of the pool
// until release is closed, then write through it: a write into an unmapped
// pool is "fatal error: fault", which no recover catches.
type stuckHandler struct {
	once      sync.Once
	started   chan struct{}
	release   chan struct{}
	wrote     chan struct{}
	dataPlane *dataPlane
}

func newStuckHandler(e *Engine) *stuckHandler {
	s := &stuckHandler{started: make(chan struct{}), release: make(chan struct{}), wrote: make(chan struct{})}
	e.handlerHook = func(p *dataPlane) {
		first := false
		s.once.Do(func() { first = true })
		if !first {
			return
		}
		view, release := p.pool.View(0, 1<<20)
		defer release()
		s.dataPlane = p
		close(s.started)
		<-s.release
		for i := range view {
			view[i] = 0xA5
		}
		close(s.wrote)
	}
	return s
}

// startStuck starts an engine (not stopped at the end) whose NOOP handler
// blocks, and sends a NOOP that reaches it.
func startStuck(t *testing.T) (settings.Config, string, *Engine, *stuckHandler) {
	t.Helper()
	cfg, seg := testConfig(t)
	e := New(cfg, Options{})
	stuck := newStuckHandler(e)
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	go func() { _, _ = c.Call(context.Background(), protocol.Noop) }()
	<-stuck.started
	return cfg, seg, e, stuck
}

// TestStopLeavesThePoolMappedWhileAHandlerRuns: Stop's drain times out with
// a handler still using the pool; the pool must stay mapped until the
// handler is done, then be closed and its segment name unlinked.
func TestStopLeavesThePoolMappedWhileAHandlerRuns(t *testing.T) {
	_, seg, e, stuck := startStuck(t)

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
	case <-stuck.dataPlane.closed:
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
	cfg, seg, e, stuck := startStuck(t)

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

// TestExitWithAHandlerStillRunning: kvdock exits (main's shutdown) while a
// handler still holds a view of the pool after Stop's drain timed out. The
// process ends without a fault; the segment's name outlives it (the pool was
// never closed), and the next start with that name removes it as stale (its
// flock died with the process) and serves.
func TestExitWithAHandlerStillRunning(t *testing.T) {
	if os.Getenv("KVDOCK_ENGINE_EXIT_CHILD") != "" {
		exitChild()
		return
	}
	cfg, seg := testConfig(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestExitWithAHandlerStillRunning$")
	cmd.Env = append(os.Environ(), "KVDOCK_ENGINE_EXIT_CHILD="+*cfg.Server.ShmName,
		"KVDOCK_ENGINE_EXIT_PORT="+strconv.Itoa(cfg.Server.Port))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "child: stop returned") || !strings.Contains(string(out), ErrDrainTimeout.Error()) {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", seg)); err != nil {
		t.Fatalf("after the exit the segment name is gone (%v): then the test's description is wrong", err)
	}
	e := startEngine(t, cfg)
	if r := e.Snapshot().Shm.Reason; !strings.Contains(r, "stale") {
		t.Fatalf("restart with the same name: reason %q does not mention the stale segment", r)
	}
	if err := e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", seg)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("segment left after the second server stopped: %v", err)
	}
}

// exitChild is the child of TestExitWithAHandlerStillRunning: a handler
// holds a pool view forever, Stop times out, the process exits.
func exitChild() {
	name := os.Getenv("KVDOCK_ENGINE_EXIT_CHILD")
	port, _ := strconv.Atoi(os.Getenv("KVDOCK_ENGINE_EXIT_PORT"))
	cfg := settings.Default()
	cfg.Server.Port = port
	cfg.L1.SizeGB = 16.0 / 1024
	cfg.L1.Prefault = false
	cfg.Server.ShmName = &name
	e := New(cfg, Options{})
	started := make(chan struct{})
	var once sync.Once
	e.handlerHook = func(p *dataPlane) {
		view, _ := p.pool.View(0, 4096) // never released: the process exits first
		once.Do(func() { close(started) })
		for {
			view[0]++ // keeps touching the pool until the process exits
			runtime.Gosched()
		}
	}
	if err := e.Start(context.Background()); err != nil {
		fmt.Println("child: start:", err)
		os.Exit(2)
	}
	p, _ := protocol.Load(cfg.Server.Protocol, assets.Protocol)
	c, err := client.Dial(fmt.Sprintf("tcp://127.0.0.1:%d", port), p, client.Options{Timeout: time.Second})
	if err != nil {
		fmt.Println("child: dial:", err)
		os.Exit(2)
	}
	go func() { _, _ = c.Call(context.Background(), protocol.Noop) }()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	fmt.Println("child: stop returned:", e.Stop(ctx))
	os.Exit(0)
}

// TestGateAdmitsNothingAfterIdle: once close's channel says idle, no handler
// runs and none is admitted, however many race to enter.
func TestGateAdmitsNothingAfterIdle(t *testing.T) {
	for range 50 {
		var g gate
		var running, after sync.WaitGroup
		var inside atomicCounter
		stop := make(chan struct{})
		for range 8 {
			running.Add(1)
			go func() {
				defer running.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if g.enter() {
						inside.add(1)
						inside.add(-1)
						g.exit()
					}
				}
			}()
		}
		<-g.close()
		if n := inside.load(); n != 0 {
			t.Fatalf("%d handlers inside an idle gate", n)
		}
		after.Add(1)
		go func() {
			defer after.Done()
			if g.enter() {
				t.Error("a closed gate admitted a handler")
			}
		}()
		after.Wait()
		close(stop)
		running.Wait()
		g.reopen()
		if !g.enter() {
			t.Fatal("a reopened gate refused a handler")
		}
		g.exit()
	}
}

type atomicCounter struct {
	mu sync.Mutex
	n  int
}

func (c *atomicCounter) add(d int) { c.mu.Lock(); c.n += d; c.mu.Unlock() }
func (c *atomicCounter) load() int { c.mu.Lock(); defer c.mu.Unlock(); return c.n }
