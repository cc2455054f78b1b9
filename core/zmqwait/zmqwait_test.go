package zmqwait

import (
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// TestWaitSeesAMessageAndEndsOnClose: a wait returns once a message waits
// on the socket (sent after the wait began), and a wait in progress ends
// with an error when the Waiter is closed.
func TestWaitSeesAMessageAndEndsOnClose(t *testing.T) {
	in, err := zmq.NewSocket(zmq.PULL)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := zmq.NewSocket(zmq.PUSH)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if err := in.Bind("inproc://zmqwait-test"); err != nil {
		t.Fatal(err)
	}
	if err := out.Connect("inproc://zmqwait-test"); err != nil {
		t.Fatal(err)
	}
	w, err := New(in, "test socket")
	if err != nil {
		t.Fatal(err)
	}
	ready := func() bool {
		ev, err := in.GetEvents()
		return err != nil || ev&zmq.POLLIN != 0
	}
	got := make(chan error, 1)
	go func() { got <- w.Wait(ready) }()
	time.Sleep(20 * time.Millisecond) // let the wait start before the send (the case that needs the poller)
	if _, err := out.Send("hello", 0); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("wait: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the wait did not see the message")
	}
	if m, err := in.Recv(zmq.DONTWAIT); err != nil || m != "hello" {
		t.Fatalf("recv %q, %v", m, err)
	}
	go func() { got <- w.Wait(ready) }()
	time.Sleep(20 * time.Millisecond) // the wait is in progress (nothing to receive)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err == nil {
			t.Fatal("a wait ended by Close returned nil")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the wait")
	}
}
