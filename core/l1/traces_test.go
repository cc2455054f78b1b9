package l1

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"kvdock/core/testkit/chat"
)

// Traces for the eviction policies: the shapes of prefix traffic the prefix
// policy is for, and a scan, each a slice of prompts (traceReq).

// multiTurnTrace is chat: 400 conversations open at a time, each prompt a
// conversation's whole history plus its new turn (1 to 3 chunks), the
// conversation picked at random; one ends after 4 to 16 turns and a new
// one takes its place (chat.RandomOrder).
func multiTurnTrace(n int, seed uint64) []traceReq {
	return prompts(chat.RandomOrder(n, 400, seed))
}

// appendChunks appends the first n chunks of prompt to ch.
func appendChunks(ch [][]uint32, prompt uint64, n int) [][]uint32 {
	for c := range n {
		ch = append(ch, chunkTokens(prompt, c))
	}
	return ch
}

// systemPromptTrace is one system prompt of 12 chunks shared by every
// prompt, then a user's context (4 chunks, 3000 users, Zipf) and a
// question of 1 to 2 chunks asked once.
func systemPromptTrace(n int, seed uint64) []traceReq {
	r := rand.New(rand.NewPCG(seed, 4))
	z := rand.NewZipf(r, 1.05, 2, 2999)
	out := make([]traceReq, n)
	unique := uint64(1 << 41)
	for i := range out {
		var ch [][]uint32
		ch = appendChunks(ch, 7, 12)
		u := z.Uint64()
		ch = appendChunks(ch, 1<<30+u, 4)
		for range 1 + r.IntN(2) {
			unique++
			ch = append(ch, chunkTokens(unique, 0))
		}
		out[i] = traceReq{chunks: ch}
	}
	return out
}

// ragTrace is retrieval: a system prompt of 2 chunks, then 3 of 400
// documents (4 chunks each, Zipf popularity) in the order the retriever
// ranked them, then a question asked once.
func ragTrace(n int, seed uint64) []traceReq {
	r := rand.New(rand.NewPCG(seed, 5))
	z := rand.NewZipf(r, 1.2, 2, 399)
	out := make([]traceReq, n)
	unique := uint64(1 << 42)
	for i := range out {
		var ch [][]uint32
		ch = appendChunks(ch, 11, 2)
		for range 3 {
			d := z.Uint64()
			ch = appendChunks(ch, 1<<31+d, 4)
		}
		unique++
		ch = append(ch, chunkTokens(unique, 0))
		out[i] = traceReq{chunks: ch}
	}
	return out
}

// workingSet is the bytes of the distinct chunks that the last eighth of
// trace asks for more than once (a chunk asked once can never hit), with
// objects of size bytes: what a pool must hold for the traffic of a while.
func workingSet(trace []traceReq, size int64) int64 {
	seen := map[string]int{}
	for _, rq := range trace[len(trace)*7/8:] {
		prefix := ""
		for _, c := range rq.chunks {
			prefix += fmt.Sprint(c[:2]) // the chain: a chunk is its prefix
			seen[prefix]++
		}
	}
	n := int64(0)
	for _, v := range seen {
		if v > 1 {
			n++
		}
	}
	return n * size
}

// evictionTrace is one trace of the evaluation.
type evictionTrace struct {
	name  string
	trace []traceReq
	tick  int   // requests between two ticks of the watermark loop
	base  int64 // the pool sizes' unit in bytes; 0: the working set
}

func evictionTraces() []evictionTrace {
	long, live := longChatTrace(8_000, 8, 8, 100, 6)
	return []evictionTrace{
		{"long-context-chat", long, 4, live},
		{"long-context-chat-ondemand", long, 1 << 30, live},
		{"multi-turn", multiTurnTrace(40_000, 1), 100, 0},
		{"chat-think", chatTrace(40_000, 400, 400, 6), 100, 0},
		{"multi-turn-ondemand", multiTurnTrace(40_000, 1), 1 << 30, 0},
		{"chat-think-ondemand", chatTrace(40_000, 400, 400, 6), 1 << 30, 0},
		{"system-prompt", systemPromptTrace(40_000, 2), 100, 0},
		{"rag", ragTrace(40_000, 3), 100, 0},
		{"zipf-prefix", zipfTrace(40_000, 4), 100, 0},
		{"scan", scanTrace(40_000, 1200, 5), 100, 0},
	}
}

// BenchmarkEvictionTraces replays each trace through real pools of 0.5×, 1×
// and 2× its working set under each policy and reports the hit ratio (%),
// the hit tokens per GiB of pool, usable ÷ resident bytes (mean over the
// measured half, and at the end), and the watermark loop's CPU per evicted
// object. Then the trace families (chat.Families, on demand, whole trace):
// each policy's hit ratio and its share of the offline bound.
//
//	go test -run '^$' -bench BenchmarkEvictionTraces -benchtime 1x ./core/l1
//	go test -run '^$' -bench 'BenchmarkEvictionTraces/family' -benchtime 1x ./core/l1
func BenchmarkEvictionTraces(b *testing.B) {
	for _, f := range chat.Families() {
		for _, x := range familySizes(f) {
			b.Run(fmt.Sprintf("family/%s/%.2fx", f.Name, x), func(b *testing.B) {
				var r familyRun
				for range b.N {
					r = runFamily(b, f, x)
				}
				b.ReportMetric(100*float64(r.lru)/float64(r.asked), "LRU-hit%")
				b.ReportMetric(100*float64(r.prefix)/float64(r.asked), "prefix-hit%")
				b.ReportMetric(float64(r.lru)/float64(r.bound), "LRU/bound")
				b.ReportMetric(float64(r.prefix)/float64(r.bound), "prefix/bound")
				b.ReportMetric(r.end.UsableRatio(), "usable/resident-end")
			})
		}
	}
	models := []traceModel{{"m", accAlign}, {"m2", accAlign}} // zipf-prefix uses two
	for _, tr := range evictionTraces() {
		ws := tr.base
		if ws == 0 {
			ws = workingSet(tr.trace, accAlign)
		}
		for _, f := range []float64{0.5, 1, 2} {
			size := max(int64(f*float64(ws))/accAlign*accAlign, 64*accAlign)
			for _, pol := range []string{PolicyLRU, PolicyPrefix} {
				b.Run(fmt.Sprintf("%s/%.1fx/%s", tr.name, f, pol), func(b *testing.B) {
					var res replayResult
					for range b.N {
						res = replayPolicy(b, tr.trace, models, size, tr.tick, nil, pol)
					}
					b.ReportMetric(100*res.hitRatio(), "hit%")
					b.ReportMetric(float64(res.hit*int64(res.chunkTokens))/(float64(size)/(1<<30)), "hit-tokens/GiB")
					b.ReportMetric(res.usable/res.res, "usable/resident")
					b.ReportMetric(res.final.UsableRatio(), "usable/resident-end")
					if res.evicted > 0 {
						b.ReportMetric(float64(res.evictTime.Nanoseconds())/float64(res.evicted), "evict-ns/obj")
					}
				})
			}
		}
	}
}
