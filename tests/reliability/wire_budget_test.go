package reliability

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"kvdock/core/protocol"
	"kvdock/core/testkit/poll"
	"kvdock/tests/harness"
)

// TestSlowReaderRetrievesBoundedRSS against the real
// binary (SHM off): a peer sends 40 PREPARE_RETRIEVEs of an 8 MiB sequence
// and never reads a reply. libzmq alone would queue them all (SNDHWM counts
// messages, not bytes); what is kept for that peer is bounded by
// --queued-reply-bytes-per-peer (twice: held by libzmq, waiting in kvdock;
// the bound allows as much again for the encoded replies Go has yet to collect),
// the rest is dropped, and another worker is answered meanwhile.
func TestSlowReaderRetrievesBoundedRSS(t *testing.T) {
	const n, budget = 40, 16 << 20
	srv := harness.Start(t, "--shm-name", "", "--queued-reply-bytes-per-peer", "16777216")
	c := srv.Dial(t, srv.Protocol)
	w := newWorker(t, c, 1, "slow", true)
	ctx := context.Background()
	chunks := (8 << 20) / w.chunkBytes
	toks := tokensFor(11, chunks, w.chunk)
	data := make([][]byte, chunks)
	for i := range data {
		data[i] = chunkData(11, i, w.chunkBytes)
	}
	if res, err := w.store(ctx, toks, data, "s"); err != nil || res != "true" {
		t.Fatalf("store: %s %v", res, err)
	}
	// One normal retrieve: the reply carries the 8 MiB pickle.
	if got, err := w.retrieve(ctx, toks, chunks, "r0"); err != nil || len(got) != chunks {
		t.Fatalf("retrieve: %d chunks, %v", len(got), err)
	}

	d, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_ = d.SetLinger(0)
	_ = d.SetRcvhwm(1)
	_ = d.SetRcvbuf(64 << 10)
	if err := d.Connect(srv.Endpoint); err != nil {
		t.Fatal(err)
	}
	spec, _ := harness.Profile(t, srv.Protocol).ByName(protocol.PrepareRetrieve)
	typ, _ := protocol.Encode(spec.Number)
	key, _ := protocol.Encode(w.key(toks, chunks, "slow"))
	id, _ := protocol.Encode(w.id)
	// PREPARE_RETRIEVE serves keys a LOOKUP read-locked: one lock each.
	for i := range n {
		if hits, err := lookupKeep(ctx, c, w.model, toks, fmt.Sprintf("lk%d", i)); err != nil || hits != chunks {
			t.Fatalf("lookup %d: %d hits, %v", i, hits, err)
		}
	}
	before := status(t, srv).Requests.ByType[protocol.PrepareRetrieve].OK
	base := procKiB(t, srv.PID(), "VmRSS")
	// VmHWM already holds the store's peak: sample VmRSS during the attack.
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
				if v := procKiB(t, srv.PID(), "VmRSS"); v > peak.Load() {
					peak.Store(v)
				}
			}
		}
	}()
	for i := range n {
		uid, _ := protocol.Encode(1000 + i)
		if _, err := d.SendMessage(uid, typ, key, id); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, 30*time.Second, "the retrieves handled", func() bool {
		return status(t, srv).Requests.ByType[protocol.PrepareRetrieve].OK >= before+n
	})

	if r, err := c.Call(ctx, protocol.Noop); err != nil || !r.Present {
		t.Fatalf("another worker not answered: %v", err)
	}
	// Read the peak once it has stopped rising (libzmq writes what the
	// connection takes in the background): 300 ms without a new peak.
	for last, quiet := peak.Load(), time.Now(); time.Since(quiet) < 300*time.Millisecond; {
		if p := peak.Load(); p != last {
			last, quiet = p, time.Now()
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	<-sampled
	growth := peak.Load() - base
	t.Logf("%d unread retrieves of %d MiB: RSS %d -> peak %d KiB (+%d MiB)", n, chunks*w.chunkBytes>>20, base, peak.Load(), growth>>10)
	if growth > 8*budget>>10 {
		t.Fatalf("peak RSS grew %d MiB for %d MiB of unread replies; bound %d MiB", growth>>10,
			n*chunks*w.chunkBytes>>20, 8*budget>>20)
	}
	// The store is intact and served to a reading worker.
	if got, err := w.retrieve(ctx, toks, chunks, "r1"); err != nil || len(got) != chunks || sum(got[0]) != sum(data[0]) {
		t.Fatalf("retrieve after the attack: %d chunks, %v", len(got), err)
	}
}
