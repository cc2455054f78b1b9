package tier_test

import (
	"context"
	"testing"

	"kvdock/core/keys"
	"kvdock/transfer/tier"
	"kvdock/transfer/tier/memtier"
)

// absentTier is a memtier that knows from memory which keys it lacks.
type absentTier struct{ *memtier.Tier }

func (a absentTier) KnownAbsent(key string) bool {
	_, ok := a.Values()[key]
	return !ok
}

// TestPrefetchCountsTierMisses: a lookup that asks a tier for a chunk the
// tier lacks counts one miss of that tier, whether the tier answers absent,
// fails, or knows the absence from memory; a tier is asked about a chunk
// once per lookup.
func TestPrefetchCountsTierMisses(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	a, b := memtier.New(), memtier.New()
	s := newSet(t, p, lay, tier.Options{}, a, b)
	ks := putTier(t, a, lay, 0, 3)
	ks = append(ks, putTier(t, b, lay, 3, 2)...)
	ks = append(ks, testKey(99))
	if n := s.Prefetch(context.Background(), "m", 1, ks, 1, 1); n != 5 {
		t.Fatalf("prefetched %d chunks, want 5", n)
	}
	p.FinishRead(ks[:5], 1)
	// a lacked chunk 3 (b had it) and chunk 5; b lacked chunk 5, asked once.
	st := s.Stats()
	if st[0].Misses != 2 || st[1].Misses != 1 || st[0].Hits != 3 || st[1].Hits != 2 {
		t.Fatalf("tier 0: %d hits %d misses, tier 1: %d hits %d misses; want 3/2 and 2/1",
			st[0].Hits, st[0].Misses, st[1].Hits, st[1].Misses)
	}

	// Nothing anywhere: one miss per tier.
	if n := s.Prefetch(context.Background(), "m", 1, []keys.ObjectKey{testKey(200), testKey(201)}, 1, 1); n != 0 {
		t.Fatalf("prefetched %d absent chunks", n)
	}
	if st := s.Stats(); st[0].Misses != 3 || st[1].Misses != 2 {
		t.Fatalf("after a lookup of absent chunks: misses %d and %d, want 3 and 2", st[0].Misses, st[1].Misses)
	}

	// A tier that fails the lookup did not find the chunk either.
	b.SetDown("connection refused")
	if n := s.Prefetch(context.Background(), "m", 1, []keys.ObjectKey{testKey(300)}, 1, 1); n != 0 {
		t.Fatalf("prefetched %d absent chunks", n)
	}
	if st := s.Stats(); st[0].Misses != 4 || st[1].Misses != 3 {
		t.Fatalf("with tier 1 down: misses %d and %d, want 4 and 3", st[0].Misses, st[1].Misses)
	}
}

// TestKnownAbsentCountsTierMisses: a lookup answered from the tiers' memory
// ("absent") is a miss of every tier; one some tier may hold is none.
func TestKnownAbsentCountsTierMisses(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	a, b := absentTier{memtier.New()}, absentTier{memtier.New()}
	s := newSet(t, p, lay, tier.Options{}, a, b)
	ks := putTier(t, b.Tier, lay, 0, 1)
	if s.KnownAbsent("m", 1, ks, 1) {
		t.Fatal("a chunk tier 1 holds is known absent")
	}
	if st := s.Stats(); st[0].Misses != 0 || st[1].Misses != 0 {
		t.Fatalf("misses %d and %d for a lookup not answered from memory", st[0].Misses, st[1].Misses)
	}
	if !s.KnownAbsent("m", 1, []keys.ObjectKey{testKey(7)}, 1) {
		t.Fatal("a chunk no tier holds is not known absent")
	}
	if st := s.Stats(); st[0].Misses != 1 || st[1].Misses != 1 {
		t.Fatalf("misses %d and %d, want 1 and 1", st[0].Misses, st[1].Misses)
	}
}
