package chat

import (
	"cmp"
	"math"
	"slices"
)

// The online bound: what a policy that cannot see the future can expect.
//
// Belady's MIN (OfflineHits) knows which prompt comes next. Where a family
// draws each prompt independently of what the pool holds (random-order
// chat picks an open conversation at random; system prompts and RAG draw
// their documents from fixed popularities), no policy knows more than the
// draw's distribution. At a prompt, a pool holding the chunks H expects
// Σ P(the prompt asks for c and for every chunk before it) over c in H,
// and that is at most the sum of the capacity largest of those chances
// over the chunks asked before (a chunk never asked cannot be held). Each
// prompt's expectation is at most that whatever the pool did before, so
// the sum over the trace bounds the hits any online policy expects; under
// fixed popularities it is also what keeping the likeliest chunks (the
// classic A0 policy, optimal there) gets. Where it is below MIN, the gap
// to MIN is what only knowing the future could gain.

// RandomOrderOnline bounds the hits an online policy expects on
// RandomOrder(n, open, seed) with a pool of capacity chunks: at each
// prompt, every held chunk of an open conversation is asked for with
// chance 1/open, so a pool of capacity chunks expects at most
// min(capacity, held)/open.
func RandomOrderOnline(n, open int, seed uint64, capacity int) float64 {
	_, held := randomOrder(n, open, seed)
	total := 0.0
	for _, h := range held {
		total += float64(min(capacity, h)) / float64(open)
	}
	return total
}

// FixedPopularityOnline bounds the hits an online policy expects on a
// trace whose prompts are drawn independently from one distribution, with
// a pool of capacity chunks: chance(p, j) is the probability that a drawn
// prompt asks for chunk j of p and every chunk before it. At each prompt
// the bound adds the capacity largest chances of the chunks asked before.
func FixedPopularityOnline(trace []Prompt, capacity int, chance func(p Prompt, j int) float64) float64 {
	seen := map[uint64]bool{}
	var held []float64 // the chances of the chunks seen, largest first
	total := 0.0
	for _, p := range trace {
		top := 0.0
		for _, c := range held[:min(capacity, len(held))] {
			top += c
		}
		total += top
		for j, id := range ChunkIDs(p) {
			if seen[id] {
				continue
			}
			seen[id] = true
			c := chance(p, j)
			at, _ := slices.BinarySearchFunc(held, c, func(a, b float64) int { return cmp.Compare(b, a) })
			held = slices.Insert(held, at, c)
		}
	}
	return total
}

// chances is the distribution of z's rand.Zipf: P(k) proportional to
// (v+k)^-s for k in [0, imax].
func (z zipf) chances() []float64 {
	out := make([]float64, z.imax+1)
	sum := 0.0
	for k := range out {
		out[k] = math.Pow(z.v+float64(k), -z.s)
		sum += out[k]
	}
	for k := range out {
		out[k] /= sum
	}
	return out
}

// SystemPromptsChance is the chance function of SystemPrompts for
// FixedPopularityOnline: a system prompt's chunk is asked for as often as
// its prompt is picked; a question is asked once.
func SystemPromptsChance() func(p Prompt, j int) float64 {
	z := systemZipf().chances()
	return func(p Prompt, j int) float64 {
		if j >= p[0].N {
			return 0
		}
		return z[p[0].Doc-systemDoc]
	}
}

// RAGChance is the chance function of RAG for FixedPopularityOnline: a
// document's chunk is asked for as often as the documents before it and
// itself are drawn in that order (the shared system prompt always, a
// question once).
func RAGChance() func(p Prompt, j int) float64 {
	z := ragZipf().chances()
	return func(p Prompt, j int) float64 {
		c := 1.0
		for _, s := range p {
			switch {
			case s.Doc >= questionDoc:
				c = 0
			case s.Doc >= documentDoc:
				c *= z[s.Doc-documentDoc]
			}
			if j < s.N {
				return c
			}
			j -= s.N
		}
		return 0
	}
}
