package reliability

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/core/testkit/poll"
	"kvdock/tests/harness"
)

// fdCount is how many file descriptors process pid holds.
func fdCount(t *testing.T, pid int) int {
	t.Helper()
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatalf("fds of %d: %v", pid, err)
	}
	return len(es)
}

// TestHTTPIdleConnectionsAreBounded: 2,000 idle keep-alive connections to
// the real binary's HTTP API cost it at most 64 descriptors, and a new
// client's /healthcheck still answers within 2 s (the bug: 19,980 such
// connections exhausted the fds; new workers and /healthcheck timed out).
func TestHTTPIdleConnectionsAreBounded(t *testing.T) {
	srv := harness.Start(t)
	before := fdCount(t, srv.PID())
	addr := fmt.Sprintf("127.0.0.1:%d", srv.HTTPPort)
	const n = 2000
	peak := 0
	for i := range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "GET /healthcheck HTTP/1.1\r\nHost: kvdock\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("request on connection %d: %v", i, err)
		}
		res.Body.Close()
		if i%100 == 99 {
			peak = max(peak, fdCount(t, srv.PID())-before)
		}
	}
	start := time.Now()
	res, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + addr + "/healthcheck")
	if err != nil {
		t.Fatalf("/healthcheck behind %d idle connections: %v", n, err)
	}
	res.Body.Close()
	took := time.Since(start)
	// A new worker still gets served.
	if r, err := srv.Dial(t, srv.Protocol).Call(context.Background(), protocol.Noop); err != nil || !r.Present {
		t.Fatalf("a new worker behind %d idle HTTP connections: %v", n, err)
	}
	if peak > 64+4 {
		t.Fatalf("%d idle HTTP connections held %d more fds in the server, bound 64", n, peak)
	}
	t.Logf("%d idle keep-alive connections: server fds +%d at most (bound 64), /healthcheck in %v", n, peak, took)
}

// TestLogFloodIsBounded: 100 registrations carrying a 2 MiB model name
// write a bounded log (the bug: each was logged whole, 8 MiB names gave
// +96 MiB of log).
func TestLogFloodIsBounded(t *testing.T) {
	srv := harness.Start(t)
	c := srv.Dial(t, srv.Protocol)
	before := len(srv.Output())
	huge := strings.Repeat("M", 2<<20)
	// The wire refuses such a name at decode, and seed profiles answer a
	// refused request with nothing: the calls are sent together and given
	// up together, and only the NOOP after them must be answered.
	flood, cancelFlood := context.WithTimeout(context.Background(), 5*time.Second)
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = c.Call(flood, protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{
				InstanceID: int64(1000 + i), ModelName: huge, WorldSize: 1, BlockSize: 16, NumLayers: harness.WorkerLayers,
				HiddenDimSize: harness.WorkerHidden, DtypeStr: "float32",
			})
		}()
	}
	wg.Wait()
	cancelFlood()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r, err := c.Call(ctx, protocol.Noop); err != nil || !r.Present {
		t.Fatalf("NOOP after the flood: %v", err)
	}
	grew := len(srv.Output()) - before
	if grew > 1<<20 {
		t.Fatalf("100 registrations with 2 MiB names wrote %d bytes of log, bound 1 MiB", grew)
	}
	t.Logf("100 registrations × 2 MiB model name: log +%d bytes (sent %d MiB)", grew, 200)
}

// TestSIGHUPLogsNoSecret: the real binary reloading a changed http.token
// logs the change without either value.
func TestSIGHUPLogsNoSecret(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvdock.yaml")
	if err := os.WriteFile(path, []byte("http:\n  token: old-s3cret-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := harness.Start(t, "--config", path)
	if err := os.WriteFile(path, []byte("http:\n  token: new-s3cret-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(srv.PID(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "SIGHUP applied", func() bool { return strings.Contains(srv.Output(), "SIGHUP: applied") })
	out := srv.Output()
	if strings.Contains(out, "s3cret") {
		t.Fatalf("the log holds the token:\n%s", out)
	}
	if !strings.Contains(out, "key=http.token") || !strings.Contains(out, "redacted") {
		t.Fatalf("the reload does not log the token change:\n%s", out)
	}
}
