package l1

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"kvdock/core/keys"
	"kvdock/core/testkit/chat"
)

// familyResult is what one replay of a family measured over the whole
// trace.
type familyResult struct {
	asked, hit int
	final      Stats
}

// replayFamily drives a pool of poolChunks objects under policy with trace
// the way a worker drives kvdock: LOOKUP (read locks on the leading hits),
// retrieve (the locks end), then a store of the chunks that missed, after
// the last hit (a mid-prompt store) or from the prompt's start. With tick
// > 0 the watermark loop runs every tick prompts; 0 evicts on demand only.
func replayFamily(tb testing.TB, trace []chat.Prompt, poolChunks int, policy string, tick int) familyResult {
	tb.Helper()
	p, h := replayPool(tb, int64(poolChunks)*accAlign, policy, nil)
	defer p.Close()
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
		if n < len(ks) && len(ks) <= poolChunks {
			replayStore(tb, p, ks, n, i)
		}
		p.Touch(ks) // END_SESSION
	}
	out.final = p.Stats()
	return out
}

// replayStore stores the chunks of ks from n on, after ks[n-1] when n > 0
// (a mid-prompt store); a store past the worker's lock cap fails.
func replayStore(tb testing.TB, p *Pool, ks []keys.ObjectKey, n, prompt int) {
	tb.Helper()
	owner := InstanceOwner(1)
	var res []Reservation
	var err error
	{
		if n == 0 {
			res, err = p.ReserveWrite(owner, ks, accAlign)
		} else {
			res, err = p.ReserveWriteAfter(owner, ks[n-1:n], ks[n:], accAlign)
		}
	}
	if errors.Is(err, ErrLockCap) {
		return // more than a worker may hold locked: the store fails
	}
	if err != nil {
		tb.Fatalf("prompt %d: store %d chunks: %v", prompt, len(ks)-n, err)
	}
	if !p.FinishWrite(res) {
		tb.Fatalf("prompt %d: store not published", prompt)
	}
}

// familySizes are the pools a family is replayed with, as multiples of
// its working set (chat.Live); round-robin chat also at a quarter, where
// its working set is four times the pool.
func familySizes(f chat.Family) []float64 {
	if strings.HasPrefix(f.Name, "round-robin") {
		return []float64{0.25, 0.5, 1, 2}
	}
	return []float64{0.5, 1, 2}
}

// familyPool is the pool of x times a working set of ws chunks.
func familyPool(ws int, x float64) int { return max(int(x*float64(ws)), 32) }

// familyRun is one family at one pool size: each policy's hits and the
// offline bound (Belady's MIN, or the best policy where a policy beat it:
// MIN does not evict in batches).
type familyRun struct {
	pool, asked int
	lru, prefix int
	bound       int
	online      float64 // chat.Family.Online at this pool; 0 where none
	end         Stats   // the prefix pool at the end
}

func runFamily(tb testing.TB, f chat.Family, x float64) familyRun {
	pool := familyPool(chat.Live(f.Trace), x)
	l := replayFamily(tb, f.Trace, pool, PolicyLRU, 0)
	p := replayFamily(tb, f.Trace, pool, PolicyPrefix, 0)
	r := familyRun{pool: pool, asked: l.asked, lru: l.hit, prefix: p.hit,
		bound: max(chat.OfflineHits(f.Trace, pool), l.hit, p.hit), end: p.final}
	if f.Online != nil {
		r.online = f.Online(pool)
	}
	return r
}

// TestEvictionFamilies replays every trace family at each pool size under
// LRU and prefix, evicting on demand: prefix hits no more than a point of
// the chunks asked below LRU anywhere, at least 1.2× LRU's chunks on
// round-robin chat wherever its working set exceeds the pool, and keeps
// every resident byte usable. Each policy's share of the offline bound is
// logged (docs/BENCHMARKS.md has the table).
func TestEvictionFamilies(t *testing.T) {
	if raceDetector {
		t.Skip("sequential replay; run without -race")
	}
	for _, f := range chat.Families() {
		for _, x := range familySizes(f) {
			r := runFamily(t, f, x)
			d := 100 * float64(r.prefix-r.lru) / float64(r.asked)
			online := ""
			if r.online > 0 {
				online = fmt.Sprintf("; online bound %.0f: LRU %.2f of it, prefix %.2f", r.online, float64(r.lru)/r.online, float64(r.prefix)/r.online)
			}
			t.Logf("%-17s %.2f× (%4d chunks): LRU %5d (%.2f of the bound), prefix %5d (%.2f), bound %5d; %+.1f points%s",
				f.Name, x, r.pool, r.lru, float64(r.lru)/float64(r.bound), r.prefix, float64(r.prefix)/float64(r.bound), r.bound, d, online)
			if d < -1 {
				t.Errorf("%s at %.2f×: prefix hits %.1f points below LRU", f.Name, x, -d)
			}
			// Where the pool is short and conversations return in an order
			// their gaps tell (docs/BENCHMARKS.md says where none can gain).
			rr := strings.HasPrefix(f.Name, "round-robin")
			if (rr || f.Name == "short-chats") && x < 1 && float64(r.prefix) < 1.2*float64(r.lru) {
				t.Errorf("%s at %.2f×: prefix hits %d chunks, LRU %d: want ≥ 1.2×", f.Name, x, r.prefix, r.lru)
			}
			if rr && x >= 0.5 && float64(r.prefix) < 0.8*float64(r.bound) {
				t.Errorf("%s at %.2f×: prefix hits %d chunks, under 0.8 of the bound %d", f.Name, x, r.prefix, r.bound)
			}
			if u := r.end.UsableRatio(); u != 1 {
				t.Errorf("%s at %.2f×: prefix usable/resident %.4f at the end", f.Name, x, u)
			}
		}
	}
}

// TestRoundRobinChat is the trace of issue 37: 14 conversations served in
// turn, each extended by 2 chunks a turn for 10 turns, a pool of 128
// chunks (the trace needs 280), each turn a LOOKUP, the retrieve of the
// hits and a mid-prompt store of the misses. LRU hits 334 chunks; the
// prefix policy used to hit 252 (recency evicts the conversation that
// comes back next, and tail-first eviction handed each conversation's
// deficit, grown by its new turn, to the next one, until all missed).
func TestRoundRobinChat(t *testing.T) {
	trace := chat.Prompts(chat.RoundRobin(14, 2, 10))
	l := replayFamily(t, trace, 128, PolicyLRU, 0)
	p := replayFamily(t, trace, 128, PolicyPrefix, 0)
	bound := chat.OfflineHits(trace, 128)
	t.Logf("LRU %d, prefix %d, Belady's MIN %d chunks hit of %d", l.hit, p.hit, bound, l.asked)
	if float64(p.hit) < 1.2*float64(l.hit) {
		t.Errorf("prefix hits %d chunks, LRU %d: want ≥ 1.2×", p.hit, l.hit)
	}
	if float64(p.hit) < 0.8*float64(bound) {
		t.Errorf("prefix hits %d chunks, under 0.8 of the bound %d", p.hit, bound)
	}
}

// docPrompt is the keys of a prompt of document doc's first n chunks.
func docPrompt(h *keys.Hasher, doc uint64, n int) []keys.ObjectKey {
	var tokens []uint32
	for c := range n {
		tokens = append(tokens, chunkTokens(doc, c)...)
	}
	return keys.ObjectKeys(h.Hashes(tokens), "m", 1, nil, "")
}

// TestStoreKeepsItsOwnPrompt: a store that must evict never evicts the
// prompt it extends. The conversation just looked up is the one due the
// latest, and its last hit chunk is a leaf, so without the pin its own
// store would take it and leave the new chunks without their parent:
// resident, unusable, a miss at the next turn. The next victim is a
// prompt stored once and not used since, which admission lets go
// (nextuse.Admits).
func TestStoreKeepsItsOwnPrompt(t *testing.T) {
	p, h := replayPool(t, 16*accAlign, PolicyPrefix, nil)
	defer p.Close()
	conv := func(doc uint64, n int) []keys.ObjectKey { return docPrompt(h, doc, n) }
	store := func(prev, ks []keys.ObjectKey) {
		t.Helper()
		res, err := p.ReserveWriteAfter(InstanceOwner(1), prev, ks, accAlign)
		if err != nil || !p.FinishWrite(res) {
			t.Fatalf("store of %d chunks: %v", len(ks), err)
		}
	}
	look := func(ks []keys.ObjectKey, want int) {
		t.Helper()
		if n := p.ReserveReadPrefix(ks, 1); n != want {
			t.Fatalf("lookup hits %d chunks, want %d", n, want)
		}
		p.FinishRead(ks[:want], 1)
	}
	for doc := range uint64(3) {
		store(nil, conv(doc, 4)) // three conversations
	}
	for doc := range uint64(3) {
		look(conv(doc, 4), 4) // a round of turns: each learns its gap
	}
	a := conv(0, 6)
	look(a, 4)
	store(nil, conv(9, 4)) // a prompt stored once fills the pool
	look(a, 4)
	store(a[3:4], a[4:]) // its next turn: two chunks, two evictions
	if n := p.ReserveReadPrefix(a, 1); n != 6 {
		t.Errorf("after its store, conversation 0 hits %d of its 6 chunks", n)
	}
	p.FinishRead(a, 1)
	if u := p.Stats().UsableRatio(); u != 1 {
		t.Errorf("usable/resident %.4f after the store, want 1", u)
	}
}
