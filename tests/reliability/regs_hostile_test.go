package reliability

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/tests/harness"
	"kvdock/tests/harness/attackkit"
)

// Registrations carried across a restart are held and charged as live
// ones: their holder peer, their protocol table, and the pickle workers'
// registrations whatever happens to the pool.

// registered reports whether /status lists instance id.
func registered(t testing.TB, srv *harness.Server, id int64) bool {
	t.Helper()
	return slices.Contains(srv.Status(t).RegisteredNonCudaInstanceIDs, id)
}

// unregisterFrom sends UNREGISTER_KV_CACHE of id from a peer of its own
// and waits until the server handled it.
func unregisterFrom(t testing.TB, srv *harness.Server, peer string, id int64) {
	t.Helper()
	p := dialNamed(t, srv, []byte(peer))
	defer p.close()
	before := attackkit.Handled(t, srv, protocol.UnregisterKVCache)
	p.send(t, protocol.UnregisterKVCache, id)
	if !attackkit.WaitHandled(t, srv, protocol.UnregisterKVCache, before+1, 10*time.Second, "UNREGISTER from "+peer) {
		t.Fatalf("UNREGISTER from %s not handled", peer)
	}
}

// autoWorker registers instance id of model as a nongpu-v1 worker under
// --protocol auto: the REGISTER first, since a v1 GET_CHUNK_SIZE from a
// peer that registered nothing reads as nongpu-v2's CLEAR too and goes
// unanswered; the worker's own REGISTER then keeps that registration.
func autoWorker(t *testing.T, c *client.Client, id int64, model string) *harness.GoWorker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Call(ctx, protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{InstanceID: id, ModelName: model,
		WorldSize: 1, BlockSize: 16, NumLayers: harness.WorkerLayers, HiddenDimSize: harness.WorkerHidden, DtypeStr: "float32"}); err != nil {
		t.Fatalf("register: %v", err)
	}
	return harness.NewWorker(t, c, id, model, false)
}

// TestHostileUnregisterOfARestoredInstance: after a restart (SIGUSR2, then
// SIGTERM + the same command line) a seed worker's registration is
// restored before its worker has spoken again. Another peer's UNREGISTER
// of its id is refused, as it is for a live registration; the worker then
// stores and reads back (its next request makes its new connection the
// holder), a squatter's UNREGISTER is refused again, and the worker's own
// UNREGISTER ends the registration.
func TestHostileUnregisterOfARestoredInstance(t *testing.T) {
	srv := harness.StartKeeping(t, false, "--chunk-size", "16")
	w := harness.NewWorker(t, srv.Dial(t, srv.Protocol), 710, "restored-holder", false)
	for i, restart := range []func(testing.TB) time.Duration{srv.RestartSignal, srv.RestartTerm} {
		seq := 710 + i
		toks, data := harness.Tokens(seq, 2, w.Chunk), attackkit.SeqData(seq, 2, w.ChunkBytes)
		restart(t)
		if rs := srv.LastRestart(t); !rs.Adopted || rs.AdoptedContexts != 1 {
			t.Fatalf("restart %d: %+v, want the pool and 1 registration adopted", i, rs)
		}
		unregisterFrom(t, srv, "squatter-restored", 710)
		if !registered(t, srv, 710) {
			t.Fatalf("restart %d: another peer's UNREGISTER ended the restored registration of instance 710 before its worker spoke", i)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, err := w.Store(ctx, toks, data, "after-restart")
		cancel()
		if err != nil || r != "true" {
			t.Fatalf("restart %d: the worker's store after another peer's UNREGISTER: %q, %v", i, r, err)
		}
		attackkit.ReadBack(t, w, toks, data, "after-restart-r")
		unregisterFrom(t, srv, "squatter-after", 710)
		if !registered(t, srv, 710) {
			t.Fatalf("restart %d: a squatter's UNREGISTER ended the registration its worker holds again", i)
		}
		if n := transferCounters(t, srv)["refused_unregisters"]; n != 2 {
			t.Errorf("restart %d: refused_unregisters = %v, want 2", i, n)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := w.C.Call(ctx, protocol.UnregisterKVCache, int64(710)); err != nil {
		t.Fatal(err)
	}
	if registered(t, srv, 710) {
		t.Errorf("the worker's own UNREGISTER after the restarts was refused")
	}
}

// prepareRetrieveAcross stores one chunk through w's instance, LOOKUPs it
// and sends PREPARE_RETRIEVE; it returns the key for the COMMIT_RETRIEVE.
func prepareRetrieveAcross(t *testing.T, w *harness.GoWorker, seq int) protocol.Key {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	toks := harness.Tokens(seq, 1, w.Chunk)
	if r, err := w.Store(ctx, toks, attackkit.SeqData(seq, 1, w.ChunkBytes), "store"); err != nil || r != "true" {
		t.Fatalf("store: %q %v", r, err)
	}
	if hits, err := harness.LookupKeep(ctx, w.C, w.Model, toks, "across"); err != nil || hits != 1 {
		t.Fatalf("lookup: %d %v", hits, err)
	}
	k := w.Key(toks, 1, "across")
	r, err := w.C.Call(ctx, protocol.PrepareRetrieve, k, w.ID)
	if err != nil {
		t.Fatalf("prepare retrieve: %v", err)
	}
	var pr harness.PrepRetrieve
	if err := r.Decode(&pr); err != nil || !pr.Success {
		t.Fatalf("prepare retrieve: %+v %v", pr, err)
	}
	return k
}

// commitRetrieveTrue sends COMMIT_RETRIEVE of k and wants its bool true:
// read as another table's PREPARE_RETRIEVE, it is answered with a
// prepare_retrieve struct and takes read locks nobody ends.
func commitRetrieveTrue(t *testing.T, srv *harness.Server, w *harness.GoWorker, k protocol.Key, after string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	locked := srv.Status(t).Pool.ReadLocked
	r, err := w.C.Call(ctx, protocol.CommitRetrieve, k, w.ID)
	if err != nil {
		t.Fatalf("COMMIT_RETRIEVE %s: %v", after, err)
	}
	var ok bool
	if err := r.Decode(&ok); err != nil || !ok {
		t.Fatalf("COMMIT_RETRIEVE %s answered %x (%v), want true: not served under the table its instance registered through", after, r.Raw, err)
	}
	if _, err := w.C.Call(ctx, protocol.EndSession, k.RequestID); err != nil {
		t.Fatal(err)
	}
	if n := srv.Status(t).Pool.ReadLocked; n > locked {
		t.Errorf("COMMIT_RETRIEVE %s: %d read-locked objects, %d before it", after, n, locked)
	}
}

// TestHostileAutoRestartCommitRetrieve: under --protocol auto a nongpu-v1
// worker prepares a retrieve, kvdock restarts, and the worker's
// COMMIT_RETRIEVE (14 [key, instance_id]) reaches the new process on a
// connection it has never seen: it reads as nongpu-v1's COMMIT_RETRIEVE
// and as nongpu-v2's PREPARE_RETRIEVE. It must be served under the table
// the instance registered through (nongpu-v1, carried in the record).
func TestHostileAutoRestartCommitRetrieve(t *testing.T) {
	srv := harness.StartKeeping(t, false, "--chunk-size", "16", "--protocol", "auto")
	w := autoWorker(t, srv.Dial(t, "nongpu-v1"), 720, "auto-restart")
	for i, restart := range []func(testing.TB) time.Duration{srv.RestartSignal, srv.RestartTerm} {
		k := prepareRetrieveAcross(t, w, 720+i)
		restart(t)
		if rs := srv.LastRestart(t); !rs.Adopted || rs.AdoptedContexts != 1 {
			t.Fatalf("restart %d: %+v, want the pool and 1 registration adopted", i, rs)
		}
		commitRetrieveTrue(t, srv, w, k, "after the restart")
	}
}

// TestHostileAutoDecidedFlood: under --protocol auto 17,500 identities
// that decide at once (engine-driven-v2's GET_EXPERIMENTAL) fill the
// decided table, a nongpu-v1 worker registers and prepares a retrieve,
// and 18,500 fresh identities follow (18: undecided). The worker's
// COMMIT_RETRIEVE must still be served as nongpu-v1's, whatever the
// detection tables kept of its connection.
func TestHostileAutoDecidedFlood(t *testing.T) {
	srv := attackkit.StartAttacked(t, "--protocol", "auto")
	answered := churnIdentities(t, srv.Endpoint, "decided", 17500, func(int) int64 { return 32 })
	c, err := client.Dial(srv.Endpoint, harness.Profile(t, "nongpu-v1"), client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	w := autoWorker(t, c, 730, "auto-flood")
	k := prepareRetrieveAcross(t, w, 730)
	answered += churnIdentities(t, srv.Endpoint, "fresh", 18500, func(int) int64 { return 18 })
	t.Logf("%d of 36,000 flooding identities answered", answered)
	commitRetrieveTrue(t, srv, w, k, "after 36,000 identities")
	if r, err := w.C.Call(context.Background(), protocol.Noop); err != nil || !r.Present {
		t.Errorf("NOOP after the flood: %+v %v", r, err)
	}
}

// TestHostilePickleRestartKeepsRegistrations: the registrations of pickle
// workers need no segment. With --shm-name "" (the seed's pickle mode) the
// pool lives in a private segment and is adopted with them; with a lazy
// pool (anonymous memory, which cannot be kept) the record carries the
// registrations alone. Either way, after SIGUSR2 and after SIGTERM + the
// same command line a seed-era pickle worker, which never registers
// again, stores and reads back under its registration.
func TestHostilePickleRestartKeepsRegistrations(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flags   []string
		adopted bool
	}{
		{"private segment", nil, true},
		{"lazy pool", []string{"--l1-use-lazy"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--chunk-size", "16", "--shm-name", "", "--l1-keep-on-exit",
				"--state-dir", filepath.Join(t.TempDir(), "state")}, tc.flags...)
			pickleRestartKeepsRegistrations(t, harness.Start(t, args...), tc.adopted)
		})
	}
}

func pickleRestartKeepsRegistrations(t *testing.T, srv *harness.Server, adopted bool) {
	w := harness.NewWorker(t, srv.Dial(t, srv.Protocol), 740, "pickle-restart", true)
	for i, restart := range []func(testing.TB) time.Duration{srv.RestartSignal, srv.RestartTerm} {
		seq := 740 + i
		toks, data := harness.Tokens(seq, 2, w.Chunk), attackkit.SeqData(seq, 2, w.ChunkBytes)
		restart(t)
		rs := srv.LastRestart(t)
		if rs.Adopted != adopted || rs.AdoptedContexts != 1 {
			t.Fatalf("restart %d: %+v, want adopted %v with 1 registration restored", i, rs, adopted)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, err := w.Store(ctx, toks, data, "after-restart")
		cancel()
		if err != nil || r != "true" {
			t.Fatalf("restart %d: the pickle worker's store: %q, %v\n%s", i, r, err, srv.Output())
		}
		attackkit.ReadBack(t, w, toks, data, "after-restart-r")
	}
}
