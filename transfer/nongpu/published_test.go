package nongpu

import (
	"slices"
	"sync"
	"testing"

	"kvdock/core/keys"
	"kvdock/core/layout"
	"kvdock/transfer/torchpickle"
)

// recorder collects what Deps.Published is told.
type recorder struct {
	mu   sync.Mutex
	keys []keys.ObjectKey
	lays []layout.Layout
}

func (r *recorder) note(ks []keys.ObjectKey, lay layout.Layout) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = append(r.keys, ks...)
	r.lays = append(r.lays, lay)
}

func (r *recorder) got() []keys.ObjectKey {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.keys)
}

// recordingEnv is a 1 MiB env whose module reports what it publishes to
// the returned recorder.
func recordingEnv(t *testing.T, shared bool) (*env, *recorder) {
	t.Helper()
	e := newEnv(t, shared, 1<<20)
	rec := &recorder{}
	e.mod.published = rec.note
	return e, rec
}

func TestPublishedAfterSHMCommitOnly(t *testing.T) {
	e, rec := recordingEnv(t, true)
	e.register(1)
	k := key(tokens(2*testChunk, 100), 0, 2*testChunk)
	if _, err := e.mod.PrepareStore(k, 1); err != nil {
		t.Fatal(err)
	}
	if len(rec.got()) != 0 {
		t.Fatal("published before the commit")
	}
	if ok, err := e.mod.CommitStore(k, 1, nil); !ok || err != nil {
		t.Fatalf("commit = %v, %v", ok, err)
	}
	if got, want := rec.got(), e.objectKeys(k); !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
	if rec.lays[0].Bytes != chunkBytes {
		t.Fatalf("published layout %v", rec.lays[0])
	}
	// A commit overtaken by a clear publishes nothing.
	k2 := key(tokens(2*testChunk, 500), 0, 2*testChunk)
	if _, err := e.mod.PrepareStore(k2, 1); err != nil {
		t.Fatal(err)
	}
	e.pool.Clear()
	if ok, _ := e.mod.CommitStore(k2, 1, nil); ok {
		t.Fatal("commit after clear succeeded")
	}
	if n := len(rec.got()); n != 2 {
		t.Fatalf("%d keys published, want the 2 of the first commit", n)
	}
}

func TestPublishedAfterPickleCommit(t *testing.T) {
	e, rec := recordingEnv(t, false)
	e.register(1)
	k := key(tokens(2*testChunk, 3), 0, 2*testChunk)
	if _, err := e.mod.PrepareStore(k, 1); err != nil {
		t.Fatal(err)
	}
	in := []torchpickle.Tensor{tensorOf(1), tensorOf(2)}
	if ok, err := e.mod.CommitStore(k, 1, pickled(t, in...)); !ok || err != nil {
		t.Fatalf("commit = %v, %v", ok, err)
	}
	if got, want := rec.got(), e.objectKeys(k); !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
	// Already cached: nothing new is published.
	if ok, err := e.mod.CommitStore(k, 1, pickled(t, in...)); !ok || err != nil {
		t.Fatalf("commit = %v, %v", ok, err)
	}
	if n := len(rec.got()); n != 2 {
		t.Fatalf("%d keys published after a cached commit", n)
	}
}
