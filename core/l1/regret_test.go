package l1

import (
	"fmt"
	"sort"
	"testing"

	"kvdock/core/keys"
)

// regretObserver records, for each eviction, the prompt being replayed
// and the chunk evicted.
type regretObserver struct {
	now     *int
	evicted *[]regretEviction
}

type regretEviction struct {
	at    int
	chunk keys.Hash
}

func (regretObserver) Stored(*keys.ObjectKey, int64) {}
func (regretObserver) Tick(float64, float64)         {}
func (regretObserver) Cleared()                      {}
func (o regretObserver) Lost(k *keys.ObjectKey, _ int64, why Loss) {
	if why == LossEvicted {
		*o.evicted = append(*o.evicted, regretEviction{*o.now, k.Chunk})
	}
}

// BenchmarkEvictionRegret replays the chat traces at 0.5× their working
// set, on demand, and tells the evictions a policy regrets: of the chunks
// evicted over the second half, those asked for again within 400 prompts,
// and the median prompts until an evicted chunk that comes back does.
// (docs/BENCHMARKS.md: why chat with think time lost to LRU.)
//
//	go test -run '^$' -bench EvictionRegret -benchtime 1x ./core/l1
func BenchmarkEvictionRegret(b *testing.B) {
	h, err := keys.NewHasher(accChunkTokens, keys.AlgorithmBLAKE3)
	if err != nil {
		b.Fatal(err)
	}
	for _, tr := range []evictionTrace{
		{name: "multi-turn", trace: multiTurnTrace(40_000, 1)},
		{name: "chat-think", trace: chatTrace(40_000, 400, 400, 6)},
	} {
		size := max(int64(0.5*float64(workingSet(tr.trace, accAlign)))/accAlign*accAlign, 64*accAlign)
		prompts := make([][]keys.ObjectKey, len(tr.trace))
		uses := map[keys.Hash][]int{} // chunk → the prompts that ask for it
		for i, rq := range tr.trace {
			var tokens []uint32
			for _, c := range rq.chunks {
				tokens = append(tokens, c...)
			}
			prompts[i] = keys.ObjectKeys(h.Hashes(tokens), "m", 1, nil, "")
			for _, k := range prompts[i] {
				uses[k.Chunk] = append(uses[k.Chunk], i)
			}
		}
		for _, pol := range []string{PolicyLRU, PolicyPrefix} {
			b.Run(fmt.Sprintf("%s/%s", tr.name, pol), func(b *testing.B) {
				for range b.N {
					hit, asked, evicted, back, median := regretReplay(b, prompts, uses, size, pol)
					b.ReportMetric(100*float64(hit)/float64(asked), "hit%")
					b.ReportMetric(float64(evicted), "evicted")
					b.ReportMetric(float64(back), "evicted-back-within-400")
					b.ReportMetric(float64(median), "median-prompts-until-back")
				}
			})
		}
	}
}

// regretReplay drives one pool: LOOKUP (read locks on the hit run), the
// retrieve, the store of the prompt, END_SESSION's touch.
func regretReplay(b *testing.B, prompts [][]keys.ObjectKey, uses map[keys.Hash][]int, size int64, pol string) (hit, asked, evicted, back, median int) {
	now := 0
	var ev []regretEviction
	p, err := Open(Options{Size: size, Align: accAlign, Policy: pol, Observer: regretObserver{&now, &ev}})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	for i, ks := range prompts {
		now = i
		n := p.ReserveReadPrefix(ks, 1)
		p.FinishRead(ks[:n], 1)
		if n < len(ks) {
			res, err := p.ReserveWrite(InstanceOwner(1), ks, accAlign)
			if err != nil {
				b.Fatalf("prompt %d: store: %v", i, err)
			}
			p.FinishWrite(res)
		}
		p.Touch(ks[:n])
		if i >= len(prompts)/2 {
			hit += n
			asked += len(ks)
		}
	}
	var until []int
	for _, e := range ev {
		if e.at < len(prompts)/2 {
			continue
		}
		evicted++
		u := uses[e.chunk]
		if j := sort.SearchInts(u, e.at+1); j < len(u) {
			until = append(until, u[j]-e.at)
			if u[j]-e.at < 400 {
				back++
			}
		}
	}
	if len(until) > 0 {
		sort.Ints(until)
		median = until[len(until)/2]
	}
	return hit, asked, evicted, back, median
}
