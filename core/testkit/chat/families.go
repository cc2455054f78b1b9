package chat

import (
	"container/heap"
	"math/rand/v2"
)

// The trace families of the eviction evaluation: prompts built of runs of
// documents (a conversation is one document that grows), each family
// generated at several shapes, so that a policy is judged on a kind of
// traffic rather than on one trace, and an offline bound (Belady's MIN) to
// judge it against.

// Seg is a run of a prompt: the first N chunks of document Doc.
type Seg struct{ Doc, N int }

// Prompt is one prompt as runs of documents, in order. Chunk keys chain,
// so a chunk is its prompt up to it: the same document after another
// prefix is other chunks.
type Prompt []Seg

// Len is the prompt's chunks.
func (p Prompt) Len() int {
	n := 0
	for _, s := range p {
		n += s.N
	}
	return n
}

// Prompts turns a chat trace into prompts (a conversation is document
// Conv).
func Prompts(turns []Turn) []Prompt {
	out := make([]Prompt, len(turns))
	for i, tu := range turns {
		out[i] = Prompt{{tu.Conv, tu.Chunks}}
	}
	return out
}

// Family is one trace of the evaluation. Returns says whether its
// conversations (or documents) come back after the pool would have had to
// let them go: where a policy that keeps the right prefixes can beat LRU.
type Family struct {
	Name    string
	Trace   []Prompt
	Returns bool
	// Online, where the family draws each prompt independently of what
	// the pool holds, bounds the hits an online policy expects with a
	// pool of capacity chunks (online.go); nil elsewhere.
	Online func(capacity int) float64
}

// Families is the evaluation's traces: round-robin multi-turn chat of 4 to
// 32 conversations extended by 1 to 4 chunks a turn, random-order
// multi-turn chat, many short chats, shared system prompts with short
// questions, RAG (shared documents in varying order) and chat with a scan
// mixed in.
func Families() []Family {
	system, rag := SystemPrompts(3000, 3), RAG(3000, 4)
	return []Family{
		{"round-robin-4x4", Prompts(RoundRobin(4, 4, 12)), true, nil},
		{"round-robin-14x2", Prompts(RoundRobin(14, 2, 10)), true, nil},
		{"round-robin-32x1", Prompts(RoundRobin(32, 1, 12)), true, nil},
		{"round-robin-8x3", Prompts(RoundRobin(8, 3, 14)), true, nil},
		{"random-order", Prompts(RandomOrder(3000, 24, 1)), true,
			func(c int) float64 { return RandomOrderSeenOnline(3000, 24, 1, c) }},
		{"short-chats", Prompts(Trace(3000, 60, 60, 2)), true, nil},
		{"system-prompts", system, true,
			func(c int) float64 { return FixedPopularityOnline(system, c, SystemPromptsChance()) }},
		{"rag", rag, true,
			func(c int) float64 { return FixedPopularityOnline(rag, c, RAGChance()) }},
		{"chat-and-scan", ChatAndScan(3000, 5), true, nil},
	}
}

// RoundRobin is multi-turn chat served in turn: convs conversations, each
// extended by perTurn chunks a turn, turns rounds; round t asks
// conversation c for its first perTurn×t chunks. A conversation comes back
// after every other one was served: under recency every conversation is
// the least recently used when it returns.
func RoundRobin(convs, perTurn, turns int) []Turn {
	out := make([]Turn, 0, convs*turns)
	for t := 1; t <= turns; t++ {
		for c := 1; c <= convs; c++ {
			out = append(out, Turn{Conv: c, Chunks: perTurn * t})
		}
	}
	return out
}

// RandomOrder is multi-turn chat where each prompt extends one of open
// conversations picked at random, by 1 to 3 chunks; a conversation ends
// after 4 to 16 turns and a new one takes its place.
func RandomOrder(n, open int, seed uint64) []Turn {
	turns, _ := randomOrder(n, open, seed)
	return turns
}

// randomOrder is RandomOrder and, for each prompt, the chunks the open
// conversations held before it (RandomOrderOnline's bound).
func randomOrder(n, open int, seed uint64) ([]Turn, []int) {
	r := rand.New(rand.NewPCG(seed, 7))
	type conv struct{ id, turns, left, chunks int }
	next := 0
	fresh := func() *conv {
		next++
		return &conv{id: next, left: 4 + r.IntN(13)}
	}
	convs := make([]*conv, open)
	for i := range convs {
		convs[i] = fresh()
	}
	out, held := make([]Turn, n), make([]int, n)
	total := 0
	for i := range out {
		held[i] = total
		j := r.IntN(open)
		c := convs[j]
		grow := 1 + r.IntN(3)
		c.chunks += grow
		total += grow
		c.turns++
		out[i] = Turn{Conv: c.id, Chunks: c.chunks}
		if c.turns == c.left {
			total -= c.chunks
			convs[j] = fresh()
		}
	}
	return out, held
}

// Document numbers of the prompt families, apart from conversations'.
const (
	systemDoc   = 1 << 24 // system prompts
	documentDoc = 1 << 25 // RAG documents
	questionDoc = 1 << 26 // questions asked once
	scanDoc     = 1 << 27 // scanned documents
)

// zipf is the parameters of a rand.Zipf, shared by a family's generator
// and its chances (FixedPopularityOnline).
type zipf struct {
	s, v float64
	imax int
}

func (z zipf) of(r *rand.Rand) *rand.Zipf { return rand.NewZipf(r, z.s, z.v, uint64(z.imax)) }

// The popularities of the system prompts (8) and of the RAG documents
// (120).
func systemZipf() zipf { return zipf{1.2, 1, 7} }
func ragZipf() zipf    { return zipf{1.3, 2, 119} }

// SystemPrompts is long shared system prompts (8 of them, 12 chunks each,
// the first picked by half the prompts, Zipf for the rest) each followed
// by a question of 1 or 2 chunks asked once: only the system prompts can
// hit.
func SystemPrompts(n int, seed uint64) []Prompt {
	r := rand.New(rand.NewPCG(seed, 8))
	z := systemZipf().of(r)
	out := make([]Prompt, n)
	for i := range out {
		out[i] = Prompt{{systemDoc + int(z.Uint64()), 12}, {questionDoc + i, 1 + r.IntN(2)}}
	}
	return out
}

// RAG is retrieval: a system prompt of 2 chunks, then 3 of 120 documents
// (4 chunks each, Zipf popularity) in the order the retriever ranked them,
// then a question asked once. A document shares chunks only across
// prompts that put the same documents before it.
func RAG(n int, seed uint64) []Prompt {
	r := rand.New(rand.NewPCG(seed, 9))
	z := ragZipf().of(r)
	out := make([]Prompt, n)
	for i := range out {
		p := Prompt{{systemDoc, 2}}
		for range 3 {
			p = append(p, Seg{documentDoc + int(z.Uint64()), 4})
		}
		out[i] = append(p, Seg{questionDoc + i, 1})
	}
	return out
}

// ChatAndScan is RandomOrder chat (16 conversations open) with a scan
// mixed in: every third prompt reads the next of 40 documents of 6 chunks
// in order, over and over (240 chunks, which a pool of the chat's working
// set cannot also hold).
func ChatAndScan(n int, seed uint64) []Prompt {
	chat := Prompts(RandomOrder(n, 16, seed))
	out := make([]Prompt, 0, n+n/2)
	next := 0
	for i, p := range chat {
		out = append(out, p)
		if i%2 == 1 {
			out = append(out, Prompt{{scanDoc + next, 6}})
			next = (next + 1) % 40
		}
	}
	return out
}

// ChunkIDs is the identity of each chunk of p: a chain over (document,
// index), as the chunk keys chain over tokens.
func ChunkIDs(p Prompt) []uint64 {
	out := make([]uint64, 0, p.Len())
	h := uint64(0x9e3779b97f4a7c15)
	for _, s := range p {
		for c := range s.N {
			h = mix(h ^ mix(uint64(s.Doc)<<20|uint64(c)))
			out = append(out, h)
		}
	}
	return out
}

func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// Live is the most chunks trace ever needs resident to miss only first
// requests: over its prompts, the peak of the chunks asked for before and
// again later (the working set the evaluation sizes its pools by).
func Live(trace []Prompt) int {
	first, last := map[uint64]int{}, map[uint64]int{}
	for i, p := range trace {
		for _, id := range ChunkIDs(p) {
			if _, ok := first[id]; !ok {
				first[id] = i
			}
			last[id] = i
		}
	}
	delta := make([]int, len(trace)+1)
	for id, f := range first {
		if l := last[id]; l > f {
			delta[f]++
			delta[l]--
		}
	}
	peak, live := 0, 0
	for _, d := range delta {
		live += d
		peak = max(peak, live)
	}
	return peak
}

// OfflineHits is the chunks Belady's MIN hits on trace with a pool of
// capacity chunks: each prompt hits its leading resident chunks, then
// each chunk it missed, in order, takes the place of the resident chunk
// asked for again the latest (never first; at a tie the deeper one), or is
// not stored when it is itself that chunk. Ties going to the deeper chunk
// keep every resident chunk's parent resident, so each hit is a prefix
// hit: no policy that stores what missed (or less) hits more, on chunks of
// one size. It is the bound the policies are judged against.
func OfflineHits(trace []Prompt, capacity int) int {
	ids := make([][]uint64, len(trace))
	for i, p := range trace {
		ids[i] = ChunkIDs(p)
	}
	const never = int(^uint(0) >> 1)
	next := make([][]int, len(trace)) // the next prompt asking for each chunk
	later := map[uint64]int{}
	for i := len(trace) - 1; i >= 0; i-- {
		next[i] = make([]int, len(ids[i]))
		for j, id := range ids[i] {
			if n, ok := later[id]; ok {
				next[i][j] = n
			} else {
				next[i][j] = never
			}
		}
		for _, id := range ids[i] {
			later[id] = i
		}
	}
	ver := map[uint64]int{} // resident chunks, by the version of their entry
	h := &minHeap{}
	seq := 0
	hits := 0
	for i := range trace {
		n := 0
		for n < len(ids[i]) && ver[ids[i][n]] != 0 {
			n++
		}
		hits += n
		for j, id := range ids[i] {
			e := minEntry{id: id, next: next[i][j], depth: j}
			if j >= n {
				for len(ver) >= capacity && h.Len() > 0 {
					top := (*h)[0]
					if ver[top.id] != top.ver {
						heap.Pop(h) // stale
						continue
					}
					if !h.less(e, top) {
						break // e is the one to go
					}
					heap.Pop(h)
					delete(ver, top.id)
				}
				if len(ver) >= capacity {
					break // this chunk and the deeper ones are not stored
				}
			}
			seq++
			e.ver = seq
			ver[id] = seq
			heap.Push(h, e)
		}
	}
	return hits
}

// minEntry is a resident chunk in OfflineHits's heap, latest next use (then
// deepest) first; ver tells a stale entry.
type minEntry struct {
	id               uint64
	next, depth, ver int
}

type minHeap []minEntry

func (h minHeap) Len() int           { return len(h) }
func (h minHeap) Less(a, b int) bool { return h.less(h[b], h[a]) }

// less reports whether a goes after b: asked for sooner, or as soon and
// shallower.
func (minHeap) less(a, b minEntry) bool {
	if a.next != b.next {
		return a.next < b.next
	}
	return a.depth < b.depth
}
func (h minHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *minHeap) Push(x any)   { *h = append(*h, x.(minEntry)) }
func (h *minHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
