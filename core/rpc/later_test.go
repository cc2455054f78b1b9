package rpc_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/core/rpc"
)

// TestDeferredReplyBufferCharged: a deferred answer written into a reply
// buffer of its own (Request.DeferReply, Later.ReplyBuffer) reaches the
// peer byte for byte; the buffer's bytes are charged to its HeldBytes from
// its allocation until libzmq released it after sending, and a buffer not
// sent (an error answered instead) is uncharged at once.
func TestDeferredReplyBufferCharged(t *testing.T) {
	h := start(t, rpc.Options{})
	held, err := rpc.NewHeldBytes()
	if err != nil {
		t.Fatal(err)
	}
	const n = 6 << 20
	type step struct {
		later *rpc.Later
		buf   []byte
	}
	steps := make(chan step, 2)
	h.srv.Handle(protocol.CommitStore, func(_ context.Context, req *rpc.Request) (any, error) {
		later := req.DeferReply()
		buf, err := later.ReplyBuffer(n, held)
		if err != nil {
			return nil, err
		}
		steps <- step{later, buf}
		return "ignored", nil
	})
	d := rawDealer(t, h.srv.Endpoint())
	sendFrames(t, d, commitFrames(t, 1, 4, []byte{1})...)
	s := <-steps
	if got := held.Load(); got != n {
		t.Fatalf("charged %d before the answer, want %d", got, n)
	}
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i * 31)
	}
	reply := append(s.buf, want...)
	s.later.Answer(protocol.Raw(reply), nil)
	s.later.Answer("twice", nil) // ignored
	msg, err := d.RecvMessageBytes(0)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	if len(msg) != 3 || !bytes.Equal(msg[2], want) {
		t.Fatalf("reply of %d frames differs from what was written", len(msg))
	}
	deadline := time.Now().Add(10 * time.Second)
	for held.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still charged %d after the peer read the reply", held.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := s.later.ReplyBuffer(1, held); err == nil {
		t.Error("a reply buffer was given after the answer")
	}

	// An error answered instead: the buffer is freed, uncharged, at once.
	sendFrames(t, d, commitFrames(t, 2, 4, []byte{1})...)
	s = <-steps
	s.later.Answer(nil, errors.New("no"))
	if got := held.Load(); got != 0 {
		t.Fatalf("charged %d after an error was answered", got)
	}
	if st := h.srv.Stats(); st.Requests[protocol.CommitStore].Error != 1 {
		t.Errorf("stats %+v, want one error", st.Requests[protocol.CommitStore])
	}
	held.Free()
}
