package nongpu

import (
	"bytes"
	"context"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"kvdock/core/protocol"
	"kvdock/core/testkit/profiles"
	"kvdock/transfer/torchpickle"
)

// TestWireUnreadRetrieveStallsOthersOnlyUntilLapse: a hostile pickle worker
// asks for retrieves and never reads the replies (a DEALER with a receive
// HWM of one message and a tiny kernel buffer, so its second 16 MiB reply
// stays in the server's libzmq). With the in-flight pickle budget at one
// reply, another worker's retrieve waits for that reply's ticket, which
// lapses: it is answered, with the right bytes, after the lapse.
func TestWireUnreadRetrieveStallsOthersOnlyUntilLapse(t *testing.T) {
	e := newEnv(t, false, 64<<20)
	big := func(id int64) protocol.RegisterPayload {
		p := payload(id)
		p.NumLayers, p.HiddenDimSize = 32, 8192 // [2, 32, 16, 8192] float16: 16 MiB a chunk
		return p
	}
	const chunk = 2 * 32 * testChunk * 8192 * 2
	for _, id := range []int64{1, 2} {
		if _, err := e.mod.RegisterThrough(big(id), nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	k := key(tokens(testChunk, 9), 0, testChunk)
	stored := torchpickle.Tensor{Dtype: "float16", Shape: []int{2, 32, testChunk, 8192}, Data: make([]byte, chunk)}
	fill(stored.Data, 5)
	if _, err := e.mod.PrepareStore(k, 1); err != nil {
		t.Fatal(err)
	}
	if ok, err := e.mod.CommitStore(k, 1, pickled(t, stored)); !ok || err != nil {
		t.Fatalf("commit = %v, %v", ok, err)
	}
	e.mod.SetMaxInflightPickle(chunk + retrieveReplySlack) // one reply
	// Long enough that the hostile's second retrieve (a 16 MiB reply) is
	// granted before its first ticket lapses on a loaded 2-core machine.
	const lapse = 4 * time.Second
	e.mod.gate.mu.Lock()
	e.mod.gate.ttl = lapse
	e.mod.gate.mu.Unlock()
	endpoint, dial := serveWireAt(t, e.mod)
	good := dial()

	// The hostile worker: two retrieves, never read.
	prof := profiles.Load(t, "nongpu-v1")
	spec, ok := prof.ByName(protocol.PrepareRetrieve)
	if !ok {
		t.Fatal("no PREPARE_RETRIEVE in the profile")
	}
	hostile, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	defer hostile.Close()
	_ = hostile.SetLinger(0)
	_ = hostile.SetRcvhwm(1)
	_ = hostile.SetRcvbuf(4096)
	if err := hostile.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	for uid := range 2 {
		e.lookupLock(k)
		frames := [][]byte{enc(t, uid), enc(t, spec.Number), enc(t, k), enc(t, int64(1))}
		if _, err := hostile.SendMessage(frames[0], frames[1], frames[2], frames[3]); err != nil {
			t.Fatal(err)
		}
	}
	// Wait until the second reply is answered and out: it cannot leave.
	deadline := time.Now().Add(20 * time.Second)
	for {
		reads, lapses, out := e.mod.gate.retrieveState(1)
		if reads == 2 && out > 0 && lapses == 0 {
			break
		}
		if time.Now().After(deadline) || lapses > 0 {
			t.Fatalf("hostile retrieves: %d granted, %d lapsed, %d bytes out", reads, lapses, out)
		}
		time.Sleep(time.Millisecond)
	}

	e.lookupLock(k)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	r, err := good.Call(ctx, protocol.PrepareRetrieve, k, int64(2))
	if err != nil {
		t.Fatalf("the good worker's retrieve: %v (after %v)", err, time.Since(start))
	}
	var resp struct {
		Success bool   `msgpack:"success"`
		Data    []byte `msgpack:"data"`
	}
	if err := r.Decode(&resp); err != nil || !resp.Success {
		t.Fatalf("good retrieve = %v, %v", resp.Success, err)
	}
	ts, err := torchpickle.Decode(resp.Data, torchpickle.Limits{})
	if err != nil || len(ts) != 1 || !bytes.Equal(ts[0].Data, stored.Data) {
		t.Fatalf("good retrieve: %d tensors, %v, or bytes differ", len(ts), err)
	}
	// The hostile's reply lapsed (the good one's may have too, on a slow
	// machine: it lapses if not read within the lapse).
	if _, lapses, _ := e.mod.gate.retrieveState(1); lapses < 1 {
		t.Errorf("%d lapses, want the hostile's unread reply's", lapses)
	}
}

func enc(t *testing.T, v any) []byte {
	t.Helper()
	b, err := protocol.Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
