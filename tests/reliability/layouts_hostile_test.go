package reliability

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"kvdock/core/rpc/client"
	"kvdock/tests/harness"
	"kvdock/transfer/worker"
)

// layoutProfiles is every protocol table a worker may speak.
var layoutProfiles = []string{"nongpu-v1", "nongpu-v2", "engine-driven", "engine-driven-v2", "engine-driven-v2-early", "rpc-messages"}

// registerDtype registers instance id of model on c with dtype, in SHM
// when the server advertises a segment.
func registerDtype(t *testing.T, c *client.Client, id int64, model, dtype string) *gworker {
	t.Helper()
	wk, err := worker.Register(context.Background(), c, worker.Config{
		InstanceID: id, Model: model, Layers: layers, Hidden: hidden, Dtype: dtype,
	})
	if err != nil {
		t.Fatalf("register instance %d (%s): %v", id, dtype, err)
	}
	w := &gworker{w: wk, c: c, id: id, model: model, chunk: wk.ChunkTokens(),
		chunkBytes: int(wk.Layout().Bytes), shm: wk.Segment(), segName: wk.ShmName(), poolSize: wk.PoolSize()}
	t.Cleanup(w.unmap)
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
			if sq.shm == nil {
				t.Fatal("the server advertises no segment")
			}
			const n = 3
			toks := tokensFor(int(base), n, sq.chunk)
			only := tokensFor(int(base)+1, n, sq.chunk) // stored by the squatter alone
			data := func(seed int) [][]byte {
				out := make([][]byte, n)
				for c := range out {
					out[c] = chunkData(seed, c, sq.chunkBytes)
				}
				return out
			}
			sqData, viData := data(1), data(2)
			if res, err := sq.store(ctx, toks, sqData, "sq-store"); err != nil || res != "true" {
				t.Fatalf("the squatter's store: %s, %v", res, err)
			}
			if res, err := sq.store(ctx, only, data(3), "sq-only"); err != nil || res != "true" {
				t.Fatalf("the squatter's second store: %s, %v", res, err)
			}

			vc, err := client.Dial(srv.Endpoint, harness.Profile(t, profile), client.Options{Timeout: 3 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer vc.Close()
			vi := registerDtype(t, vc, base+1, model, "float16")
			if vi.chunkBytes != sq.chunkBytes {
				t.Fatalf("chunk bytes %d and %d: the layouts must be the same size", vi.chunkBytes, sq.chunkBytes)
			}
			if got, err := vi.retrieve(ctx, only, n, "vi-only"); err != nil || got != nil {
				t.Fatalf("the victim's retrieve of a prompt only the squatter stored: %d chunks, %v", len(got), err)
			}
			if res, err := vi.store(ctx, toks, viData, "vi-store"); err != nil || res != "true" {
				t.Fatalf("the victim's store after the squatter's: %s, %v", res, err)
			}
			foreign := 0
			for _, w := range []struct {
				g    *gworker
				want [][]byte
			}{{vi, viData}, {sq, sqData}} {
				got, err := w.g.retrieve(ctx, toks, n, fmt.Sprintf("read-%d", w.g.id))
				if err != nil || len(got) != n {
					t.Fatalf("instance %d retrieve: %d chunks, %v", w.g.id, len(got), err)
				}
				for c := range got {
					if !bytes.Equal(got[c], w.want[c]) {
						foreign++
						t.Errorf("instance %d chunk %d: not its own bytes", w.g.id, c)
					}
				}
			}
			if foreign > 0 {
				t.Fatalf("%d foreign chunks", foreign)
			}
			if n := transferCounters(t, srv)["layout_conflicts"]; n != 0 {
				t.Errorf("layout_conflicts = %v, want 0", n)
			}
			alive(t, srv, time.Second, "two layouts of one model")
		})
	}
}
