// Package chat generates the multi-turn chat traces the eviction tests and
// benchmarks replay: which conversation each prompt extends, and to how
// many chunks, so that the in-process replay (core/l1) and the replay
// through the wire (tests/reliability) play the same traffic.
package chat

import "math/rand/v2"

// Turn is one prompt: the first Chunks chunks of conversation Conv (its
// whole history and its new turn). Conversations are numbered from 1.
type Turn struct{ Conv, Chunks int }

// Trace is chat with think time: open conversations at a time, each
// extended by 1 to 3 chunks a turn and ending after 4 to 16 turns (a new
// one starts in its place, its first turn within think prompts). A
// conversation comes back when its user has read the answer and typed the
// next turn, think prompts later on average (uniform between half and one
// and a half times that), after the conversations served meanwhile: the
// order of returns follows the order of service, so a user answered long
// ago is the likeliest to come back next.
func Trace(n, open int, think float64, seed uint64) []Turn {
	return TraceWithContext(n, open, think, 0, seed)
}

// TraceWithContext is Trace with conversations that open on a context of
// context chunks (a document, a code base, an agent's instructions) before
// their first message: long prompts, each a large share of a pool, which is
// where LRU, evicting a prompt's first chunks first, strands the rest of it
// (LMCache #4867: a repeated 59k-token prompt).
func TraceWithContext(n, open int, think float64, context int, seed uint64) []Turn {
	r := rand.New(rand.NewPCG(seed, 6))
	type conv struct {
		id, turns, left, chunks int
		at                      float64 // when its next turn arrives, in prompts
	}
	next := 0
	fresh := func(now float64) *conv {
		next++
		return &conv{id: next, left: 4 + r.IntN(13), chunks: context, at: now + think*r.Float64()}
	}
	convs := make([]*conv, open)
	for i := range convs {
		convs[i] = fresh(0)
	}
	out := make([]Turn, n)
	for i := range out {
		j := 0 // the next to arrive (a scan: a few hundred conversations)
		for k, c := range convs {
			if c.at < convs[j].at {
				j = k
			}
		}
		c := convs[j]
		c.chunks += 1 + r.IntN(3)
		c.turns++
		out[i] = Turn{Conv: c.id, Chunks: c.chunks}
		if c.turns == c.left {
			convs[j] = fresh(float64(i))
		} else {
			c.at = float64(i) + think*(0.5+r.Float64())
		}
	}
	return out
}

// WorkingSet is the chunks that the last eighth of trace asks for more
// than once (a chunk asked once can never hit): what a pool must hold to
// serve the traffic of a while.
func WorkingSet(trace []Turn) int {
	seen := map[[2]int]int{}
	for _, tu := range trace[len(trace)*7/8:] {
		for c := range tu.Chunks {
			seen[[2]int{tu.Conv, c}]++
		}
	}
	n := 0
	for _, v := range seen {
		if v > 1 {
			n++
		}
	}
	return n
}

// LiveSet is the chunks a pool must hold to serve every repeat of trace:
// at each prompt, the chunks asked for before that are asked for again
// later, averaged over the second half. Unlike WorkingSet it does not count
// conversations that ended, so it suits traces of few long conversations.
func LiveSet(trace []Turn) int {
	last := map[int]int{}    // conversation → its last prompt
	longest := map[int]int{} // conversation → its chunks asked so far
	for i, tu := range trace {
		last[tu.Conv] = i
	}
	live, sum, n := 0, 0, 0
	for i, tu := range trace {
		if tu.Chunks > longest[tu.Conv] {
			live += tu.Chunks - longest[tu.Conv]
			longest[tu.Conv] = tu.Chunks
		}
		if last[tu.Conv] == i {
			live -= longest[tu.Conv] // never asked again
		}
		if i >= len(trace)/2 {
			sum += live
			n++
		}
	}
	return sum / max(n, 1)
}
