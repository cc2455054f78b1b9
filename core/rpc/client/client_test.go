package client_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"kvdock/assets"
	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
)

func nowhere(t *testing.T) (*client.Client, *protocol.Profile) {
	t.Helper()
	b, _ := assets.Protocol("nongpu-v1")
	p, err := protocol.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	c, err := client.Dial("tcp://127.0.0.1:"+strconv.Itoa(port), p, client.Options{Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return c, p
}

func TestTimeoutAndUnknownName(t *testing.T) {
	c, _ := nowhere(t)
	defer c.Close()
	if _, err := c.Call(context.Background(), "NOOP"); !errors.Is(err, client.ErrTimeout) {
		t.Fatalf("want ErrTimeout, got %v", err)
	}
	if _, err := c.Call(context.Background(), "NOT_A_REQUEST"); err == nil {
		t.Fatal("unknown request name accepted")
	}
}

// silentPeer is a bare ROUTER on loopback that never answers: calls reach
// it and stay outstanding. It returns the socket, its endpoint and the
// profile the clients speak.
func silentPeer(t *testing.T) (*zmq.Socket, string, *protocol.Profile) {
	t.Helper()
	b, _ := assets.Protocol("nongpu-v1")
	p, err := protocol.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	router, err := zmq.NewSocket(zmq.ROUTER)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { router.Close() })
	_ = router.SetLinger(0)
	_ = router.SetRcvtimeo(10 * time.Second)
	if err := router.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, err := router.GetLastEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	return router, ep, p
}

// Outstanding calls end with ErrClosed when the client closes. A bare ROUTER
// stands in for the server: it receives the calls (so they are outstanding)
// and never answers.
func TestCloseEndsOutstandingCalls(t *testing.T) {
	router, ep, p := silentPeer(t)
	c, err := client.Dial(ep, p, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const calls = 3
	errs := make(chan error, calls)
	for range calls {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := c.Call(ctx, "PING")
			errs <- err
		}()
	}
	for i := range calls {
		if msg, err := router.RecvMessageBytes(0); err != nil {
			t.Fatalf("call %d never reached the peer: %v", i, err)
		} else if len(msg) != 3 {
			t.Fatalf("call %d: frames %q", i, msg)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for range calls {
		if err := <-errs; !errors.Is(err, client.ErrClosed) {
			t.Errorf("want ErrClosed, got %v", err)
		}
	}
	if _, err := c.Call(context.Background(), "NOOP"); !errors.Is(err, client.ErrClosed) {
		t.Errorf("call after Close: %v", err)
	}
}

func TestReplyDecodeWithoutResult(t *testing.T) {
	var s string
	if err := (client.Reply{}).Decode(&s); err == nil {
		t.Fatal("decoding an absent result must fail")
	}
	b, _ := protocol.Encode("OK")
	if err := (client.Reply{Present: true, Raw: b}).Decode(&s); err != nil || s != "OK" {
		t.Fatalf("%q %v", s, err)
	}
}

// A call whose context is already done sends nothing: a bare ROUTER
// receives only the live call made after it, and the done calls fail at
// once with their context's error (a deadline as ErrTimeout).
func TestDoneContextSendsNothing(t *testing.T) {
	router, ep, p := silentPeer(t)
	c, err := client.Dial(ep, p, client.Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Call(cancelled, "PREPARE_STORE", protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: []uint32{1}}, int64(1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	if _, err := c.Call(expired, "NOOP"); !errors.Is(err, client.ErrTimeout) {
		t.Fatalf("expired call: %v", err)
	}
	if _, err := c.Call(context.Background(), "PING"); !errors.Is(err, client.ErrTimeout) {
		t.Fatalf("live call to a silent peer: %v", err)
	}
	msg, err := router.RecvMessageBytes(0)
	if err != nil {
		t.Fatal(err)
	}
	ping, _ := p.ByName("PING")
	if typ, _ := protocol.Encode(ping.Number); len(msg) != 3 || string(msg[2]) != string(typ) {
		t.Fatalf("the first message the peer got is not the PING: %q", msg)
	}
}
