package engine

import (
	"context"
	"errors"
	"strings"
	"testing"

	"kvdock/core/testkit/freeport"
	"kvdock/settings"
)

// TestApplyNextStartRestartsNothing: log.format, log.file and ui.headless are
// read once at start; applying them keeps the wire server (the same wireServer,
// the worker's connection) and says they wait for the next start.
func TestApplyNextStartRestartsNothing(t *testing.T) {
	e, cfg, c := startDialed(t)
	register(t, c, 1)
	e.mu.Lock()
	wireServer := e.wireServer
	e.mu.Unlock()

	next := cfg
	next.UI.Headless = !cfg.UI.Headless
	next.Log.Format = "json"
	next.Log.File = t.TempDir() + "/kvdock.log"
	res, err := e.Apply(context.Background(), next, nil)
	if err != nil || res.RolledBack || res.Class != settings.NextStart || len(res.Changes) != 3 {
		t.Fatalf("apply next-start keys: %+v %v", res, err)
	}
	e.mu.Lock()
	same := e.wireServer == wireServer
	e.mu.Unlock()
	if !same {
		t.Fatal("a next-start change restarted the wire server")
	}
	s := e.Snapshot()
	if s.State != Serving || s.Config.UI.Headless != next.UI.Headless || s.Config.Log.Format != "json" || len(s.Contexts) != 1 {
		t.Fatalf("after apply: state %v headless %v format %q contexts %d", s.State, s.Config.UI.Headless, s.Config.Log.Format, len(s.Contexts))
	}
	var said, restarted bool
	for _, ev := range s.Events {
		said = said || strings.Contains(ev.Message, "take effect at the next start")
		restarted = restarted || strings.HasPrefix(ev.Message, "applying ")
	}
	if !said || restarted {
		t.Fatalf("events (said next start %v, restarted %v): %+v", said, restarted, s.Events)
	}
	if err := noop(t, c); err != nil {
		t.Fatalf("the worker's connection after the apply: %v", err)
	}
}

// faceCall is one OnApply call.
type faceCall struct{ from, to int }

// TestApplyFaceFailureRollsBack: a face that cannot move (the HTTP port is
// taken) fails Apply, which reports it and keeps the running config, the
// engine's part of the change included.
func TestApplyFaceFailureRollsBack(t *testing.T) {
	cfg, _ := testConfig(t)
	var calls []faceCall
	e := New(cfg, Options{OnApply: func(_ context.Context, old, new settings.Config) error {
		calls = append(calls, faceCall{old.HTTP.Port, new.HTTP.Port})
		if new.HTTP.Port == 1 {
			return errors.New("HTTP API: listen on 127.0.0.1:1: address already in use")
		}
		return nil
	}})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)

	next := cfg
	next.HTTP.Port = 1
	next.Server.Port = freeport.Port(t)
	next.Eviction.Ratio = 0.5
	res, err := e.Apply(context.Background(), next, nil)
	if err == nil || !res.RolledBack || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("apply with a failing face: %+v %v", res, err)
	}
	s := e.Snapshot()
	if s.Config.HTTP.Port != cfg.HTTP.Port || s.Config.Server.Port != cfg.Server.Port || s.Pool.Ratio == 0.5 || s.State != Serving {
		t.Fatalf("after a failed face: config %+v ratio %v state %v", s.Config.HTTP, s.Pool.Ratio, s.State)
	}
	if err := noop(t, c); err != nil {
		t.Fatalf("old port after the failed apply: %v", err)
	}
	if len(calls) != 1 || calls[0] != (faceCall{cfg.HTTP.Port, 1}) {
		t.Fatalf("OnApply calls %+v", calls)
	}
}

// TestApplyEngineFailureMovesFacesBack: when the engine's part fails (its
// port is taken), the faces that already moved are moved back.
func TestApplyEngineFailureMovesFacesBack(t *testing.T) {
	cfg, _ := testConfig(t)
	var calls []faceCall
	e := New(cfg, Options{OnApply: func(_ context.Context, old, new settings.Config) error {
		calls = append(calls, faceCall{old.HTTP.Port, new.HTTP.Port})
		return nil
	}})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	busy := busyPort(t)
	next := cfg
	next.HTTP.Port = cfg.HTTP.Port + 1
	next.Server.Port = busy
	res, err := e.Apply(context.Background(), next, nil)
	if err == nil || !res.RolledBack {
		t.Fatalf("apply onto a taken wire port: %+v %v", res, err)
	}
	want := []faceCall{{cfg.HTTP.Port, next.HTTP.Port}, {next.HTTP.Port, cfg.HTTP.Port}}
	if len(calls) != 2 || calls[0] != want[0] || calls[1] != want[1] {
		t.Fatalf("OnApply calls %+v, want %+v", calls, want)
	}
	if s := e.Snapshot(); s.Config.HTTP.Port != cfg.HTTP.Port || s.State != Serving {
		t.Fatalf("after rollback: http port %d state %v", s.Config.HTTP.Port, s.State)
	}
}
