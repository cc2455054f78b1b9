package rpc_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/core/testkit/freeport"
)

// serveNoop binds a server of opts that answers NOOP and serves it; the
// channel gives Serve's result.
func serveNoop(t *testing.T, opts rpc.Options) (*rpc.Server, <-chan error) {
	t.Helper()
	srv, err := rpc.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Handle(protocol.Noop, func(context.Context, *rpc.Request) (any, error) { return "OK", nil })
	if err := srv.Bind(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background()) }()
	return srv, done
}

// noopServer serves NOOP on port, given listener (kept for listenerFor)
// to serve on; it is shut down with the test.
func noopServer(t *testing.T, port int, listener *os.File, listenerFor string) *rpc.Server {
	t.Helper()
	srv, done := serveNoop(t, rpc.Options{Host: "127.0.0.1", Port: port, Profile: profile(t, "nongpu-v1"),
		Listener: listener, ListenerFor: listenerFor})
	t.Cleanup(func() {
		_ = srv.Shutdown(context.Background())
		<-done
	})
	return srv
}

// TestListenerKeptAcrossServers: a server's listening socket kept
// (KeepListener) goes on accepting once that server is gone, and the next
// server serves on it: a worker that connected while no server ran gets
// its answer, never a refusal.
func TestListenerKeptAcrossServers(t *testing.T) {
	port := freeport.Port(t)
	old := noopServer(t, port, nil, "")
	fd, ep, err := old.KeepListener()
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Nothing serves now; the kept socket still accepts.
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
	if err != nil {
		t.Fatalf("a connection while no server runs was refused: %v", err)
	}
	c.Close()
	s, err := dialDealer("tcp://127.0.0.1:" + strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	answered := make(chan bool, 1)
	go func() {
		uid, _ := protocol.Encode(int64(1))
		ok, _ := handoverCall(s, uid, [][]byte{enc(t, 19)}, 5*time.Second)
		answered <- ok
	}()
	time.Sleep(150 * time.Millisecond) // the request waits in the kernel's backlog
	noopServer(t, port, os.NewFile(uintptr(fd), "listener"), ep)
	if !<-answered {
		t.Fatal("the request sent while no server ran was not answered by the server on the kept socket")
	}
}

// TestHostileKeptListenerRefused: a listener handed to a server for another
// endpoint, or a descriptor that is not a listening socket on its port, is
// closed and not used: the server binds its own and serves.
func TestHostileKeptListenerRefused(t *testing.T) {
	other := freeport.Port(t)
	held := noopServer(t, other, nil, "")
	fd, ep, err := held.KeepListener()
	if err != nil {
		t.Fatal(err)
	}
	if n := rpc.Listeners(other); n != 2 {
		t.Fatalf("%d listening sockets on port %d, want the server's and the one kept", n, other)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	cases := []struct {
		name   string
		f      *os.File
		for_   func(port int) string
		closed func() bool
	}{
		{"another endpoint", os.NewFile(uintptr(fd), "other"), func(int) string { return ep },
			func() bool { return rpc.Listeners(other) == 1 }},
		{"a pipe", r, func(port int) string { return "tcp://127.0.0.1:" + strconv.Itoa(port) },
			func() bool { _, err := w.Write([]byte("x")); return errors.Is(err, unix.EPIPE) }},
	}
	for _, tc := range cases {
		port := freeport.Port(t)
		srv := noopServer(t, port, tc.f, tc.for_(port))
		if want := "tcp://127.0.0.1:" + strconv.Itoa(port); srv.Endpoint() != want {
			t.Errorf("%s: bound %s, want %s", tc.name, srv.Endpoint(), want)
		}
		if !tc.closed() {
			t.Errorf("%s: the descriptor handed over is still open", tc.name)
		}
		s, err := dialDealer(srv.Endpoint())
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := protocol.Encode(int64(2))
		if ok, _ := handoverCall(s, uid, [][]byte{enc(t, 19)}, 5*time.Second); !ok {
			t.Errorf("%s: the server that refused the listener does not serve", tc.name)
		}
		s.Close()
	}
}
