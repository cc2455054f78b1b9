package fs

import (
	"context"
	"fmt"
	"slices"
	"testing"
)

// told records what a tier tells through NotifyContents.
type told struct{ got []string }

func (r *told) note(key string, present bool) {
	r.got = append(r.got, fmt.Sprintf("%s%s", key, map[bool]string{true: "+", false: "-"}[present]))
}

func (r *told) take(t *testing.T, want ...string) {
	t.Helper()
	if !slices.Equal(r.got, want) {
		t.Fatalf("told %v, want %v", r.got, want)
	}
	r.got = nil
}

// TestContentsToldInOrder: each value written is told once installed, and
// once it leaves (evicted for room before the value that needs the room,
// deleted, cleared); a rewrite of a held value tells nothing.
func TestContentsToldInOrder(t *testing.T) {
	tr := openTier(t, t.TempDir(), 2*charge(8<<10))
	r := &told{}
	tr.NotifyContents(r.note)
	mustPut(t, tr, "a", 8<<10)
	mustPut(t, tr, "b", 8<<10)
	r.take(t, "a+", "b+")
	mustPut(t, tr, "b", 8<<10) // a rewrite
	r.take(t)
	mustPut(t, tr, "c", 8<<10) // evicts a, the least recently used
	r.take(t, "a-", "c+")
	if err := tr.Delete(context.Background(), "b"); err != nil {
		t.Fatal(err)
	}
	if err := tr.Delete(context.Background(), "b"); err != nil { // absent: nothing told
		t.Fatal(err)
	}
	r.take(t, "b-")
	if _, _, err := tr.Clear(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.take(t, "c-")
}

// TestHostilePlantedFilesNeverTold: a valid chunk file this process did not
// write (an earlier run's, or one planted under base_path) is never told,
// neither when found nor when it leaves: the event stream announces only
// what kvdock itself wrote behind.
func TestHostilePlantedFilesNeverTold(t *testing.T) {
	base := t.TempDir()
	first := openTier(t, base, 64<<20)
	mustPut(t, first, "planted", 8<<10)
	first.Close()
	tr := openTier(t, base, 64<<20)
	r := &told{}
	tr.NotifyContents(r.note)
	if n, err := tr.Has(context.Background(), []string{"planted"}); err != nil || n != 1 {
		t.Fatalf("the planted file is not indexed: %d %v", n, err)
	}
	if _, _, err := tr.Clear(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.take(t)
}
