package rpc_test

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/core/testkit/poll"
)

// commitFrames is a COMMIT_STORE request [uid, type, key, instance, bytes]
// whose key carries tokens token ids.
func commitFrames(t *testing.T, uid int, tokens int, data []byte) [][]byte {
	t.Helper()
	k := protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: make([]uint32, tokens), End: tokens}
	for i := range k.TokenIDs {
		k.TokenIDs[i] = 1 << 30
	}
	return [][]byte{enc(t, uid), enc(t, 12), enc(t, k), enc(t, 7), enc(t, data)}
}

// TestLargeFramesBorrowedOnlyAsBytes: a bytes payload frame of 1 MiB or more
// reaches the handler intact straight from libzmq's buffer (charged to the
// in-flight bytes while the handler runs, released after it); a smaller one
// and a large frame decoded as anything else (a key) are Go copies and
// charge nothing.
func TestLargeFramesBorrowedOnlyAsBytes(t *testing.T) {
	h := start(t, rpc.Options{MaxMessageBytes: 64 << 20})
	type seen struct {
		crc      uint32
		n        int
		inflight int64
		tokens   int
	}
	got := make(chan seen, 4)
	h.srv.Handle(protocol.CommitStore, func(_ context.Context, req *rpc.Request) (any, error) {
		data := req.Args[2].([]byte)
		k := req.Args[0].(protocol.Key)
		got <- seen{crc: crc32.ChecksumIEEE(data), n: len(data), inflight: h.srv.Stats().InFlightBytes, tokens: len(k.TokenIDs)}
		return true, nil
	})
	d := rawDealer(t, h.srv.Endpoint())
	r := rand.New(rand.NewPCG(1, 2))
	cases := []struct {
		name     string
		size     int
		tokens   int
		borrowed bool
	}{
		{"3 MiB bytes", 3 << 20, 4, true},
		{"512 KiB bytes", 512 << 10, 4, false},
		{"1.5 MiB key, small bytes", 4 << 10, 300_000, false},
	}
	for i, c := range cases {
		data := make([]byte, c.size)
		for j := range data {
			data[j] = byte(r.Uint32())
		}
		sendFrames(t, d, commitFrames(t, i, c.tokens, data)...)
		s := <-got
		if _, err := d.RecvMessageBytes(0); err != nil {
			t.Fatalf("%s: no reply: %v", c.name, err)
		}
		if s.n != c.size || s.crc != crc32.ChecksumIEEE(data) || s.tokens != c.tokens {
			t.Errorf("%s: handler saw %d bytes crc %x, %d tokens; sent %d crc %x, %d tokens",
				c.name, s.n, s.crc, s.tokens, c.size, crc32.ChecksumIEEE(data), c.tokens)
		}
		if c.borrowed && s.inflight < int64(c.size) {
			t.Errorf("%s: %d in-flight bytes while its handler ran, want >= %d (borrowed)", c.name, s.inflight, c.size)
		}
		if !c.borrowed && s.inflight != 0 {
			t.Errorf("%s: %d in-flight bytes while its handler ran, want 0 (copied)", c.name, s.inflight)
		}
		poll.Until(t, statsLimit, c.name+": in-flight bytes released", func() bool { return h.srv.Stats().InFlightBytes == 0 })
	}
}

// TestInFlightBytesStopReading: past InFlightBytes of borrowed frames the
// server reads no further message (counted), holding no more than the limit
// plus the message that crossed it; once the handlers finish every request
// is answered: backpressure, nothing dropped.
func TestInFlightBytesStopReading(t *testing.T) {
	const limit, size, peers = 4 << 20, 3 << 20, 4
	h := start(t, rpc.Options{MaxMessageBytes: 64 << 20, InFlightBytes: limit, OrderedWorkers: peers})
	release := make(chan struct{})
	entered := make(chan struct{}, peers)
	h.srv.Handle(protocol.CommitStore, func(_ context.Context, req *rpc.Request) (any, error) {
		entered <- struct{}{}
		<-release
		return len(req.Args[2].([]byte)) == size, nil
	})
	data := make([]byte, size)
	socks := make([]*zmq.Socket, peers)
	for i := range socks {
		socks[i] = rawDealer(t, h.srv.Endpoint())
		sendFrames(t, socks[i], commitFrames(t, i, 4, data)...)
	}
	<-entered
	<-entered
	poll.Until(t, statsLimit, "reading to stop at the in-flight limit", func() bool { return h.srv.Stats().InFlightWaits > 0 })
	if n := h.srv.Stats().InFlightBytes; n > limit+size {
		t.Errorf("%d bytes in flight, limit %d plus one message %d", n, limit, size)
	}
	close(release)
	var wg sync.WaitGroup
	for i, s := range socks {
		wg.Go(func() {
			msg, err := s.RecvMessageBytes(0)
			if err != nil {
				t.Errorf("peer %d: no reply: %v", i, err)
				return
			}
			if string(msg[len(msg)-1]) != string(enc(t, true)) {
				t.Errorf("peer %d: reply %x, want true", i, msg[len(msg)-1])
			}
		})
	}
	wg.Wait()
	poll.Until(t, statsLimit, "in-flight bytes released", func() bool { return h.srv.Stats().InFlightBytes == 0 })
}

// TestDeferredAnswer: a handler that defers answers later from another
// goroutine; the reply carries the request's uid and type and the deferred
// result, and a second answer sends nothing.
func TestDeferredAnswer(t *testing.T) {
	h := start(t, rpc.Options{})
	answers := make(chan func(any, error), 1)
	h.srv.Handle(protocol.QueryPrefetchStatus, func(_ context.Context, req *rpc.Request) (any, error) {
		answers <- req.Defer().Answer
		return "ignored", nil
	})
	d := rawDealer(t, h.srv.Endpoint())
	sendFrames(t, d, enc(t, 41), enc(t, 6), enc(t, "req"))
	answer := <-answers
	_ = d.SetRcvtimeo(200 * time.Millisecond)
	if msg, err := d.RecvMessageBytes(0); err == nil {
		t.Fatalf("a deferred request was answered before its answer: %x", msg)
	}
	go answer(int64(3), nil)
	_ = d.SetRcvtimeo(5 * time.Second)
	msg, err := d.RecvMessageBytes(0)
	if err != nil {
		t.Fatalf("no deferred reply: %v", err)
	}
	if len(msg) != 3 || string(msg[0]) != string(enc(t, 41)) || string(msg[1]) != string(enc(t, 6)) || string(msg[2]) != string(enc(t, int64(3))) {
		t.Fatalf("deferred reply %x", msg)
	}
	answer(int64(4), nil)
	_ = d.SetRcvtimeo(200 * time.Millisecond)
	if msg, err := d.RecvMessageBytes(0); err == nil {
		t.Fatalf("a second answer was sent: %x", msg)
	}
}

// TestFastSharedRunsOnSocketGoroutine: a shared request named in FastShared
// with a small payload is answered by the socket goroutine itself (a NOOP
// from another peer waits behind it), one over FastSharedBytes goes to a
// shared worker (the NOOP is answered meanwhile).
func TestFastSharedRunsOnSocketGoroutine(t *testing.T) {
	h := start(t, rpc.Options{FastShared: []string{protocol.QueryPrefetchStatus}, FastSharedBytes: 64})
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	h.srv.Handle(protocol.QueryPrefetchStatus, func(context.Context, *rpc.Request) (any, error) {
		entered <- struct{}{}
		<-release
		return int64(1), nil
	})
	c := dial(t, h)
	for _, tc := range []struct {
		id     string
		inline bool
	}{{"small", true}, {strings.Repeat("x", 100), false}} {
		d := rawDealer(t, h.srv.Endpoint())
		sendFrames(t, d, enc(t, 1), enc(t, 6), enc(t, tc.id))
		<-entered
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, err := c.Call(ctx, protocol.Noop)
		cancel()
		if tc.inline && err == nil {
			t.Errorf("%d-byte status: NOOP answered while it ran, so it ran on a worker", len(tc.id))
		}
		if !tc.inline && err != nil {
			t.Errorf("%d-byte status: NOOP not answered while it ran on a worker: %v", len(tc.id), err)
		}
		release <- struct{}{}
		if _, err := d.RecvMessageBytes(0); err != nil {
			t.Fatalf("status not answered: %v", err)
		}
		noopWithin(t, c, 5*time.Second)
	}
}

// TestReplyBuffer: a protocol.Raw written into a ReplyBuffer (shorter than
// the buffer) is sent as it is; a Raw elsewhere still goes out; a handler
// that fails after taking buffers (or takes several) answers nothing wrong
// and the server keeps serving.
func TestReplyBuffer(t *testing.T) {
	h := start(t, rpc.Options{MaxMessageBytes: 64 << 20})
	h.srv.Handle(protocol.CommitStore, func(_ context.Context, req *rpc.Request) (any, error) {
		data := req.Args[2].([]byte)
		switch req.Args[1].(int64) {
		case 1: // the reply in a buffer larger than it
			buf, err := req.ReplyBuffer(len(data) + 100)
			if err != nil {
				return nil, err
			}
			return protocol.Raw(append(buf, data...)), nil
		case 2: // two buffers, the reply in neither
			_, _ = req.ReplyBuffer(1 << 20)
			_, _ = req.ReplyBuffer(10)
			return protocol.Raw(append([]byte(nil), data...)), nil
		default: // a buffer, then an error
			_, _ = req.ReplyBuffer(4 << 20)
			return nil, errors.New("refused")
		}
	})
	d := rawDealer(t, h.srv.Endpoint())
	data := make([]byte, 3<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, mode := range []int64{1, 2} {
		k := protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: []uint32{1}, End: 1}
		sendFrames(t, d, enc(t, mode), enc(t, 12), enc(t, k), enc(t, mode), enc(t, data))
		msg, err := d.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("mode %d: no reply: %v", mode, err)
		}
		if len(msg) != 3 || !bytes.Equal(msg[2], data) {
			t.Fatalf("mode %d: reply of %d frames, result %d bytes, equal %v", mode, len(msg), len(msg[len(msg)-1]), bytes.Equal(msg[len(msg)-1], data))
		}
	}
	k := protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: []uint32{1}, End: 1}
	sendFrames(t, d, enc(t, 3), enc(t, 12), enc(t, k), enc(t, int64(3)), enc(t, data))
	poll.Until(t, statsLimit, "the failing handler counted", func() bool { return h.srv.Stats().BadInput[protocol.KindHandlerErr] == 1 })
	noopWithin(t, dial(t, h), 5*time.Second)
}
