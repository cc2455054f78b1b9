package reliability

import (
	"bytes"
	"context"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/tests/harness"
	"kvdock/transfer/worker"
)

// TestHostileRestartKeepsSaltAndModelBytes (real binary, SIGUSR2): the
// restart record keeps the peers' strings byte for byte. Prompts stored
// under the cache_salts ff fe and fe ff (which a JSON text record would
// both turn into "\ufffd\ufffd") each read their own bytes after the
// restart, a reader under "\ufffd\ufffd" misses, and a worker registered
// under a model name with an invalid byte stores and reads on under its
// registration.
func TestHostileRestartKeepsSaltAndModelBytes(t *testing.T) {
	srv := harness.StartKeeping(t, false, "--chunk-size", "16")
	dial := func() *client.Client {
		c, err := client.Dial(srv.Endpoint, harness.Profile(t, "nongpu-v1"), client.Options{Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	ctx := context.Background()
	w := newWorker(t, dial(), 710, "rec-\xffmodel", false)
	sched := worker.Scheduler{C: dial(), Poll: 2 * time.Millisecond}
	const n = 2
	toks := tokensFor(71, n, w.chunk)
	salted := func(salt, req string) protocol.Key {
		k := w.key(toks, n, req)
		k.CacheSalt = salt
		return k
	}
	salts := []string{"\xff\xfe", "\xfe\xff"}
	want := map[string][][]byte{}
	for i, salt := range salts {
		data := [][]byte{chunkData(710+i, 0, w.chunkBytes), chunkData(710+i, 1, w.chunkBytes)}
		res, err := w.wk().Store(ctx, salted(salt, "store"), data)
		if err != nil || !res.Committed {
			t.Fatalf("store under salt %q: %+v %v", salt, res, err)
		}
		want[salt] = data
	}
	hits := func(salt, req string) int {
		k := protocol.Key{ModelName: w.model, WorldSize: 1, TokenIDs: toks, Start: 0, End: len(toks), RequestID: req, CacheSalt: salt}
		h, err := sched.Hits(ctx, k, 1)
		if err != nil {
			t.Fatalf("lookup under salt %q: %v", salt, err)
		}
		return h
	}
	srv.RestartSignal(t)
	if rs := srv.LastRestart(t); !rs.Adopted || rs.AdoptedObjects != 2*n || rs.AdoptedContexts != 1 {
		t.Fatalf("restart: %+v; want both salts' %d chunks and the worker's registration adopted", rs, 2*n)
	}
	for i, salt := range salts {
		req := "read-" + string(rune('a'+i))
		if h := hits(salt, req); h != n {
			t.Fatalf("salt %q: %d of %d chunks hit after the restart", salt, h, n)
		}
		got := 0
		if _, err := w.wk().Retrieve(ctx, salted(salt, req), func(c int, chunk []byte) {
			if !bytes.Equal(chunk, want[salt][c]) {
				t.Errorf("salt %q chunk %d: another prompt's bytes after the restart", salt, c)
			}
			got++
		}); err != nil || got != n {
			t.Fatalf("retrieve under salt %q: %d chunks, %v", salt, got, err)
		}
		if _, err := sched.C.Call(ctx, protocol.EndSession, req); err != nil {
			t.Fatal(err)
		}
	}
	for _, salt := range []string{"\ufffd\ufffd", "\xff\xff"} {
		if h := hits(salt, "other"); h != 0 {
			t.Fatalf("a reader under salt %q hits %d chunks stored under other salts", salt, h)
		}
	}
	// The worker registered under the model name with an invalid byte is
	// still known: it stores and reads a new prompt.
	toks2 := tokensFor(72, 1, w.chunk)
	data := [][]byte{chunkData(72, 0, w.chunkBytes)}
	if r, err := w.store(ctx, toks2, data, "again"); err != nil || r != "true" {
		t.Fatalf("store by the restored worker: %q %v", r, err)
	}
	got, err := w.retrieve(ctx, toks2, 1, "again-read")
	if err != nil || len(got) != 1 || !bytes.Equal(got[0], data[0]) {
		t.Fatalf("retrieve by the restored worker: %d chunks, %v", len(got), err)
	}
}
