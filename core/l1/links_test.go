package l1

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"kvdock/core/keys"
	"kvdock/core/testkit/fakeclock"
)

// evictions records the keys the pool evicts, in order.
type evictions struct{ got []string }

func (e *evictions) Stored(*keys.ObjectKey, int64) {}
func (e *evictions) Lost(k *keys.ObjectKey, _ int64, why Loss) {
	if why == LossEvicted {
		e.got = append(e.got, fmt.Sprintf("%s/%d", k, k.Group))
	}
}
func (e *evictions) Cleared()              {}
func (e *evictions) Tick(float64, float64) {}

// prefixTraffic runs the same seeded traffic on p every time: prompts that
// share prefixes stored from their start or from a chunk on, lookups that
// reorder the LRU, deletes that leave gaps (chunks whose parent is gone),
// and a lookup lock still in force at the end.
func prefixTraffic(t *testing.T, p *Pool) {
	t.Helper()
	r := rand.New(rand.NewPCG(7, 34))
	w := newPrefixWorld(r, 2)
	for range 120 {
		pr := r.IntN(len(w.prompts))
		n := 1 + r.IntN(len(w.prompts[pr]))
		switch op := r.IntN(10); {
		case op < 5:
			var res []Reservation
			var err error
			if s := r.IntN(n); s > 0 && r.IntN(3) == 0 {
				res, err = p.ReserveWriteAfter(InstanceOwner(1), w.keysIn(pr, s-1, s), w.keysIn(pr, s, n), 4096)
			} else {
				res, err = p.ReserveWrite(InstanceOwner(1), w.keysOf(pr, n), 4096)
			}
			if err == nil && len(res) > 0 && !p.FinishWrite(res) {
				t.Fatal("a fresh reservation did not publish")
			}
		case op < 9:
			ks := w.keysOf(pr, n)
			got := p.ReserveReadPrefix(ks, 1)
			p.FinishRead(ks[:got], 1)
		default:
			p.Delete(w.keysIn(pr, n-1, n))
		}
	}
	p.ReserveReadPrefix(w.keysOf(0, 1), 1)
	if _, msg := recount(p, w); msg != "" {
		t.Fatal(msg)
	}
}

// evictAll evicts under the prefix policy until no leaf is left and
// returns the order. The objects one eviction takes (a chunk's ranks and
// groups, all at once) are listed sorted: their order within it says
// nothing (they share a request's tick).
func evictAll(p *Pool, e *evictions) []string {
	e.got = nil
	p.mu.Lock()
	for {
		from := len(e.got)
		if p.evictLeaf() == 0 {
			break
		}
		slices.Sort(e.got[from:])
	}
	p.mu.Unlock()
	return e.got
}

// TestKeepAdoptKeepsPromptLinks: after Keep and Adopt the pool's usable
// bytes, its records' links and its prefix eviction order are those of the
// same pool that never restarted.
func TestKeepAdoptKeepsPromptLinks(t *testing.T) {
	c := fakeclock.New()
	open := func(obs *evictions) (*Pool, Options) {
		opts := sharedPool(t, testShmDir(t), 64, c)
		opts.Policy, opts.Observer = PolicyPrefix, obs
		p, err := Open(opts)
		if err != nil {
			t.Fatal(err)
		}
		prefixTraffic(t, p)
		return p, opts
	}
	// The pool that never restarts.
	var ea evictions
	a, _ := open(&ea)
	defer a.Close()
	before := a.Stats()
	if before.UsableBytes == 0 || before.UsableBytes == before.ResidentBytes {
		t.Fatalf("traffic left usable %d of %d bytes: the test needs some but not all usable", before.UsableBytes, before.ResidentBytes)
	}
	wantOrder := evictAll(a, &ea)
	if len(wantOrder) < 20 {
		t.Fatalf("only %d evictions: the test needs a tree", len(wantOrder))
	}

	// The same traffic, then a restart.
	var eb evictions
	b, opts := open(&eb)
	var k Kept
	if err := b.Keep(func(x Kept) error { k = x; return nil }); err != nil {
		t.Fatal(err)
	}
	q, ad, err := Adopt(opts, k)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if ad.LinksDropped != 0 || ad.Links == 0 || ad.Roots == 0 {
		t.Fatalf("adopted %+v", ad)
	}
	after := q.Stats()
	if after.UsableBytes != before.UsableBytes || after.ResidentBytes != before.ResidentBytes {
		t.Fatalf("usable %d of %d bytes after the restart, %d of %d before",
			after.UsableBytes, after.ResidentBytes, before.UsableBytes, before.ResidentBytes)
	}
	if got := evictAll(q, &eb); !slices.Equal(got, wantOrder) {
		t.Fatalf("prefix eviction order after the restart differs:\n got %v\nwant %v", got, wantOrder)
	}
}

// TestHostileKeptLinks: a kept table whose links name no object, a held
// object, the object itself, another rank or layout, or form a cycle is adopted with
// those links dropped (each counted, the first reason said) and the good
// ones restored; the cycle's objects stay evictable.
func TestHostileKeptLinks(t *testing.T) {
	c := fakeclock.New()
	opts := sharedPool(t, testShmDir(t), 32, c)
	opts.Policy = PolicyPrefix
	p, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	w := newPrefixWorld(rand.New(rand.NewPCG(1, 2)), 1)
	store(t, p, w.keysOf(0, len(w.prompts[0])), 4096) // one line: a root, then its chain
	// A write reservation in flight (prompt 4 shares no chunk with prompt
	// 0): kept as held.
	if _, err := p.ReserveWrite(InstanceOwner(2), w.keysOf(4, 1), 4096); err != nil {
		t.Fatal(err)
	}
	var k Kept
	if err := p.Keep(func(x Kept) error { k = x; return nil }); err != nil {
		t.Fatal(err)
	}
	line := len(w.prompts[0])
	if line < 3 || len(k.Objects) != line+1 || !k.Objects[0].Root || !k.Objects[line].Held {
		t.Fatalf("kept %+v", k.Objects)
	}
	for j := 1; j < line; j++ {
		if k.Objects[j].Parent != j {
			t.Fatalf("object %d kept with parent %d, want %d", j, k.Objects[j].Parent, j)
		}
	}
	other := keys.ObjectKey{Chunk: keys.Hash{0xee}, Model: "m", KVRank: 5}
	cases := []struct {
		name    string
		mod     func(objs []KeptObject)
		dropped int
		reason  string
	}{
		{"outside", func(o []KeptObject) { o[1].Parent = 1 << 30 }, 1, "outside the"},
		{"negative", func(o []KeptObject) { o[1].Parent = -5 }, 1, "outside the"},
		{"self", func(o []KeptObject) { o[1].Parent = 2 }, 1, "its own parent"},
		{"held parent", func(o []KeptObject) { o[1].Parent = line + 1 }, 1, "not a published object"},
		{"link on held", func(o []KeptObject) { o[line].Parent = 1 }, 1, "not published"},
		{"root and parent", func(o []KeptObject) { o[1].Root = true }, 1, "both"},
		{"other rank", func(o []KeptObject) { o[line-1].Key = other }, 1, "same rank"},
		// The same chunk under another layout of the model: its own line.
		{"other layout", func(o []KeptObject) { o[line-1].Key.Layout++ }, 1, "same rank"},
		{"cycle", func(o []KeptObject) { o[0].Root, o[0].Parent = false, line }, 1, "cycle"},
	}
	for _, tc := range cases {
		bad := k
		bad.Objects = slices.Clone(k.Objects)
		tc.mod(bad.Objects)
		q, ad, err := Adopt(opts, bad)
		if err != nil {
			t.Fatalf("%s: the pool was refused for a bad link: %v", tc.name, err)
		}
		if ad.Objects != line || ad.LinksDropped != tc.dropped || !strings.Contains(ad.LinkDropReason, tc.reason) {
			t.Errorf("%s: adopted %+v, want %d dropped for %q", tc.name, ad, tc.dropped, tc.reason)
		}
		s := q.Stats()
		if s.UsableBytes > s.ResidentBytes {
			t.Errorf("%s: usable %d > resident %d", tc.name, s.UsableBytes, s.ResidentBytes)
		}
		// Every published object can still be evicted: no link left a
		// record that is nobody's leaf.
		q.mu.Lock()
		evicted := 0
		for n := q.evictLeaf(); n > 0; n = q.evictLeaf() {
			evicted += n
		}
		q.mu.Unlock()
		if evicted != line {
			t.Errorf("%s: %d of %d published objects evictable", tc.name, evicted, line)
		}
		// Hand the segment back for the next case.
		var again Kept
		if err := q.Keep(func(x Kept) error { again = x; return nil }); err != nil {
			t.Fatal(err)
		}
		k.Segment = again.Segment
	}
}
