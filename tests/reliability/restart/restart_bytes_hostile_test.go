package restart

import (
	"bytes"
	"context"
	"testing"

	"kvdock/core/protocol"
	"kvdock/tests/harness"
)

// TestHostileRestartKeepsSaltAndModelBytes (real binary, SIGUSR2): the
// restart record keeps the peers' strings byte for byte. Prompts stored
// under the cache_salts ff fe and fe ff (which a JSON text record would
// both turn into "\ufffd\ufffd") each read their own bytes after the
// restart, a reader under "\ufffd\ufffd" misses, and a worker registered
// under a model name with an invalid byte stores and reads on under its
// registration.
func TestHostileRestartKeepsSaltAndModelBytes(t *testing.T) {
	srv, w, sched := keptWorker(t, 710, "rec-\xffmodel")
	ctx := context.Background()
	const n = 2
	toks := harness.Tokens(71, n, w.Chunk)
	salted := func(salt, req string) protocol.Key {
		k := w.Key(toks, n, req)
		k.CacheSalt = salt
		return k
	}
	salts := []string{"\xff\xfe", "\xfe\xff"}
	want := map[string][][]byte{}
	for i, salt := range salts {
		data := [][]byte{harness.ChunkData(710+i, 0, w.ChunkBytes), harness.ChunkData(710+i, 1, w.ChunkBytes)}
		res, err := w.Worker().Store(ctx, salted(salt, "store"), data)
		if err != nil || !res.Committed {
			t.Fatalf("store under salt %q: %+v %v", salt, res, err)
		}
		want[salt] = data
	}
	hits := func(salt, req string) int {
		k := protocol.Key{ModelName: w.Model, WorldSize: 1, TokenIDs: toks, Start: 0, End: len(toks), RequestID: req, CacheSalt: salt}
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
		if _, err := w.Worker().Retrieve(ctx, salted(salt, req), func(c int, chunk []byte) {
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
	toks2 := harness.Tokens(72, 1, w.Chunk)
	data := [][]byte{harness.ChunkData(72, 0, w.ChunkBytes)}
	if r, err := w.Store(ctx, toks2, data, "again"); err != nil || r != "true" {
		t.Fatalf("store by the restored worker: %q %v", r, err)
	}
	got, err := w.Retrieve(ctx, toks2, 1, "again-read")
	if err != nil || len(got) != 1 || !bytes.Equal(got[0], data[0]) {
		t.Fatalf("retrieve by the restored worker: %d chunks, %v", len(got), err)
	}
}
