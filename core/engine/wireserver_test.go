package engine

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"kvdock/core/layout"
	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/core/testkit/poll"
)

// TestWireFailureReportsFrontFailed: a wire server
// whose socket can no longer be polled gives up Serve rather than log every
// 10 ms forever, and the engine reports the failure (Failed, state, event).
func TestWireFailureReportsFrontFailed(t *testing.T) {
	cfg, _ := testConfig(t)
	e := New(cfg, Options{})
	var broken atomic.Bool
	e.wireOptions = func(o *rpc.Options) {
		o.PollFault = func() error {
			if broken.Load() {
				return zmq.Errno(9) // EBADF
			}
			return nil
		}
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	if err := noop(t, c); err != nil {
		t.Fatal(err)
	}
	broken.Store(true)
	// Wake the loop from its poll: the next poll is the failing one.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, _ = c.Call(ctx, protocol.Noop)
	}()
	select {
	case <-e.Failed():
	case <-time.After(15 * time.Second):
		t.Fatal("engine did not report the failed wire server")
	}
	s := e.Snapshot()
	if s.State != Failed {
		t.Errorf("state %v, want failed", s.State)
	}
	var saw bool
	for _, ev := range s.Events {
		saw = saw || strings.Contains(ev.Message, "wire server failed") && strings.Contains(ev.Message, "poll failed")
	}
	if !saw {
		t.Errorf("no failure event in %+v", s.Events)
	}
}

// TestBindFailureNeverReportsFailed: a bind failure (port taken) during an
// apply is returned and rolled back; it must never close Failed (were Serve
// started before the start is marked, a fast bind failure could).
func TestBindFailureNeverReportsFailed(t *testing.T) {
	cfg, _ := testConfig(t)
	e := startEngine(t, cfg)
	busy := busyPort(t)
	next := cfg
	next.Server.Port = busy
	for range 20 {
		if res, err := e.Apply(context.Background(), next, nil); err == nil || !res.RolledBack {
			t.Fatalf("apply onto a taken port: %+v %v", res, err)
		}
	}
	select {
	case <-e.Failed():
		t.Fatal("a bind failure was reported as a wire server failure")
	default:
	}
	if s := e.Snapshot(); s.State != Serving {
		t.Fatalf("state %v after rollbacks", s.State)
	}
	if err := noop(t, dial(t, cfg.Server.Port, cfg.Server.Protocol)); err != nil {
		t.Fatal(err)
	}
}

// TestMessageCapFollowsLayouts: before any registration
// the cap admits keys of the most tokens allowed and registrations, no bulk
// data; a registered layout raises it to the largest legal commit, and it
// falls back when the last layout goes. --max-message-bytes bounds it.
func TestMessageCapFollowsLayouts(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg.Server.MaxTokensPerRequest = 4096
	reg := layout.NewRegistry()
	capf := messageCap(cfg, reg)
	base := int64(5*4096 + 1<<20)
	if got := capf(); got != base {
		t.Fatalf("cap before registration %d, want %d", got, base)
	}
	lay, err := layout.New(2, cfg.Server.ChunkSize, 16, "float32", false)
	if err != nil {
		t.Fatal(err)
	}
	reg.Add("m", 1, lay)
	chunks := int64(4096/cfg.Server.ChunkSize + 1)
	if got, want := capf(), base+chunks*(lay.Bytes+4<<10); got != want {
		t.Fatalf("cap with a %d-byte layout %d, want %d", lay.Bytes, got, want)
	}
	// Never more chunks than the pool holds.
	big, _ := layout.New(64, cfg.Server.ChunkSize, 4096, "float32", false)
	reg.Add("big", 1, big)
	if got, want := capf(), base+(cfg.L1.SizeBytes()/big.Bytes+1)*(big.Bytes+4<<10); got != want {
		t.Fatalf("cap with a layout larger than the pool %d, want %d", got, want)
	}
	reg.Remove("big", 1, layout.ID([]layout.Layout{big}))
	reg.Remove("m", 1, layout.ID([]layout.Layout{lay}))
	if got := capf(); got != base {
		t.Fatalf("cap after the last unregistration %d, want %d", got, base)
	}

	// Over the wire: a 1.5 MiB message is refused before registration and
	// read (then refused as a bad payload) after.
	e := startEngine(t, cfg)
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	payload, _ := protocol.Encode(strings.Repeat("x", 3<<19))
	send := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, _ = c.CallRaw(ctx, 6, payload) // never answered: dropped either way
	}
	stats := func() rpc.Stats { return e.Snapshot().Requests }
	send()
	poll.Until(t, 5*time.Second, "oversized before registration", func() bool { return stats().BadInput[protocol.KindOversized] == 1 })
	register(t, c, 1)
	send()
	poll.Until(t, 5*time.Second, "read after registration", func() bool { return stats().DecodeFailures["QUERY_PREFETCH_STATUS"] == 1 })
	if n := stats().BadInput[protocol.KindOversized]; n != 1 {
		t.Fatalf("oversized %d after registration", n)
	}
}
