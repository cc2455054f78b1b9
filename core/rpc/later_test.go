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
// buffer of its own (Request.Defer, Later.ReplyBuffer) reaches the
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
		later := req.Defer()
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

// TestQueuedRequestOutlivesReceiveBuffer: a request queued for a worker
// keeps its own frames while the socket goroutine reads and answers other
// messages (served from its receive buffer) meanwhile: its key and uid
// reach the handler and the reply intact.
func TestQueuedRequestOutlivesReceiveBuffer(t *testing.T) {
	h := start(t, rpc.Options{})
	release := make(chan struct{})
	type seen struct{ tokens []uint32 }
	got := make(chan seen, 2)
	first := true
	h.srv.Handle(protocol.CommitStore, func(_ context.Context, req *rpc.Request) (any, error) {
		k := req.Args[0].(protocol.Key)
		if first {
			first = false
			<-release // the next one waits in the worker's queue meanwhile
		}
		got <- seen{tokens: k.TokenIDs}
		return true, nil
	})
	h.srv.Handle(protocol.Lookup, func(context.Context, *rpc.Request) (any, error) { return nil, nil })
	d := rawDealer(t, h.srv.Endpoint())
	other := rawDealer(t, h.srv.Endpoint())
	keyFrames := func(uid, base int) [][]byte {
		k := protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: make([]uint32, 64), End: 64}
		for i := range k.TokenIDs {
			k.TokenIDs[i] = uint32(base + i)
		}
		return [][]byte{enc(t, uid), enc(t, 12), enc(t, k), enc(t, 7), enc(t, []byte{1})}
	}
	sendFrames(t, d, keyFrames(1, 1000)...)
	sendFrames(t, d, keyFrames(2, 2000)...)
	// Other messages of the same size, read into the same buffer and
	// answered while request 2 waits.
	for i := range 20 {
		k := protocol.Key{ModelName: "x", WorldSize: 1, WorkerID: nil, TokenIDs: make([]uint32, 64), End: 64}
		for j := range k.TokenIDs {
			k.TokenIDs[j] = uint32(9000 + i + j)
		}
		sendFrames(t, other, enc(t, 100+i), enc(t, 5), enc(t, k), enc(t, int64(1)))
		if _, err := other.RecvMessageBytes(0); err != nil {
			t.Fatalf("lookup %d: %v", i, err)
		}
	}
	close(release)
	for n, base := range []int{1000, 2000} {
		s := <-got
		if len(s.tokens) != 64 || s.tokens[0] != uint32(base) || s.tokens[63] != uint32(base+63) {
			t.Fatalf("request %d saw tokens %v…, want %d…", n+1, s.tokens[:min(len(s.tokens), 3)], base)
		}
		msg, err := d.RecvMessageBytes(0)
		if err != nil || len(msg) < 1 || !bytes.Equal(msg[0], enc(t, n+1)) {
			t.Fatalf("reply %d: uid frame %x, %v", n+1, msg, err)
		}
	}
}
