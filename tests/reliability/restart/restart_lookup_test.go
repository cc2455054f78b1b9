package restart

import (
	"context"
	"testing"

	"kvdock/core/protocol"
	"kvdock/tests/harness"
	"kvdock/transfer/worker"
)

// keptWorker starts a kvdock that keeps its pool across restarts (16-token
// chunks) with a Go worker registered as id of model (SHM) and a scheduler
// on a connection of its own.
func keptWorker(t *testing.T, id int64, model string) (*harness.Server, *harness.GoWorker, worker.Scheduler) {
	t.Helper()
	srv := harness.StartKeeping(t, false, "--chunk-size", "16")
	return srv, harness.NewWorker(t, srv.Dial(t, "nongpu-v1"), id, model, false), srv.Scheduler(t)
}

// TestRestartAnswersALookupOfThePreviousProcess: a scheduler's LOOKUP is
// answered by the old process, the restart comes before its
// QUERY_PREFETCH_STATUS, and the new process answers the query with the
// hits the old one found; the worker then retrieves those chunks under the
// same request id, byte-identical, through the read locks the kept pool
// carried. (A process that knows no such request answers 0, as upstream
// does for an unknown one, and the prompt is computed again.)
func TestRestartAnswersALookupOfThePreviousProcess(t *testing.T) {
	srv, w, sched := keptWorker(t, 700, "restart-lookup")
	ctx := context.Background()
	const seq, n = 5, 3
	toks := harness.Tokens(seq, n, w.Chunk)
	data := make([][]byte, n)
	for c := range data {
		data[c] = harness.ChunkData(seq, c, w.ChunkBytes)
	}
	if r, err := w.Store(ctx, toks, data, "store"); err != nil || r != "true" {
		t.Fatalf("store: %q %v", r, err)
	}
	k := protocol.Key{ModelName: w.Model, WorldSize: 1, TokenIDs: toks, Start: 0, End: len(toks), RequestID: "across"}
	if err := sched.Lookup(ctx, k, 1); err != nil {
		t.Fatal(err)
	}
	// No tier: the job is done when LOOKUP is answered, before the restart.
	took := srv.RestartSignal(t)
	rs := srv.LastRestart(t)
	if !rs.Adopted || rs.AdoptedLookups != 1 {
		t.Fatalf("restart: %+v, want the pool adopted with 1 answered lookup", rs)
	}
	hits, done, err := sched.PrefetchStatus(ctx, k.RequestID)
	if err != nil || !done || hits != n {
		t.Fatalf("QUERY_PREFETCH_STATUS after the restart (%v): %d %v %v; want the %d hits the old process found", took, hits, done, err, n)
	}
	got := 0
	if _, err := w.Worker().Retrieve(ctx, w.Key(toks, n, k.RequestID), func(c int, chunk []byte) {
		if harness.Sum(chunk) != harness.Sum(data[c]) {
			t.Errorf("chunk %d differs after the restart", c)
		}
		got++
	}); err != nil || got != n {
		t.Fatalf("retrieve after the restart: %d chunks, %v", got, err)
	}
	if _, err := sched.C.Call(ctx, protocol.EndSession, k.RequestID); err != nil {
		t.Fatal(err)
	}
}
