package reliability

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"kvdock/core/rpc/client"
	"kvdock/tests/harness"
	"kvdock/tests/harness/attackkit"
	"kvdock/transfer/worker"
)

// layoutProfiles is every protocol table a worker may speak.
var layoutProfiles = []string{"nongpu-v1", "nongpu-v2", "engine-driven", "engine-driven-v2", "engine-driven-v2-early", "rpc-messages"}

// registerDtype registers instance id of model on c with dtype, in SHM
// when the server advertises a segment.
func registerDtype(t *testing.T, c *client.Client, id int64, model, dtype string) *harness.GoWorker {
	t.Helper()
	wk, err := worker.Register(context.Background(), c, worker.Config{
		InstanceID: id, Model: model, Layers: harness.WorkerLayers, Hidden: harness.WorkerHidden, Dtype: dtype,
	})
	if err != nil {
		t.Fatalf("register instance %d (%s): %v", id, dtype, err)
	}
	w := &harness.GoWorker{W: wk, C: c, ID: id, Model: model, Chunk: wk.ChunkTokens(),
		ChunkBytes: int(wk.Layout().Bytes), Shm: wk.Segment(), SegName: wk.ShmName(), PoolSize: wk.PoolSize()}
	t.Cleanup(w.Close)
	return w
}

// TestHostileRegisterVictimsModelFirst: in every profile, a peer registers
// the victim's model first with another layout of the same chunk size
// (bfloat16 for the victim's float16, so a chunk of one would fit the
// other's slots unnoticed) and stores the victim's prompt with its own
// bytes. The victim registers all the same (answered, not left to its
// timeout), stores the prompt (slots of its own: the squatter's chunks are
// not its), and each worker retrieves the prompt with its own bytes; a
// prompt only the squatter stored is a miss for the victim, never the
// squatter's bytes.
func TestHostileRegisterVictimsModelFirst(t *testing.T) {
	for i, profile := range layoutProfiles {
		t.Run(profile, func(t *testing.T) {
			srv := harness.Start(t, "--protocol", profile, "--chunk-size", "16")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			model := "victim-" + profile
			base := int64(800 + 10*i)
			sq := registerDtype(t, srv.Dial(t, profile), base, model, "bfloat16")
			if sq.Shm == nil {
				t.Fatal("the server advertises no segment")
			}
			const n = 3
			toks := harness.Tokens(int(base), n, sq.Chunk)
			only := harness.Tokens(int(base)+1, n, sq.Chunk) // stored by the squatter alone
			data := func(seed int) [][]byte {
				out := make([][]byte, n)
				for c := range out {
					out[c] = harness.ChunkData(seed, c, sq.ChunkBytes)
				}
				return out
			}
			sqData, viData := data(1), data(2)
			if res, err := sq.Store(ctx, toks, sqData, "sq-store"); err != nil || res != "true" {
				t.Fatalf("the squatter's store: %s, %v", res, err)
			}
			if res, err := sq.Store(ctx, only, data(3), "sq-only"); err != nil || res != "true" {
				t.Fatalf("the squatter's second store: %s, %v", res, err)
			}

			vc, err := client.Dial(srv.Endpoint, harness.Profile(t, profile), client.Options{Timeout: 3 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer vc.Close()
			vi := registerDtype(t, vc, base+1, model, "float16")
			if vi.ChunkBytes != sq.ChunkBytes {
				t.Fatalf("chunk bytes %d and %d: the layouts must be the same size", vi.ChunkBytes, sq.ChunkBytes)
			}
			if got, err := vi.Retrieve(ctx, only, n, "vi-only"); err != nil || got != nil {
				t.Fatalf("the victim's retrieve of a prompt only the squatter stored: %d chunks, %v", len(got), err)
			}
			if res, err := vi.Store(ctx, toks, viData, "vi-store"); err != nil || res != "true" {
				t.Fatalf("the victim's store after the squatter's: %s, %v", res, err)
			}
			foreign := 0
			for _, w := range []struct {
				g    *harness.GoWorker
				want [][]byte
			}{{vi, viData}, {sq, sqData}} {
				got, err := w.g.Retrieve(ctx, toks, n, fmt.Sprintf("read-%d", w.g.ID))
				if err != nil || len(got) != n {
					t.Fatalf("instance %d retrieve: %d chunks, %v", w.g.ID, len(got), err)
				}
				for c := range got {
					if !bytes.Equal(got[c], w.want[c]) {
						foreign++
						t.Errorf("instance %d chunk %d: not its own bytes", w.g.ID, c)
					}
				}
			}
			if foreign > 0 {
				t.Fatalf("%d foreign chunks", foreign)
			}
			if n := transferCounters(t, srv)["layout_conflicts"]; n != 0 {
				t.Errorf("layout_conflicts = %v, want 0", n)
			}
			attackkit.Alive(t, srv, time.Second, "two layouts of one model")
		})
	}
}
