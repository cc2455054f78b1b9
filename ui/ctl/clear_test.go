package ctl_test

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"kvdock/ui/ctl"
	"kvdock/ui/httpapi"
)

// fakeClearAPI is a /clear-cache that requires token (when set), counts
// the clears it did and answers 3 objects of 3 MiB.
func fakeClearAPI(t *testing.T, token string) (port string, clears *atomic.Int32, agent *atomic.Value) {
	t.Helper()
	clears, agent = new(atomic.Int32), new(atomic.Value)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/clear-cache" {
			http.NotFound(w, r)
			return
		}
		if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(httpapi.ErrorBody{Status: "error", Error: "missing or wrong bearer token"})
			return
		}
		agent.Store(r.UserAgent())
		clears.Add(1)
		_ = json.NewEncoder(w).Encode(httpapi.ClearResult{Status: "ok", Objects: 3, Bytes: 3 << 20})
	}))
	t.Cleanup(srv.Close)
	_, port, _ = net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	return port, clears, agent
}

// TestClearAsksOnATerminalAndRefusesWithoutOne: a terminal gets a y/N
// question (anything but y or yes keeps the cache), a script without --yes
// is refused at once rather than left waiting, and --yes clears. What was
// cleared is printed.
func TestClearAsksOnATerminalAndRefusesWithoutOne(t *testing.T) {
	port, clears, agent := fakeClearAPI(t, "")
	p := "--http-port=" + port

	code, out, errs := runEnv(ctl.Env{}, p, "clear")
	if code != 2 || out != "" || !strings.Contains(errs, "--yes") || clears.Load() != 0 {
		t.Fatalf("no terminal, no --yes: exit %d, out %q, err %q, %d clears", code, out, errs, clears.Load())
	}
	for _, answer := range []string{"", "\n", "n\n", "no\n", "maybe\n", strings.Repeat("y", 1<<20)} {
		code, _, errs := runEnv(ctl.Env{Terminal: true, Stdin: strings.NewReader(answer)}, p, "clear")
		if code != 1 || !strings.Contains(errs, "[y/N]") || !strings.Contains(errs, "not cleared") || clears.Load() != 0 {
			t.Fatalf("answer %.20q: exit %d, err %q, %d clears", answer, code, errs, clears.Load())
		}
	}
	for i, answer := range []string{"y\n", " YES \n"} {
		code, out, errs := runEnv(ctl.Env{Terminal: true, Stdin: strings.NewReader(answer)}, p, "clear")
		if code != 0 || out != "cleared 3 objects (3.0 MiB)\n" || clears.Load() != int32(i+1) {
			t.Fatalf("answer %q: exit %d, out %q, err %q, %d clears", answer, code, out, errs, clears.Load())
		}
	}
	code, out, errs = runEnv(ctl.Env{}, p, "clear", "--yes")
	if code != 0 || out != "cleared 3 objects (3.0 MiB)\n" || clears.Load() != 3 {
		t.Fatalf("--yes: exit %d, out %q, err %q", code, out, errs)
	}
	if a, _ := agent.Load().(string); !strings.HasPrefix(a, httpapi.CtlAgent) {
		t.Fatalf("User-Agent %q: the events pane would not say ctl cleared", a)
	}
}

// TestClearSendsTheTokenFromTheSettings: the token comes from
// KVDOCK_HTTP_TOKEN or the settings file like serve's; without it the
// refusal says what to set.
func TestClearSendsTheTokenFromTheSettings(t *testing.T) {
	port, clears, _ := fakeClearAPI(t, "s3cret")
	p := "--http-port=" + port
	code, _, errs := runEnv(ctl.Env{}, p, "--yes", "clear")
	if code != 1 || !strings.Contains(errs, "KVDOCK_HTTP_TOKEN") || clears.Load() != 0 {
		t.Fatalf("no token: exit %d, err %q", code, errs)
	}
	if code, _, errs := runEnv(ctl.Env{Environ: []string{"KVDOCK_HTTP_TOKEN=s3cret"}}, p, "--yes", "clear"); code != 0 || clears.Load() != 1 {
		t.Fatalf("token from env: exit %d, err %q", code, errs)
	}
	file := filepath.Join(t.TempDir(), "kvdock.yaml")
	if err := os.WriteFile(file, []byte("http:\n  port: "+port+"\n  token: s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := runEnv(ctl.Env{Environ: []string{"KVDOCK_CONFIG=" + file}}, "--yes", "clear"); code != 0 || clears.Load() != 2 {
		t.Fatalf("port and token from the file: exit %d, err %q", code, errs)
	}
	if strings.Contains(errs, "s3cret") {
		t.Fatalf("the token leaked into the output: %q", errs)
	}
}

// TestClearHostileAnswers: an API that answers junk, a huge body, escape
// sequences or nothing gets a clear error, bounded in size, exit 1.
func TestClearHostileAnswers(t *testing.T) {
	for name, h := range map[string]http.HandlerFunc{
		"junk": func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("<html>")) },
		"huge": func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"status":"ok","objects_cleared":1,"x":"` + strings.Repeat("A", 8<<20) + `"}`))
		},
		"escapes": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(httpapi.ErrorBody{Status: "error", Error: "down\x1b[2J\x07"})
		},
	} {
		srv := httptest.NewServer(h)
		_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
		code, out, errs := runEnv(ctl.Env{}, "--http-port", port, "--yes", "clear")
		srv.Close()
		if code != 1 || out != "" || len(errs) > 4096 || strings.ContainsAny(errs, "\x1b\x07") {
			t.Errorf("%s: exit %d, out %q, %d bytes of stderr %.200q", name, code, out, len(errs), errs)
		}
	}
	dead := strconv.Itoa(statusFreePort(t))
	code, _, errs := runEnv(ctl.Env{}, "--http-port", dead, "--timeout", "2s", "--yes", "clear")
	if code != 1 || !strings.Contains(errs, "does not answer") || !strings.Contains(errs, "--http-port 0") {
		t.Errorf("no API: exit %d, err %q", code, errs)
	}
}
