package misses

import (
	"encoding/binary"
	"fmt"
	"testing"

	"kvdock/core/keys"
)

func hash(i int) keys.Hash {
	var h keys.Hash
	binary.LittleEndian.PutUint64(h[:], uint64(i))
	return h
}

func TestGhostRemembersLatestReason(t *testing.T) {
	g := NewGhost(64)
	h := hash(1)
	d := g.Digest(&h, "m", "", keys.KVRank(1, 0), 0)
	if _, ok := g.Find(d); ok {
		t.Fatal("empty ghost found a key")
	}
	g.Note(d, Evicted)
	if r, ok := g.Find(d); !ok || r != Evicted {
		t.Fatalf("Find = %v, %v; want evicted", r, ok)
	}
	g.Note(d, Refused)
	if r, ok := g.Find(d); !ok || r != Refused {
		t.Fatalf("after a second note Find = %v, %v; want refused", r, ok)
	}
}

// Every part of an object key separates digests: chunk, model, salt, rank.
func TestGhostDigestSeparatesKeyParts(t *testing.T) {
	g := NewGhost(64)
	h1, h2 := hash(1), hash(2)
	base := g.Digest(&h1, "m", "", keys.KVRank(1, 0), 0)
	for name, d := range map[string]uint64{
		"chunk": g.Digest(&h2, "m", "", keys.KVRank(1, 0), 0),
		"model": g.Digest(&h1, "n", "", keys.KVRank(1, 0), 0),
		"salt":  g.Digest(&h1, "m", "s", keys.KVRank(1, 0), 0),
		"rank":  g.Digest(&h1, "m", "", keys.KVRank(2, 0), 0),
		"split": g.Digest(&h1, "m\x00", "", keys.KVRank(1, 0), 0),
		"group": g.Digest(&h1, "m", "", keys.KVRank(1, 0), 1),
	} {
		if d == base {
			t.Errorf("digest ignores the %s", name)
		}
	}
}

// The ghost is bounded: past its capacity the oldest keys go, the newest
// stay, and nothing is ever reported for a key never noted.
func TestGhostBoundedFIFO(t *testing.T) {
	g := NewGhost(1024)
	if g.Entries() != 1024 || g.Bytes() != 1024*8+1024/8 {
		t.Fatalf("entries %d bytes %d", g.Entries(), g.Bytes())
	}
	if d := NewGhost(DefaultGhostEntries); d.Bytes() != 532480 { // the 520 KiB docs/DASHBOARD.md states
		t.Fatalf("default ghost is %d bytes", d.Bytes())
	}
	const n = 100000
	ds := make([]uint64, n)
	for i := range ds {
		h := hash(i)
		ds[i] = g.Digest(&h, "m", "", 1, 0)
		g.Note(ds[i], Evicted)
	}
	newest := 0
	for _, d := range ds[n-256:] {
		if _, ok := g.Find(d); ok {
			newest++
		}
	}
	oldest := 0
	for _, d := range ds[:n-4096] {
		if _, ok := g.Find(d); ok {
			oldest++
		}
	}
	// 8-way buckets keep the last notes of each bucket: the last 256 of
	// 1024 entries nearly all stay, the long-gone ones nearly all went.
	if newest < 250 {
		t.Errorf("%d of the newest 256 keys remembered", newest)
	}
	if oldest > 100 {
		t.Errorf("%d keys older than 4096 notes still remembered by a 1024-entry ghost", oldest)
	}
	for i := n; i < n+10000; i++ {
		h := hash(i)
		if _, ok := g.Find(g.Digest(&h, "m", "", 1, 0)); ok {
			t.Fatalf("key %d never noted was found", i)
		}
	}
}

func TestGhostNoAllocation(t *testing.T) {
	g := NewGhost(DefaultGhostEntries)
	h := hash(7)
	model, salt := "model", "salt"
	allocs := testing.AllocsPerRun(1000, func() {
		d := g.Digest(&h, model, salt, 3, 0)
		g.Note(d, Evicted)
		g.Find(d)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per note and find, want 0", allocs)
	}
}

func TestTallyByContextBounded(t *testing.T) {
	ta := NewTally()
	var c Counts
	c[Evicted], c[NeverStored] = 2, 3
	ta.Add(Context{"b", 2}, &c, 1)
	ta.Add(Context{"a", 1}, &c, 0)
	ta.Add(Context{"a", 1}, &c, 0)
	r := ta.Report()
	if r.Total[Evicted] != 6 || r.Total.Total() != 15 || r.TierMissed != 1 {
		t.Fatalf("total %v tier %d", r.Total, r.TierMissed)
	}
	if len(r.Contexts) != 2 || r.Contexts[0].Model != "a" || r.Contexts[0].Missed[NeverStored] != 6 {
		t.Fatalf("contexts %+v", r.Contexts)
	}
	if got, ok := r.For(Context{"b", 2}); !ok || got.TierMissed != 1 || got.Missed[Evicted] != 2 {
		t.Fatalf("For(b) = %+v, %v", got, ok)
	}
	for i := range MaxContexts + 10 {
		ta.Add(Context{fmt.Sprintf("m%d", i), 1}, &c, 0)
	}
	r = ta.Report()
	if len(r.Contexts) != MaxContexts {
		t.Fatalf("%d contexts kept, want the cap %d", len(r.Contexts), MaxContexts)
	}
	if r.Other.Missed.Total() != 12*5 {
		t.Fatalf("contexts past the cap tallied %d, want %d", r.Other.Missed.Total(), 12*5)
	}
	var sum Counts
	for _, cc := range r.Contexts {
		sum.Add(&cc.Missed)
	}
	sum.Add(&r.Other.Missed)
	if sum != r.Total {
		t.Fatalf("contexts sum to %v, total %v", sum, r.Total)
	}
}

func TestReasonNames(t *testing.T) {
	seen := map[string]bool{}
	for r := range NumReasons {
		n := r.String()
		if n == "" || n == "unknown" || seen[n] {
			t.Fatalf("reason %d named %q", r, n)
		}
		seen[n] = true
	}
	var c Counts
	if len(c.Map()) != int(NumReasons) {
		t.Fatal("Map leaves reasons out")
	}
}
