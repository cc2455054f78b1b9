package tier_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"kvdock/core/keys"
	"kvdock/transfer/tier"
	"kvdock/transfer/tier/fs"
)

// contents records what a Set tells Options.Contents and Options.Loaded.
type contents struct {
	mu  sync.Mutex
	got []string
}

func (c *contents) note(i int, k keys.ObjectKey, present bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, fmt.Sprintf("%d:%x%s", i, k.Chunk[0], map[bool]string{true: "+", false: "-"}[present]))
}

func (c *contents) loaded(ks []keys.ObjectKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range ks {
		c.got = append(c.got, fmt.Sprintf("L:%x", k.Chunk[0]))
	}
}

func (c *contents) take(t *testing.T, want ...string) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Equal(c.got, want) {
		t.Fatalf("told %v, want %v", c.got, want)
	}
	c.got = nil
}

// TestHostileContentsToldOnlyForOwnWrites: a Set over an fs tier tells Contents each
// object its writes behind landed and each the tier let go (evicted for
// room, cleared), in the tier's order, and Loaded each object a prefetch
// published in L1; a value it did not write (put by someone else under a
// valid key) is never told, neither when it lands nor when it goes.
func TestHostileContentsToldOnlyForOwnWrites(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	// Room for two values (each one 4 KiB block: the fs tier charges whole blocks).
	b, err := fs.Open(fs.FSConfig{BasePath: t.TempDir(), CapacityBytes: 2 * 4096}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &contents{}
	s := newSet(t, p, lay, tier.Options{WorkersPerTier: 1, Contents: c.note, Loaded: c.loaded}, b)
	ks := storeN(t, p, lay, 3)
	for _, k := range ks {
		s.Enqueue([]keys.ObjectKey{k}, lay)
		waitQueue(t, s, 0)
	}
	id := func(k keys.ObjectKey) string { return fmt.Sprintf("%x", k.Chunk[0]) }
	c.take(t, "0:"+id(ks[0])+"+", "0:"+id(ks[1])+"+", "0:"+id(ks[0])+"-", "0:"+id(ks[2])+"+")
	// Someone else's value under a valid key: the tier holds it, nothing is told.
	k, v := encoded(t, lay, 7)
	if err := b.Put(context.Background(), tier.Key(k, lay), v); err != nil {
		t.Fatal(err)
	}
	c.take(t, "0:"+id(ks[1])+"-") // the room it took
	if n := s.Prefetch(context.Background(), "m", 1, []keys.ObjectKey{k}, 1, 1); n != 1 {
		t.Fatalf("prefetched %d", n)
	}
	c.take(t, "L:"+id(k))
	if _, _, err := s.Clear(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	c.take(t, "0:"+id(ks[2])+"-")
}
