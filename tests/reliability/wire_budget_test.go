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
	"kvdock/tests/harness/attackkit"
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
	w := harness.NewWorker(t, c, 1, "slow", true)
	ctx := context.Background()
	chunks := (8 << 20) / w.ChunkBytes
	toks := harness.Tokens(11, chunks, w.Chunk)
	data := make([][]byte, chunks)
	for i := range data {
		data[i] = harness.ChunkData(11, i, w.ChunkBytes)
	}
	if res, err := w.Store(ctx, toks, data, "s"); err != nil || res != "true" {
		t.Fatalf("store: %s %v", res, err)
	}
	// One normal retrieve: the reply carries the 8 MiB pickle.
	if got, err := w.Retrieve(ctx, toks, chunks, "r0"); err != nil || len(got) != chunks {
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
	key, _ := protocol.Encode(w.Key(toks, chunks, "slow"))
	id, _ := protocol.Encode(w.ID)
	// PREPARE_RETRIEVE serves keys a LOOKUP read-locked: one lock each.
	for i := range n {
		if hits, err := harness.LookupKeep(ctx, c, w.Model, toks, fmt.Sprintf("lk%d", i)); err != nil || hits != chunks {
			t.Fatalf("lookup %d: %d hits, %v", i, hits, err)
		}
	}
	before := srv.Status(t).Requests.ByType[protocol.PrepareRetrieve].OK
	base := attackkit.ProcKiB(t, srv.PID(), "VmRSS")
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
				if v := attackkit.ProcKiB(t, srv.PID(), "VmRSS"); v > peak.Load() {
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
		return srv.Status(t).Requests.ByType[protocol.PrepareRetrieve].OK >= before+n
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
	t.Logf("%d unread retrieves of %d MiB: RSS %d -> peak %d KiB (+%d MiB)", n, chunks*w.ChunkBytes>>20, base, peak.Load(), growth>>10)
	if growth > 8*budget>>10 {
		t.Fatalf("peak RSS grew %d MiB for %d MiB of unread replies; bound %d MiB", growth>>10,
			n*chunks*w.ChunkBytes>>20, 8*budget>>20)
	}
	// The store is intact and served to a reading worker.
	if got, err := w.Retrieve(ctx, toks, chunks, "r1"); err != nil || len(got) != chunks || harness.Sum(got[0]) != harness.Sum(data[0]) {
		t.Fatalf("retrieve after the attack: %d chunks, %v", len(got), err)
	}
}
