package chat

import (
	"math"
	"math/rand/v2"
	"testing"
)

// keepLikeliest replays trace with a pool that holds the capacity chunks
// of largest chance asked so far (A0, the optimal online policy under
// fixed popularities) and returns its hits.
func keepLikeliest(trace []Prompt, capacity int, chance func(Prompt, int) float64) int {
	type held struct {
		id uint64
		c  float64
	}
	var pool []held // largest chance first
	in := map[uint64]bool{}
	hits := 0
	for _, p := range trace {
		ids := ChunkIDs(p)
		n := 0
		for n < len(ids) && in[ids[n]] {
			n++
		}
		hits += n
		for j, id := range ids[n:] {
			c := chance(p, n+j)
			if len(pool) == capacity && pool[capacity-1].c >= c {
				continue
			}
			at := 0
			for at < len(pool) && pool[at].c >= c {
				at++
			}
			pool = append(pool[:at], append([]held{{id, c}}, pool[at:]...)...)
			in[id] = true
			if len(pool) > capacity {
				delete(in, pool[capacity].id)
				pool = pool[:capacity]
			}
		}
	}
	return hits
}

// TestFixedPopularityBoundIsReached: on system prompts and RAG the bound
// is what keeping the likeliest chunks gets (within 3 %), and not above
// Belady's MIN, which also knows the order (by more than the draw's
// noise: the bound is an expectation, MIN this draw's hits).
func TestFixedPopularityBoundIsReached(t *testing.T) {
	for _, f := range []struct {
		name   string
		trace  []Prompt
		chance func(Prompt, int) float64
	}{
		{"system-prompts", SystemPrompts(3000, 3), SystemPromptsChance()},
		{"rag", RAG(3000, 4), RAGChance()},
	} {
		live := Live(f.trace)
		for _, x := range []float64{0.5, 1, 2} {
			capacity := int(x * float64(live))
			bound := FixedPopularityOnline(f.trace, capacity, f.chance)
			a0 := keepLikeliest(f.trace, capacity, f.chance)
			opt := OfflineHits(f.trace, capacity)
			t.Logf("%s at %.1f× (%d chunks): online bound %.0f, keeping the likeliest %d, MIN %d", f.name, x, capacity, bound, a0, opt)
			if math.Abs(float64(a0)-bound) > 0.03*bound {
				t.Errorf("%s at %.1f×: keeping the likeliest hits %d, the bound says %.0f", f.name, x, a0, bound)
			}
			if bound > 1.01*float64(opt) {
				t.Errorf("%s at %.1f×: the online bound %.0f is above MIN's %d", f.name, x, bound, opt)
			}
		}
	}
}

// TestZipfChancesMatchTheGenerator: the chances the bound uses are the
// generator's frequencies.
func TestZipfChancesMatchTheGenerator(t *testing.T) {
	for _, z := range []zipf{systemZipf(), ragZipf()} {
		g := z.of(rand.New(rand.NewPCG(1, 2)))
		const n = 200_000
		counts := make([]float64, z.imax+1)
		for range n {
			counts[g.Uint64()]++
		}
		for k, c := range z.chances() {
			if got := counts[k] / n; math.Abs(got-c) > 0.005 {
				t.Errorf("zipf %+v: k=%d drawn %.4f of the time, chance %.4f", z, k, got, c)
			}
		}
	}
}

// TestRandomOrderOnline: the bound counts the open conversations' chunks
// (RandomOrder is unchanged by it), and sits below MIN at every size.
func TestRandomOrderOnline(t *testing.T) {
	turns, held := randomOrder(3000, 24, 1)
	open := map[int]int{}
	for i, tu := range turns {
		sum := 0
		for _, c := range open {
			sum += c
		}
		// Conversations not seen yet hold nothing; ended ones left open
		// only count until their replacement is known, so the trace's
		// own count can only be at least the generator's.
		if held[i] > sum {
			t.Fatalf("prompt %d: the generator says %d chunks held, the trace shows %d", i, held[i], sum)
		}
		open[tu.Conv] = tu.Chunks
	}
	trace := Prompts(turns)
	live := Live(trace)
	for _, x := range []float64{0.5, 1, 2} {
		capacity := int(x * float64(live))
		bound, opt := RandomOrderOnline(3000, 24, 1, capacity), OfflineHits(trace, capacity)
		t.Logf("at %.1f× (%d chunks): online bound %.0f, MIN %d", x, capacity, bound, opt)
		if bound > 1.01*float64(opt) {
			t.Errorf("at %.1f×: the online bound %.0f is above MIN's %d", x, bound, opt)
		}
	}
}
