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

// RandomOrderSeenOnline bounds the hits an online policy expects on
// RandomOrder(n, open, seed) with a pool of capacity chunks when, unlike
// RandomOrderOnline, it is not told which conversations have ended: it
// sees the prompts only, and knows the generator (each prompt picks one of
// open conversations uniformly; a conversation lasts 4 to 16 turns, and a
// new one takes its place at once). At each prompt a conversation seen
// before is asked for with chance P(still open | the prompts so far)/open,
// and the bound adds the capacity largest of its chunks' chances, as
// RandomOrderOnline does.
//
// The posterior is exact (seenEnded). Under any account of which seen
// conversations ended that fits the prompts, a pick of a seen one has
// chance 1/open, so how long one has been silent says nothing by itself.
// What tells is each one's turns (seen k times, it ended after the k-th
// with chance P(L = k | L ≥ k), L uniform on 4..16), and each pick of a
// conversation new to the trace, whose chance is the places of the
// started but unseen ones (open less the seen ones still open) over open:
// the more of the seen ones ended before it, the likelier.
func RandomOrderSeenOnline(n, open int, seed uint64, capacity int) float64 {
	var seen seenConvs
	var post seenEnded
	var order []int
	total := 0.0
	for i, tu := range RandomOrder(n, open, seed) {
		p := post.chances(seen.cs, open)
		order = byOpen(p, order)
		left := capacity
		for _, j := range order {
			if left == 0 {
				break
			}
			take := min(left, seen.cs[j].chunks)
			total += float64(take) * (1 - p[j]) / float64(open)
			left -= take
		}
		seen.observe(i, tu)
	}
	return total
}

// seenConv is what the prompts so far show of a conversation: its turns,
// its chunks, and its first and last prompts.
type seenConv struct{ turns, chunks, first, last int }

// seenConvs is the conversations the prompts so far show, in order of
// their first prompts.
type seenConvs struct {
	cs []seenConv
	at map[int]int // conversation → its place in cs
}

// observe notes prompt i, tu, and returns its conversation's place.
func (s *seenConvs) observe(i int, tu Turn) int {
	if s.at == nil {
		s.at = map[int]int{}
	}
	j, ok := s.at[tu.Conv]
	if !ok {
		j = len(s.cs)
		s.at[tu.Conv] = j
		s.cs = append(s.cs, seenConv{first: i})
	}
	c := &s.cs[j]
	c.turns++
	c.chunks = tu.Chunks
	c.last = i
	return j
}

// byOpen returns the places of the conversations whose chances to have
// ended are ended, likeliest open first, in order's buffer.
func byOpen(ended []float64, order []int) []int {
	order = order[:0]
	for j := range ended {
		order = append(order, j)
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(ended[a], ended[b]) })
	return order
}

// endedAfter is P(L = k | L ≥ k) for L uniform on 4..16: the chance that a
// conversation seen k times ended after its k-th turn.
func endedAfter(k int) float64 {
	if k < 4 {
		return 0
	}
	return 1 / float64(17-k)
}

// seenEnded computes each seen conversation's chance to have ended, given
// the prompts. An account of which ended weighs the product of endedAfter
// (one less it for those still open) and, at each conversation's first
// prompt, the chance of picking a newcomer then (newcomer). That chance
// counts the conversations ended before that prompt, those whose last
// prompt is earlier; so a forward and a backward pass over the
// conversations in order of their last prompts, the number ended so far
// the state, give every marginal. The buffers are kept from call to call.
type seenEnded struct {
	byLast []int     // conversations by last prompt
	fwd    []float64 // row k: the forward weights before decision k, by number ended
	bwd    []float64
	out    []float64
}

func (s *seenEnded) chances(cs []seenConv, open int) []float64 {
	d := len(cs)
	s.byLast = s.byLast[:0]
	for j := range cs {
		s.byLast = append(s.byLast, j)
	}
	slices.SortFunc(s.byLast, func(a, b int) int { return cmp.Compare(cs[a].last, cs[b].last) })
	w := d + 1
	if cap(s.fwd) < d*w {
		s.fwd = make([]float64, 2*d*w)
	}
	if cap(s.bwd) < w+1 {
		s.bwd = make([]float64, 2*(w+1))
	}
	if cap(s.out) < d {
		s.out = make([]float64, 2*d)
	}
	fwd, b, out := s.fwd[:d*w], s.bwd[:w+1], s.out[:d]

	// Forward. The first prompts come in the order of cs; before decision
	// k go those not after its last prompt (one at that very prompt counts
	// only the ends before it).
	cur := b[:w] // b is free until the backward pass
	clear(cur)
	cur[0] = 1
	next := 0
	for k, j := range s.byLast {
		for ; next < d && cs[next].first <= cs[j].last; next++ {
			newcomer(cur, open-next)
		}
		copy(fwd[k*w:(k+1)*w], cur)
		h := endedAfter(cs[j].turns)
		for m := k + 1; m >= 1; m-- {
			cur[m] = cur[m]*(1-h) + cur[m-1]*h
		}
		cur[0] *= 1 - h
		normalize(cur)
	}

	// Backward, from after the last decision (every first prompt is at or
	// before its conversation's last, so none is left past it).
	for m := range b {
		b[m] = 1
	}
	b[w] = 0
	prev := d - 1 // the first prompts still to pass, latest first
	for k := d - 1; k >= 0; k-- {
		j := s.byLast[k]
		h := endedAfter(cs[j].turns)
		f := fwd[k*w : (k+1)*w]
		yes, no := 0.0, 0.0
		for m := 0; m <= k; m++ {
			yes += f[m] * h * b[m+1]
			no += f[m] * (1 - h) * b[m]
		}
		out[j] = 0
		if yes+no > 0 {
			out[j] = yes / (yes + no)
		}
		// Before decision k at most k have ended; the states past that
		// are none, and left in they would take the mass normalize
		// shares out.
		for m := 0; m <= k; m++ {
			b[m] = (1-h)*b[m] + h*b[m+1]
		}
		clear(b[k+1:])
		lo := -1
		if k > 0 {
			lo = cs[s.byLast[k-1]].last
		}
		for ; prev >= 0 && cs[prev].first > lo; prev-- {
			newcomer(b[:w], open-prev)
		}
		normalize(b)
	}
	return out
}

// newcomer weighs the states v (by number ended so far) by the chance
// that a pick is of a conversation not seen yet, the places of those:
// base (open less the conversations seen before it) plus the number
// ended; none where that is not positive. The 1/open every pick shares
// is left out.
func newcomer(v []float64, base int) {
	for m := range v {
		v[m] *= float64(max(0, base+m))
	}
}

// normalize scales v to sum 1 (the passes need only ratios); a v that
// sums to 0 stays as it is.
func normalize(v []float64) {
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	if sum > 0 {
		for i := range v {
			v[i] /= sum
		}
	}
}
