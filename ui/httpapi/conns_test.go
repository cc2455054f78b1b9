package httpapi_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"kvdock/core/engine"
	"kvdock/ui/httpapi"
)

type servingEngine struct{}

func (servingEngine) Snapshot() engine.Snapshot                      { return engine.Snapshot{State: engine.Serving} }
func (servingEngine) RemoveInstance(int64, engine.ClearOrigin) error { return nil }

func (servingEngine) ClearCache(engine.ClearOrigin) (engine.Cleared, error) {
	return engine.Cleared{}, nil
}

func serveAPI(t *testing.T, opts httpapi.Options) (*httpapi.Server, string) {
	t.Helper()
	api := httpapi.New(servingEngine{}, opts)
	ln, cancel, done := serve(t, api)
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return api, ln.Addr().String()
}

// serve runs api.Serve on a new listener on a free 127.0.0.1 port and
// returns the listener, the cancel that stops Serve and where its error
// arrives.
func serve(t *testing.T, api *httpapi.Server) (net.Listener, context.CancelFunc, <-chan error) {
	t.Helper()
	ln, err := httpapi.Listen("127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.Serve(ctx, ln) }()
	return ln, cancel, done
}

// keepAlive opens a connection, makes one request on it and leaves it open
// and idle, as a keep-alive client does.
func keepAlive(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := io.WriteString(c, "GET /healthcheck HTTP/1.1\r\nHost: kvdock\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("request on a new connection: %v", err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return c
}

// closedByServer reports whether the server has closed c (it never sends
// anything unasked, so any answer to a read is EOF or a reset).
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(es)
}

// TestIdleConnectionsAreBounded: 200 idle keep-alive connections and 100
// silent ones hold at most DefaultMaxConns slots; the oldest are closed, and
// /healthcheck from a new client still answers at once (the bug: 19,980 idle
// connections exhausted the fds and /healthcheck timed out for 120 s).
func TestIdleConnectionsAreBounded(t *testing.T) {
	fds := openFDs(t)
	api, addr := serveAPI(t, httpapi.Options{})
	var idle []net.Conn
	for range 200 {
		idle = append(idle, keepAlive(t, addr))
	}
	for range 100 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
	}
	start := time.Now()
	cl := &http.Client{Timeout: 2 * time.Second}
	res, err := cl.Get("http://" + addr + "/healthcheck")
	if err != nil {
		t.Fatalf("/healthcheck from a new client behind 300 idle connections: %v", err)
	}
	res.Body.Close()
	cl.CloseIdleConnections()
	if res.StatusCode != http.StatusOK || time.Since(start) > 2*time.Second {
		t.Fatalf("/healthcheck: %d after %v", res.StatusCode, time.Since(start))
	}
	// The server accepts asynchronously; wait for the 100 silent dials.
	deadline := time.Now().Add(10 * time.Second)
	for api.Conns().Evicted < 300+1-httpapi.DefaultMaxConns && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	st := api.Conns()
	if st.Open > httpapi.DefaultMaxConns {
		t.Fatalf("%d connections open, limit %d", st.Open, httpapi.DefaultMaxConns)
	}
	for i, c := range idle[:100] {
		if !closedByServer(c) {
			t.Fatalf("idle connection %d of the oldest 100 still open (stats %+v)", i, st)
		}
	}
	// Our own client fds are in the count too: 300 client sockets, the
	// listener and at most DefaultMaxConns server sockets.
	if n := openFDs(t) - fds; n > 300+1+httpapi.DefaultMaxConns+8 {
		t.Fatalf("%d more fds open, bound %d", n, 300+1+httpapi.DefaultMaxConns+8)
	}
	t.Logf("stats after 300 idle connections: %+v", st)
}

// TestIdleTimeoutClosesKeepAlive: a keep-alive connection without a new
// request is closed after the idle timeout.
func TestIdleTimeoutClosesKeepAlive(t *testing.T) {
	api, addr := serveAPI(t, httpapi.Options{IdleTimeout: 100 * time.Millisecond})
	c := keepAlive(t, addr)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("idle keep-alive connection still open 5 s after a 100 ms idle timeout")
		}
	}
	if httpapi.DefaultIdleTimeout > 10*time.Second || httpapi.DefaultReadHeaderTimeout > 5*time.Second {
		t.Fatalf("defaults: idle %v, read header %v", httpapi.DefaultIdleTimeout, httpapi.DefaultReadHeaderTimeout)
	}
	_ = api
}

// TestBusyConnectionsRefuseNew: with every slot handling a request, a new
// connection is closed at once rather than queued.
func TestBusyConnectionsRefuseNew(t *testing.T) {
	api, addr := serveAPI(t, httpapi.Options{MaxConns: 2})
	// Two connections stuck in the middle of a request body (Active).
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if _, err := io.WriteString(c, "POST /clear-cache HTTP/1.1\r\nHost: kvdock\r\nContent-Length: 10\r\n\r\n{"); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for api.Conns().Busy < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the two stuck requests are not busy: %+v", api.Conns())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		refused := closedByServer(c)
		c.Close()
		if refused && api.Conns().Refused > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a third connection was not refused: %+v", api.Conns())
		}
	}
	if st := api.Conns(); st.Open > 2 {
		t.Fatalf("open %d > limit 2", st.Open)
	}
}
