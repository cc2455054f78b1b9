package client_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

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

func TestTimeoutUnknownNameAndClose(t *testing.T) {
	c, _ := nowhere(t)
	if _, err := c.Call(context.Background(), "NOOP"); !errors.Is(err, client.ErrTimeout) {
		t.Fatalf("want ErrTimeout, got %v", err)
	}
	if _, err := c.Call(context.Background(), "NOT_A_REQUEST"); err == nil {
		t.Fatal("unknown request name accepted")
	}
	// Outstanding calls end with ErrClosed when the client closes.
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := c.Call(ctx, "PING")
			errs <- err
		}()
	}
	time.Sleep(50 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
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
