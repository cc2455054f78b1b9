package reliability

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/tests/harness"
	"kvdock/tests/harness/attackkit"
)

// autoChurnPeers is one more than the 16,384 peers --protocol auto keeps
// undecided (and as many decided): enough to flush a single shared table.
const autoChurnPeers = 16500

// churnIdentities makes n new peers (routing ids name-0, name-1, …), each
// sending one message of type typ (no payload) on a fresh DEALER and
// waiting for its answer, so every one of them reached the server's
// detection before it returns.
func churnIdentities(t *testing.T, endpoint, name string, n int, typ func(i int) int64) (answered int64) {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	var next, got atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				s, err := zctx.NewSocket(zmq.DEALER)
				if err != nil {
					errs <- err
					return
				}
				_ = s.SetLinger(0)
				_ = s.SetRcvtimeo(5 * time.Second)
				_ = s.SetIdentity(fmt.Sprintf("%s-%d", name, i))
				if err := s.Connect(endpoint); err != nil {
					s.Close()
					errs <- err
					return
				}
				uid, _ := protocol.Encode(int64(1))
				tb, _ := protocol.Encode(typ(i))
				if _, err := s.SendMessage(uid, tb); err != nil {
					s.Close()
					errs <- err
					return
				}
				if _, err := s.RecvMessageBytes(0); err == nil {
					got.Add(1)
				}
				s.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("churn: %v", err)
	}
	return got.Load()
}

// TestHostileAutoChurnKeepsDecidedPeers: under
// --protocol auto a local peer cycling 16,500 identities, half of them
// settled at once (engine-driven-v2's GET_EXPERIMENTAL) and half left
// undecided (18: engine-driven GET_CHUNK_SIZE or nongpu-v2 PING), must not
// change how a worker already detected is served. The worker is nongpu-v1,
// between PREPARE_RETRIEVE and COMMIT_RETRIEVE: its COMMIT_RETRIEVE (14
// [key, instance_id]) is nongpu-v2's PREPARE_RETRIEVE, so a server that
// forgot it would answer a prepare_retrieve struct (and take a read lock)
// where the worker waits for a bool.
func TestHostileAutoChurnKeepsDecidedPeers(t *testing.T) {
	srv := attackkit.StartAttacked(t, "--protocol", "auto")
	w, err := client.Dial(srv.Endpoint, harness.Profile(t, "nongpu-v1"), client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx := context.Background()
	reg := protocol.RegisterPayload{InstanceID: 7, ModelName: "auto-hostile", WorldSize: 1, BlockSize: 16,
		NumLayers: 2, HiddenDimSize: 16, DtypeStr: "float32"}
	if _, err := w.Call(ctx, protocol.RegisterKVCacheNonGPUContext, reg); err != nil {
		t.Fatalf("register: %v", err)
	}
	tokens := make([]uint32, attackkit.AttackChunk)
	for i := range tokens {
		tokens[i] = uint32(i*7 + 3)
	}
	wid := 0
	key := protocol.Key{ModelName: "auto-hostile", WorldSize: 1, WorkerID: &wid, TokenIDs: tokens, End: attackkit.AttackChunk, RequestID: "w"}
	if _, err := w.Call(ctx, protocol.PrepareStore, key, int64(7)); err != nil {
		t.Fatalf("prepare store: %v\n%s", err, srv.Output())
	}
	var ok bool
	if r, err := w.Call(ctx, protocol.CommitStore, key, int64(7), []byte{}); err != nil || r.Decode(&ok) != nil || !ok {
		t.Fatalf("commit store: %+v %v", r, err)
	}
	r, err := w.Call(ctx, protocol.PrepareRetrieve, key, int64(7))
	if err != nil {
		t.Fatalf("prepare retrieve: %v", err)
	}
	if _, err := protocol.DecodePrepareRetrieveResponse(r.Raw, protocol.DefaultLimits()); err != nil {
		t.Fatalf("prepare retrieve answered %x: %v", r.Raw, err)
	}

	start := time.Now()
	answered := churnIdentities(t, srv.Endpoint, "churn", autoChurnPeers, func(i int) int64 {
		if i%2 == 0 {
			return 32
		}
		return 18
	})
	t.Logf("churn: %d identities in %v, %d answered", autoChurnPeers, time.Since(start).Round(time.Millisecond), answered)

	r, err = w.Call(ctx, protocol.CommitRetrieve, key, int64(7))
	if err != nil {
		t.Fatalf("COMMIT_RETRIEVE after the churn: %v", err)
	}
	if err := r.Decode(&ok); err != nil || !ok {
		t.Errorf("COMMIT_RETRIEVE after %d identities answered %x (%v), want true: the worker's table was forgotten",
			autoChurnPeers, r.Raw, err)
	}
	if n := attackkit.InFlight(t, srv); n != 0 {
		t.Errorf("%d requests in flight after the churn", n)
	}
	st := srv.Status(t)
	t.Logf("detections %v, settled by tie-break %d", st.ProtocolDetection.Detections, st.ProtocolDetection.Ambiguous)
	if r, err := w.Call(ctx, protocol.Noop); err != nil || !r.Present {
		t.Errorf("NOOP after the churn: %+v %v", r, err)
	}
}
