package bench

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"kvdock/ui/httpapi"
)

// TestTargetServable: the skip reasons say what the server is and what to do.
func TestTargetServable(t *testing.T) {
	pickleSrv := &target{}
	if ok, why := pickleSrv.servable("shm"); ok || !strings.Contains(why, "pickle workers only") {
		t.Errorf("pickle server, shm: %v %q", ok, why)
	}
	if ok, _ := pickleSrv.servable("pickle"); !ok {
		t.Error("pickle server, pickle: refused")
	}
	st := &httpapi.Status{Endpoint: "tcp://127.0.0.1:5555", ShmName: "lmcache_l1_pool_x"}
	shmSrv := &target{shmName: "lmcache_l1_pool_x", poolSize: 1 << 30, status: st, statusURL: "http://127.0.0.1:8080/status"}
	for _, m := range []string{"shm", "pickle"} {
		if ok, why := shmSrv.servable(m); !ok {
			t.Errorf("kvdock SHM server, %s: %q", m, why)
		}
	}
	if n, from := shmSrv.pool(); n != 1<<30 || !strings.Contains(from, "advertised") {
		t.Errorf("pool without a capacity in /status: %d %q", n, from)
	}
	if n, _ := pickleSrv.pool(); n != 0 {
		t.Errorf("pickle server without /status: pool %d, want unknown (0)", n)
	}
	st.Pool.CapacityBytes = 2 << 30
	if n, from := shmSrv.pool(); n != 2<<30 || !strings.Contains(from, "/status") {
		t.Errorf("pool from /status: %d %q", n, from)
	}
	if n, from := shmSrv.residentPool(); n != 0 || !strings.Contains(from, "count as overhead") {
		t.Errorf("pool not prefaulted: resident %d %q, want 0", n, from)
	}
	st.Pool.PrefaultedBytes = 2 << 30
	if n, from := shmSrv.residentPool(); n != 2<<30 || !strings.Contains(from, "prefaulted pool") {
		t.Errorf("pool prefaulted: resident %d %q", n, from)
	}
	if why := shmSrv.notThisServer(5555); why != "" {
		t.Errorf("the same server: %q", why)
	}
	if why := shmSrv.notThisServer(5556); !strings.Contains(why, "not of the one on port 5556") {
		t.Errorf("another server's status: %q", why)
	}
	unknown := &target{shmName: "lmcache_l1_pool_x", poolSize: 1 << 30, statusURL: "http://h:1/status", statusErr: errors.New("connection refused")}
	if ok, why := unknown.servable("pickle"); ok || !strings.Contains(why, "connection refused") || !strings.Contains(why, "--http-port") {
		t.Errorf("SHM server without /status, pickle: %v %q", ok, why)
	}
	far := &target{shmName: "lmcache_l1_pool_x", poolSize: 1 << 30, attachErr: errors.New("no such file or directory")}
	if ok, why := far.servable("shm"); ok || !strings.Contains(why, "server's machine") {
		t.Errorf("segment not here, shm: %v %q", ok, why)
	}
	for _, name := range []string{"", "/", "../etc/passwd", "a/b", "..", "x\x00"} {
		if err := canOpenSegment(t.TempDir(), name); err == nil {
			t.Errorf("segment name %q opened", name)
		}
	}
}

// TestFetchStatusBounded: the target's HTTP API is a peer: an error status,
// junk, an oversized answer or one that stalls gives an error, not a pool
// size; escape sequences in its strings do not reach the terminal.
func TestFetchStatusBounded(t *testing.T) {
	stall := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/500":
			http.Error(w, "no", http.StatusInternalServerError)
		case "/junk":
			_, _ = w.Write([]byte(`{"pool": [1, 2`))
		case "/other":
			_, _ = w.Write([]byte(`{"status": "ok"}`))
		case "/huge":
			_, _ = w.Write([]byte(`{"endpoint": "` + strings.Repeat("a", statusLimit) + `"}`))
		case "/stall":
			<-stall
		default:
			_, _ = w.Write([]byte(`{"endpoint": "tcp://127.0.0.1:5555", "shm_reason": "x\u001b]52;c;ZXZpbA==\u0007y", "pool": {"capacity_bytes": 1024}}`))
		}
	}))
	defer srv.Close()
	defer close(stall) // first: Close waits for the stalled handler
	for _, path := range []string{"/500", "/junk", "/other", "/huge", "/stall"} {
		start := time.Now()
		st, err := fetchStatus(context.Background(), srv.URL+path, 300*time.Millisecond)
		if err == nil || st != nil {
			t.Errorf("%s: %+v, %v", path, st, err)
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Errorf("%s: answered after %v", path, el)
		}
	}
	// A limit for the good answer only bounds a failure on a loaded machine.
	st, err := fetchStatus(context.Background(), srv.URL+"/status", 10*time.Second)
	if err != nil || st.Pool.CapacityBytes != 1024 || st.ShmReason != "xy" {
		t.Errorf("good answer: %+v, %v", st, err)
	}
}
