package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvdock/core/engine"
	"kvdock/settings"
	"kvdock/ui/httpapi"
)

// runnerEngine is a real engine whose http.* settings move a Runner, wired
// as main wires them.
func runnerEngine(t *testing.T, tok string) (*engine.Engine, *httpapi.Runner, settings.Config) {
	t.Helper()
	cfg := testConfig(t, tok)
	if err := settings.Validate(cfg, nil); err != nil {
		t.Fatalf("test config invalid: %v", err)
	}
	var web *httpapi.Runner
	eng := engine.New(cfg, engine.Options{Version: "test", OnApply: func(_ context.Context, _, new settings.Config) error {
		return web.Restart(new.HTTP)
	}})
	web = httpapi.NewRunner(eng, httpapi.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	if err := eng.Start(ctx); err != nil {
		cancel()
		t.Fatalf("engine start: %v", err)
	}
	if err := web.Start(ctx, cfg.HTTP); err != nil {
		cancel()
		t.Fatalf("runner start: %v", err)
	}
	t.Cleanup(func() {
		web.Stop()
		cancel()
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		if err := eng.Stop(stopCtx); err != nil {
			t.Errorf("engine stop: %v", err)
		}
	})
	return eng, web, cfg
}

// get answers GET addr+path with the status code, or the dial error.
func get(t *testing.T, addr, path string) (int, error) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// post answers POST addr+path with a bearer token.
func post(t *testing.T, addr, path, tok string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

func addrOf(cfg settings.HTTPConfig) string {
	return net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
}

// TestApplyHTTPPortTakenRollsBack: moving the API onto a taken port fails
// Apply (the failure is not merely logged while the dashboard says
// "applied"), and the old API keeps serving on the old port.
func TestApplyHTTPPortTakenRollsBack(t *testing.T) {
	eng, web, cfg := runnerEngine(t, "")
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	next := cfg
	next.HTTP.Port = busy.Addr().(*net.TCPAddr).Port
	res, err := eng.Apply(context.Background(), next, nil)
	if err == nil || !res.RolledBack || !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("apply onto a taken HTTP port: %+v %v", res, err)
	}
	if s := eng.Snapshot(); s.Config.HTTP.Port != cfg.HTTP.Port || s.State != engine.Serving {
		t.Fatalf("after the failed apply: http port %d state %v", s.Config.HTTP.Port, s.State)
	}
	if code, err := get(t, addrOf(cfg.HTTP), "/healthcheck"); err != nil || code != http.StatusOK {
		t.Fatalf("old API after the failed apply: %d %v", code, err)
	}
	if a := web.Addr(); a == nil || a.String() != addrOf(cfg.HTTP) {
		t.Fatalf("runner address %v, want %s", a, addrOf(cfg.HTTP))
	}
	// The next good apply still moves it: the runner kept its settings.
	next.HTTP.Port = freePort(t)
	if _, err := eng.Apply(context.Background(), next, nil); err != nil {
		t.Fatalf("apply after the failed one: %v", err)
	}
	if code, err := get(t, addrOf(next.HTTP), "/healthcheck"); err != nil || code != http.StatusOK {
		t.Fatalf("new API: %d %v", code, err)
	}
}

// TestApplyHTTPMovesListener: a good restart serves on the new port and lets
// the old one go; port 0 disables the API and a later apply brings it back.
func TestApplyHTTPMovesListener(t *testing.T) {
	eng, web, cfg := runnerEngine(t, "")
	next := cfg
	next.HTTP.Port = freePort(t)
	res, err := eng.Apply(context.Background(), next, nil)
	if err != nil || res.RolledBack || res.Class != settings.Restart {
		t.Fatalf("apply http.port: %+v %v", res, err)
	}
	if code, err := get(t, addrOf(next.HTTP), "/healthcheck"); err != nil || code != http.StatusOK {
		t.Fatalf("new port: %d %v", code, err)
	}
	if _, err := get(t, addrOf(cfg.HTTP), "/healthcheck"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("old port still answers: %v", err)
	}
	if a := web.Addr(); a == nil || a.String() != addrOf(next.HTTP) {
		t.Fatalf("runner address %v", a)
	}

	off := next
	off.HTTP.Port = 0
	if _, err := eng.Apply(context.Background(), off, nil); err != nil {
		t.Fatalf("disable: %v", err)
	}
	if a := web.Addr(); a != nil {
		t.Fatalf("disabled API still listens on %v", a)
	}
	if _, err := get(t, addrOf(next.HTTP), "/healthcheck"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("disabled API answers: %v", err)
	}
	if _, err := eng.Apply(context.Background(), next, nil); err != nil {
		t.Fatalf("re-enable: %v", err)
	}
	if code, err := get(t, addrOf(next.HTTP), "/healthcheck"); err != nil || code != http.StatusOK {
		t.Fatalf("re-enabled API: %d %v", code, err)
	}
}

// TestApplyHTTPTokenOnSameAddress: a token change alone rebinds the same
// address and the new token is the one required.
func TestApplyHTTPTokenOnSameAddress(t *testing.T) {
	eng, web, cfg := runnerEngine(t, "old-token")
	addr := addrOf(cfg.HTTP)
	if code := post(t, addr, "/clear-cache", "old-token"); code != http.StatusOK {
		t.Fatalf("old token before: %d", code)
	}
	next := cfg
	next.HTTP.Token = "new-token"
	if _, err := eng.Apply(context.Background(), next, nil); err != nil {
		t.Fatalf("apply http.token: %v", err)
	}
	if code := post(t, addr, "/clear-cache", "old-token"); code != http.StatusUnauthorized {
		t.Fatalf("old token after the change: %d", code)
	}
	if code := post(t, addr, "/clear-cache", "new-token"); code != http.StatusOK {
		t.Fatalf("new token: %d", code)
	}
	// An unchanged config leaves the server alone.
	before := web.Addr()
	if err := web.Restart(next.HTTP); err != nil || web.Addr() != before {
		t.Fatalf("restart with the same settings: %v (addr %v -> %v)", err, before, web.Addr())
	}
}

// TestRunnerRestartConcurrentWithRequests: restarts while clients keep
// asking never hang, and each request either answers or is refused.
func TestRunnerRestartConcurrentWithRequests(t *testing.T) {
	eng, _, cfg := runnerEngine(t, "")
	ports := []int{cfg.HTTP.Port, freePort(t)}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, p := range ports {
				code, err := get(t, net.JoinHostPort("127.0.0.1", fmt.Sprint(p)), "/status")
				if err == nil && code != http.StatusOK {
					t.Errorf("status %d", code)
				}
				if err != nil && !strings.Contains(err.Error(), "refused") && !strings.Contains(err.Error(), "reset") && !strings.Contains(err.Error(), "EOF") {
					t.Errorf("request: %v", err)
				}
			}
		}
	}()
	deadline := time.Now().Add(60 * time.Second)
	for i := range 20 {
		next := cfg
		next.HTTP.Port = ports[(i+1)%2]
		if _, err := eng.Apply(context.Background(), next, nil); err != nil {
			t.Errorf("apply %d: %v", i, err)
		}
		cfg = next
	}
	close(stop)
	<-done
	if time.Now().After(deadline) {
		t.Fatal("20 restarts took more than a minute")
	}
}

// TestRunnerRefusesBadMovesAndRestartAfterStop: an address that cannot be
// bound leaves the old API serving; after Stop nothing serves again.
func TestRunnerRefusesBadMovesAndRestartAfterStop(t *testing.T) {
	_, web, cfg := runnerEngine(t, "")
	bad := cfg.HTTP
	bad.Host = "192.0.2.1" // TEST-NET-1: not an address of this machine
	if err := web.Restart(bad); err == nil {
		t.Fatal("restart onto a foreign address succeeded")
	}
	if code, err := get(t, addrOf(cfg.HTTP), "/healthcheck"); err != nil || code != http.StatusOK {
		t.Fatalf("old API after a refused move: %d %v", code, err)
	}
	web.Stop()
	next := cfg.HTTP
	next.Port = freePort(t)
	if err := web.Restart(next); err == nil || web.Addr() != nil {
		t.Fatalf("restart after Stop: %v, listening on %v", err, web.Addr())
	}
	if _, err := get(t, addrOf(next), "/healthcheck"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("API serves after Stop: %v", err)
	}
}
