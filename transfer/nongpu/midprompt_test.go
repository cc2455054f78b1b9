package nongpu

import (
	"testing"
)

// TestStoreFromMidPromptLinksToItsParent: a worker that stores only what
// LOOKUP missed sends a key starting mid-prompt. Its first chunk continues
// the prompt, it does not start one: once the chunk before it is gone, it
// is not usable (a chunk is usable when its parent is resident). Taken for
// a prompt's start, it would stay usable, and the prefix policy could evict
// its parent before it. SHM and pickle stores alike.
func TestStoreFromMidPromptLinksToItsParent(t *testing.T) {
	for _, shm := range []bool{true, false} {
		e := newEnv(t, shm, 1<<20)
		e.register(1)
		toks := tokens(4*testChunk, 5)
		for _, half := range []int{0, 1} {
			k := key(toks, 2*half*testChunk, 2*(half+1)*testChunk)
			if shm {
				e.storeSHM(k, 1, byte(10+half), "SHM store")
				continue
			}
			if ok, err := e.mod.CommitStore(k, 1, pickled(t, tensorOf(1), tensorOf(2))); !ok || err != nil {
				t.Fatalf("pickle store of chunks from %d: %v, %v", k.Start, ok, err)
			}
		}
		st := e.pool.Stats()
		if st.UsableBytes != st.ResidentBytes || st.Objects != 4 {
			t.Fatalf("shm %v: %d objects, usable %d of %d bytes after storing the prompt in two halves", shm, st.Objects, st.UsableBytes, st.ResidentBytes)
		}
		chunk := st.ResidentBytes / 4
		e.pool.Delete(e.objectKeys(key(toks, testChunk, 2*testChunk)))
		if st := e.pool.Stats(); st.UsableBytes != 2*chunk || st.ResidentBytes != 3*chunk {
			t.Errorf("shm %v: chunk 1 deleted: usable %d, resident %d bytes; want %d usable (chunks 0 and 3, not 2) of %d", shm, st.UsableBytes, st.ResidentBytes, 2*chunk, 3*chunk)
		}
	}
}
