package ctl_test

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"kvdock/ui/ctl"
	"kvdock/ui/httpapi"
)

// fakeUnregisterAPI is a /unregister that knows instance 42 only and
// records the ids it was asked for.
func fakeUnregisterAPI(t *testing.T) (port string, asked func() []string) {
	t.Helper()
	var mu sync.Mutex
	var ids []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/unregister" || !strings.HasPrefix(r.UserAgent(), httpapi.CtlAgent) {
			http.NotFound(w, r)
			return
		}
		id := r.URL.Query().Get("instance_id")
		mu.Lock()
		ids = append(ids, id)
		mu.Unlock()
		if id != "42" {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(httpapi.ErrorBody{Status: "error", Error: "instance " + id + " is not registered: unknown instance"})
			return
		}
		_ = json.NewEncoder(w).Encode(httpapi.UnregisterResult{Status: "ok", InstanceID: 42})
	}))
	t.Cleanup(srv.Close)
	_, port, _ = net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	return port, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), ids...)
	}
}

func TestUnregisterCommand(t *testing.T) {
	port, asked := fakeUnregisterAPI(t)
	p := "--http-port=" + port
	for _, args := range [][]string{{"unregister"}, {"unregister", "1", "2"}, {"unregister", "x"}, {"unregister", "99999999999999999999"}, {"unregister", "\x1b[31m"}} {
		code, _, errs := runEnv(ctl.Env{}, append([]string{p}, args...)...)
		if code != 2 || strings.Contains(errs, "\x1b") || len(asked()) != 0 {
			t.Fatalf("%q: exit %d, err %q, asked %v", args, code, errs, asked())
		}
	}
	if code, _, errs := runEnv(ctl.Env{}, p, "unregister", "42"); code != 2 || !strings.Contains(errs, "--yes") || len(asked()) != 0 {
		t.Fatalf("no terminal, no --yes: exit %d, err %q", code, errs)
	}
	if code, _, errs := runEnv(ctl.Env{Terminal: true, Stdin: strings.NewReader("n\n")}, p, "unregister", "42"); code != 1 || !strings.Contains(errs, "not removed") || len(asked()) != 0 {
		t.Fatalf("answered n: exit %d, err %q", code, errs)
	}
	if code, out, errs := runEnv(ctl.Env{Terminal: true, Stdin: strings.NewReader("y\n")}, p, "unregister", "42"); code != 0 || out != "instance 42 removed\n" {
		t.Fatalf("answered y: exit %d, out %q, err %q", code, out, errs)
	}
	if code, _, errs := runEnv(ctl.Env{}, p, "--yes", "unregister", "--", "-7"); code != 1 || !strings.Contains(errs, "not registered") {
		t.Fatalf("unknown id: exit %d, err %q", code, errs)
	}
	if got := strings.Join(asked(), ","); got != "42,-7" {
		t.Fatalf("ids asked %q", got)
	}
	if code, _, errs := runEnv(ctl.Env{}, "--http-port=0", "unregister", "42", "--yes"); code != 2 || !strings.Contains(errs, "HTTP API") {
		t.Fatalf("HTTP API off: exit %d, err %q", code, errs)
	}
}
