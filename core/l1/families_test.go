package l1

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"kvdock/core/keys"
	"kvdock/core/testkit/chat"
)

// familyResult is what one replay of a family measured over the whole
// trace.
type familyResult struct {
	asked, hit int
	scanHit    int
	final      Stats
}

// replayFamily drives a pool of poolChunks objects under policy with trace
// the way a worker drives kvdock: LOOKUP (read locks on the leading hits),
// retrieve (the locks end), then a store of the chunks that missed, after
// the last hit (a mid-prompt store) or from the prompt's start. With tick
// > 0 the watermark loop runs every tick prompts; 0 evicts on demand only.
func replayFamily(tb testing.TB, trace []chat.Prompt, poolChunks int, policy string, tick int) familyResult {
	tb.Helper()
	p, err := Open(Options{Size: int64(poolChunks) * accAlign, Align: accAlign, Policy: policy})
	if err != nil {
		tb.Fatal(err)
	}
	defer p.Close()
	h, err := keys.NewHasher(accChunkTokens, keys.AlgorithmBLAKE3)
	if err != nil {
		tb.Fatal(err)
	}
	owner := InstanceOwner(1)
	var out familyResult
	var tokens []uint32
	for i, pr := range trace {
		if tick > 0 && i%tick == 0 {
			p.Maintain()
		}
		tokens = tokens[:0]
		for _, s := range pr {
			for c := range s.N {
				tokens = append(tokens, chunkTokens(uint64(s.Doc), c)...)
			}
		}
		ks := keys.ObjectKeys(h.Hashes(tokens), "m", 1, nil, "")
		n := p.ReserveReadPrefix(ks, 1)
		p.FinishRead(ks[:n], 1)
		out.asked += len(ks)
		out.hit += n
		if pr[0].Doc >= 1<<27 {
			out.scanHit += n
		}
		if n == len(ks) || len(ks) > poolChunks {
			continue
		}
		var res []Reservation
		if n == 0 {
			res, err = p.ReserveWrite(owner, ks, accAlign)
		} else {
			res, err = p.ReserveWriteAfter(owner, ks[n-1:n], ks[n:], accAlign)
		}
		if errors.Is(err, ErrLockCap) {
			continue // more than a worker may hold locked: the store fails
		}
		if err != nil {
			tb.Fatalf("prompt %d: store %d chunks: %v", i, len(ks)-n, err)
		}
		if !p.FinishWrite(res) {
			tb.Fatalf("prompt %d: store not published", i)
		}
	}
	out.final = p.Stats()
	return out
}

func TestZZFamilies(t *testing.T) {
	for _, f := range chat.Families() {
		ws := chat.Live(f.Trace)
		for _, x := range []float64{0.25, 0.5, 1, 2} {
			pool := max(int(x*float64(ws)), 32)
			l := replayFamily(t, f.Trace, pool, PolicyLRU, 0)
			p := replayFamily(t, f.Trace, pool, PolicyPrefix, 0)
			m := chat.OfflineHits(f.Trace, pool)
			b := max(m, l.hit, p.hit)
			fmt.Printf("%-17s %4.2f L %.2f P %.2f d %+5.1f", f.Name, x, float64(l.hit)/float64(b), float64(p.hit)/float64(b), 100*float64(p.hit-l.hit)/float64(l.asked))
			if os.Getenv("SCAN") != "" {
				fmt.Printf(" scan L %d P %d", l.scanHit, p.scanHit)
			}
			fmt.Println()
		}
	}
}
