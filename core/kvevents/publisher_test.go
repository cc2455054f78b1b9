package kvevents

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	gozmq "github.com/go-zeromq/zmq4"
)

// publishOne stores one chunk of model m and waits for its batch to be
// handed to the PUB socket.
func publishOne(t *testing.T, tr *Tracker, p *Publisher, m string, i byte) {
	t.Helper()
	before := p.Stats().Sent
	store(tr, m, 1, i, i)
	deadline := time.Now().Add(10 * time.Second)
	for p.Stats().Sent == before {
		if time.Now().After(deadline) {
			t.Fatal("batch not published")
		}
		time.Sleep(time.Millisecond) // polling a condition, bounded by the deadline
	}
}

// A replay ROUTER is outside input: requests that are not [identity, "",
// start_seq as 8 bytes] are counted and answered with nothing, and the
// ROUTER goes on answering the valid ones whole, end marker included.
func TestHostileReplayRequests(t *testing.T) {
	tr := New(Options{BlockSize: cs})
	p, err := Start(tr, PublisherOptions{Endpoint: "tcp://127.0.0.1:31040", ReplayEndpoint: "tcp://127.0.0.1:31041", Pod: "p"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := byte(1); i <= 3; i++ {
		publishOne(t, tr, p, "m", i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	d := gozmq.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial("tcp://127.0.0.1:31041"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][][]byte{
		{{}, {1, 2, 3, 4, 5, 6, 7}}, // a short seq
		{{}, make([]byte, 8), {1}},  // a frame too many
		{{1}, make([]byte, 8)},      // no empty delimiter
		{{}, make([]byte, 4096)},    // a long seq
		{make([]byte, 8)},           // no delimiter at all
	} {
		if err := d.Send(gozmq.NewMsgFrom(bad...)); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Send(gozmq.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, 1))); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for {
		msg, err := d.Recv()
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
		f := msg.Frames
		if len(f) != 4 || len(f[0]) != 0 || len(f[2]) != 8 {
			t.Fatalf("replay frames %q", f)
		}
		if len(f[1]) == 0 {
			break
		}
		if string(f[1]) != "kv@p@m" {
			t.Fatalf("topic %q", f[1])
		}
		seqs = append(seqs, binary.BigEndian.Uint64(f[2]))
	}
	if len(seqs) != 2 || seqs[0] != 1 || seqs[1] != 2 {
		t.Fatalf("replayed seqs %v, want [1 2]", seqs)
	}
	if s := p.Stats(); s.ReplayBad != 5 || s.ReplayRequests != 1 || s.ReplayBatches != 2 {
		t.Fatalf("stats %+v", s)
	}
}

// With Connect, the PUB connects to a SUB the router binds (llm-d's
// central mode), and the legacy replay format answers without topics.
func TestPublisherConnectsAndReplaysLegacy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	sub := gozmq.NewSub(ctx)
	defer sub.Close()
	if err := sub.Listen("tcp://127.0.0.1:31042"); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(gozmq.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	tr := New(Options{BlockSize: cs, Array: true})
	p, err := Start(tr, PublisherOptions{Endpoint: "tcp://127.0.0.1:31042", Connect: true,
		ReplayEndpoint: "tcp://127.0.0.1:31043", LegacyReplay: true, Pod: "p"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got := make(chan [][]byte, 1)
	go func() {
		msg, err := sub.Recv()
		if err == nil {
			got <- msg.Frames
		}
	}()
	// A PUB drops what it sends before the subscription reaches it: keep
	// publishing until the SUB has one.
	var f [][]byte
	for i := byte(1); f == nil; i++ {
		publishOne(t, tr, p, "m", i)
		select {
		case f = <-got:
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("the bound SUB got nothing")
		}
	}
	if len(f) != 3 || string(f[0]) != "kv@p@m" || len(f[1]) != 8 {
		t.Fatalf("frames %q", f)
	}
	d := gozmq.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial("tcp://127.0.0.1:31043"); err != nil {
		t.Fatal(err)
	}
	if err := d.Send(gozmq.NewMsgFrom([]byte{}, make([]byte, 8))); err != nil {
		t.Fatal(err)
	}
	for n := 0; ; n++ {
		msg, err := d.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(msg.Frames) != 3 || len(msg.Frames[0]) != 0 || len(msg.Frames[1]) != 8 {
			t.Fatalf("legacy replay frames %q", msg.Frames)
		}
		if binary.BigEndian.Uint64(msg.Frames[1]) == ^uint64(0) {
			if n == 0 || len(msg.Frames[2]) != 0 {
				t.Fatalf("end marker after %d batches: %q", n, msg.Frames)
			}
			break
		}
	}
}

// The replay ROUTER waits on its ZMQ_FD in Go's poller, a signal that
// fires on a change, not while a request waits: every request is answered
// whole whatever its timing, one at a time from idle, several queued
// before the ROUTER looks, from two peers interleaved, and none after
// Close.
func TestReplayAnswersEveryRequest(t *testing.T) {
	tr := New(Options{BlockSize: cs})
	p, err := Start(tr, PublisherOptions{Endpoint: "tcp://127.0.0.1:47154", ReplayEndpoint: "tcp://127.0.0.1:47155", Pod: "p"})
	if err != nil {
		t.Fatal(err)
	}
	for i := byte(1); i <= 3; i++ {
		publishOne(t, tr, p, "m", i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var ds []gozmq.Socket
	for range 2 {
		d := gozmq.NewDealer(ctx)
		defer d.Close()
		if err := d.Dial("tcp://127.0.0.1:47155"); err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	ask := func(d gozmq.Socket, start uint64) {
		t.Helper()
		if err := d.Send(gozmq.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, start))); err != nil {
			t.Fatal(err)
		}
	}
	// answered reads one answer: the batches from start, then the end marker.
	answered := func(d gozmq.Socket, start uint64) {
		t.Helper()
		for want := start; ; want++ {
			msg, err := d.Recv()
			if err != nil {
				t.Fatalf("replay from %d: %v", start, err)
			}
			f := msg.Frames
			if len(f) != 4 || len(f[2]) != 8 {
				t.Fatalf("replay frames %q", f)
			}
			if len(f[1]) == 0 {
				if want != 3 {
					t.Fatalf("replay from %d ended at %d", start, want)
				}
				return
			}
			if got := binary.BigEndian.Uint64(f[2]); got != want {
				t.Fatalf("replay from %d: seq %d, want %d", start, got, want)
			}
		}
	}
	for i := range 20 { // one at a time, the ROUTER idle before each
		ask(ds[i%2], uint64(i%3))
		answered(ds[i%2], uint64(i%3))
	}
	for i := range 10 { // queued before any is read
		ask(ds[i%2], uint64(i%3))
	}
	for i := range 10 {
		answered(ds[i%2], uint64(i%3))
	}
	if s := p.Stats(); s.ReplayRequests != 30 || s.ReplayBad != 0 {
		t.Fatalf("stats %+v", s)
	}
	p.Close()
	rctx, rcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer rcancel()
	late := gozmq.NewDealer(rctx)
	defer late.Close()
	if err := late.Dial("tcp://127.0.0.1:47155"); err == nil {
		if err := late.Send(gozmq.NewMsgFrom([]byte{}, make([]byte, 8))); err == nil {
			if msg, err := late.Recv(); err == nil {
				t.Fatalf("answered after Close: %q", msg.Frames)
			}
		}
	}
}
