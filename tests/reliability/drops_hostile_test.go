package reliability

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/core/testkit/poll"
	"kvdock/tests/harness"
	"kvdock/tests/harness/attackkit"
)

// Dropping a worker's instance while it copies (the same bug as a clear
// during a transfer, through the other drop paths): every way of dropping it
// must leave its slots to it until its lock's TTL, so no other worker is
// given those bytes and its late copy lands nowhere that is served.

// dropInstance drops worker w's instance by one of the drop paths. The ZMQ
// UNREGISTER comes from w's own connection (a worker shutting down while
// another of its threads copies): from another peer it is refused while w
// is alive.
func dropInstance(t *testing.T, srv *harness.Server, how string, w *harness.GoWorker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	id, model := w.ID, w.Model
	switch how {
	case "register id reuse":
		// Another peer registers the same id (a new worker reusing a PID).
		other := srv.Dial(t, srv.Protocol)
		if _, err := harness.RegisterWorker(other, id, model, false); err != nil {
			t.Logf("re-registration of %d from another peer: %v", id, err)
		}
	case "zmq unregister":
		name := protocol.UnregisterKVCacheNonGPUContext
		if _, ok := harness.Profile(t, srv.Protocol).ByName(name); !ok {
			name = protocol.UnregisterKVCache
		}
		if _, err := w.C.Call(ctx, name, id); err != nil {
			t.Logf("UNREGISTER of %d: %v", id, err)
		}
		// The limit only bounds a failure (a loaded machine, /status polls).
		poll.Until(t, 15*time.Second, fmt.Sprintf("instance %d unregistered", id), func() bool {
			for _, c := range srv.Status(t).Contexts {
				if c.InstanceID == id {
					return false
				}
			}
			return true
		})

	case "http unregister":
		postUnregister(t, srv, id)
	case "reaper":
		poll.Until(t, 20*time.Second, fmt.Sprintf("instance %d reaped", id), func() bool {
			for _, c := range srv.Status(t).Contexts {
				if c.InstanceID == id {
					return c.State == "reaped"
				}
			}
			return false
		})

	default:
		t.Fatalf("unknown drop path %q", how)
	}
}

// postUnregister removes instance id on the operator's word.
func postUnregister(t testing.TB, srv *harness.Server, id int64) {
	t.Helper()
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/unregister?instance_id=%d", srv.HTTPPort, id), "application/json", nil)
	if err != nil {
		t.Fatalf("POST /unregister: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /unregister: %s", resp.Status)
	}
}

var dropPaths = []string{"register id reuse", "zmq unregister", "http unregister", "reaper"}

// startForDrop starts a server on which the drop path can happen: the
// reaper needs a table whose PING names the instance.
func startForDrop(t *testing.T, how string) *harness.Server {
	if how == "reaper" {
		return attackkit.StartAttacked(t, "--protocol", "engine-driven",
			"--worker-reap-timeout-seconds", "1", "--worker-registration-grace-seconds", "1")
	}
	return attackkit.StartAttacked(t)
}

// TestHostileDropDuringStore: A reserves slots and starts copying; A's
// instance is dropped; C stores; A's late copy lands. C's chunks must read
// back as C's bytes, and C must not have been given A's slots.
func TestHostileDropDuringStore(t *testing.T) {
	for i, how := range dropPaths {
		t.Run(how, func(t *testing.T) {
			srv := startForDrop(t, how)
			ctx := context.Background()
			base := int64(20_000 + 100*i)
			a := harness.NewWorker(t, srv.Dial(t, srv.Protocol), base+1, "drop-store", false)
			if a.Shm == nil {
				t.Fatal("the server advertises no segment")
			}
			attackkit.PostClear(t, srv) // an empty pool: A gets the allocator's first slots
			ta, da := harness.Tokens(int(base)+1, 2, a.Chunk), attackkit.SeqData(int(base)+1, 2, a.ChunkBytes)
			psA, err := attackkit.PrepareStore(ctx, a, ta, 2, "drop-a")
			if err != nil || len(psA.Context.Slots) != 2 {
				t.Fatalf("A prepare: %d slots, %v", len(psA.Context.Slots), err)
			}
			half := psA
			half.Context.Slots, half.Context.ChunkIndices = psA.Context.Slots[:1], psA.Context.ChunkIndices[:1]
			if err := attackkit.WriteSlots(a, half, da); err != nil {
				t.Fatal(err) // half of A's copy is done when it is dropped
			}
			dropInstance(t, srv, how, a)

			c := harness.NewWorker(t, srv.Dial(t, srv.Protocol), base+2, "drop-store", false)
			tc, dc := harness.Tokens(int(base)+2, 2, c.Chunk), attackkit.SeqData(int(base)+2, 2, c.ChunkBytes)
			psC, err := attackkit.PrepareStore(ctx, c, tc, 2, "drop-c")
			if err != nil || len(psC.Context.Slots) != 2 {
				t.Fatalf("C prepare: %d slots, %v", len(psC.Context.Slots), err)
			}
			overlap := 0
			for _, x := range psA.Context.Slots {
				for _, y := range psC.Context.Slots {
					if x.Offset < y.Offset+y.Length && y.Offset < x.Offset+x.Length {
						overlap++
					}
				}
			}
			if err := attackkit.WriteSlots(c, psC, dc); err != nil {
				t.Fatal(err)
			}
			if err := attackkit.WriteSlots(a, psA, da); err != nil { // A's copy goes on, late
				t.Fatal(err)
			}
			okC, errC := attackkit.CommitStore(ctx, c, tc, 2, "drop-c", []byte{})
			t.Logf("%s during a store: C given %d of A's slots; C commit %v (%v)", how, overlap, okC, errC)
			if overlap > 0 {
				t.Errorf("after A was dropped (%s), C was given %d slots A was still copying into", how, overlap)
			}
			if !okC || errC != nil {
				t.Fatalf("C's commit: %v %v", okC, errC)
			}
			attackkit.ReadBack(t, c, tc, dc, "drop-rc")
			attackkit.Alive(t, srv, time.Second, how+" during a store")
		})
	}
}

// TestHostileDropDuringRetrieve: R holds read slots of X and copies out of
// them; R's instance is dropped; W then fills the pool with other chunks.
// R's slots must still hold X's bytes.
func TestHostileDropDuringRetrieve(t *testing.T) {
	for i, how := range dropPaths {
		t.Run(how, func(t *testing.T) {
			srv := startForDrop(t, how)
			ctx := context.Background()
			base := int64(30_000 + 100*i)
			w := harness.NewWorker(t, srv.Dial(t, srv.Protocol), base+1, "drop-read", false)
			r := harness.NewWorker(t, srv.Dial(t, srv.Protocol), base+2, "drop-read", false)
			if r.Shm == nil {
				t.Fatal("the server advertises no segment")
			}
			tx, dx := harness.Tokens(int(base)+1, 2, w.Chunk), attackkit.SeqData(int(base)+1, 2, w.ChunkBytes)
			if res, err := w.Store(ctx, tx, dx, "drop-sx"); err != nil || res != "true" {
				t.Fatalf("store X: %q %v", res, err)
			}
			if n, err := harness.LookupKeep(ctx, r.C, r.Model, tx, "drop-rx"); err != nil || n != 2 {
				t.Fatalf("lookup X: %d %v", n, err)
			}
			rep, err := r.C.Call(ctx, protocol.PrepareRetrieve, r.Key(tx, 2, "drop-rx"), r.ID)
			var pr harness.PrepRetrieve
			if err == nil {
				err = rep.Decode(&pr)
			}
			if err != nil || !pr.Success || len(pr.Context.Slots) != 2 {
				t.Fatalf("prepare retrieve X: %+v %v", pr.Success, err)
			}
			// The scheduler is done with the lookup: only R's hold keeps X.
			_, _ = r.C.Call(ctx, protocol.EndSession, "drop-rx")
			dropInstance(t, srv, how, r)
			if how == "register id reuse" || how == "reaper" {
				// W is silent while the reaper runs; it comes back as a new worker.
				w = harness.NewWorker(t, srv.Dial(t, srv.Protocol), base+3, "drop-read", false)
			}
			// Fill the pool past its size with other chunks: everything
			// evictable is evicted.
			chunks := int(w.PoolSize) / w.ChunkBytes
			stored := 0
			for s := 0; stored < chunks+chunks/4; s++ {
				ts, ds := harness.Tokens(int(base)+10+s, 16, w.Chunk), attackkit.SeqData(int(base)+10+s, 16, w.ChunkBytes)
				if _, err := w.Store(ctx, ts, ds, fmt.Sprintf("drop-fill-%d", s)); err != nil {
					t.Fatalf("fill store %d: %v", s, err)
				}
				stored += 16
			}
			bad := 0
			for n, s := range pr.Context.Slots {
				if !bytes.Equal(r.Shm[s.Offset:s.Offset+s.Length], dx[n]) {
					bad++
				}
			}
			t.Logf("%s during a retrieve: %d chunks stored after the drop; %d of 2 read chunks changed under the reader", how, stored, bad)
			if bad > 0 {
				t.Errorf("a reader dropped (%s) while holding X's slots read other bytes (%d of 2 chunks)", how, bad)
			}
			attackkit.Alive(t, srv, time.Second, how+" during a retrieve")
		})
	}
}
