// Package eviction replays the eviction policies through the wire: a
// multi-turn chat trace (chat.Trace: conversations return after the ones
// served meanwhile) replayed against the real binary under LRU and under
// prefix, by a scheduler and a Go SHM worker doing what LMCache does each
// turn (LOOKUP of the whole conversation, PREPARE/COMMIT_RETRIEVE of the
// hits, PREPARE/COMMIT_STORE of the whole prompt, which stores what is
// missing, or of the misses alone, a mid-prompt store; END_SESSION).
//
// A replay is one goroutine, so the race detector has nothing to find in
// it and would stretch it to minutes: the tests skip under -race, and
// task test runs this package without it.
package eviction

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"kvdock/core/protocol"
	"kvdock/core/testkit/chat"
	"kvdock/tests/harness"
)

// Chunks of 16 tokens: 4 KiB with the Go worker's geometry, so a small
// pool holds many.
const (
	wireChunkTokens = 16
	wireChunkBytes  = 4096
)

// wireReplay is what one policy's replay measured over the trace's second
// half (asked, hit) and in all (wrong chunks), and the pool at the end.
type wireReplay struct {
	asked, hit, wrong int
	usable            float64
	evictions         uint64
}

// replayWire replays trace against a real kvdock with a pool of poolBytes
// under policy, storing the whole prompt each turn and counting the hits
// of the second half.
func replayWire(t *testing.T, trace []chat.Turn, poolBytes int64, policy string) wireReplay {
	return replayWireWith(t, trace, poolBytes, policy, false, len(trace)/2)
}

// replayWireWith is replayWire with, under midPrompt, a store of the
// chunks that missed only (from the first miss on: a mid-prompt store, as
// LMCache stores what its lookup did not find), counting the hits from
// turn from on.
func replayWireWith(t *testing.T, trace []chat.Turn, poolBytes int64, policy string, midPrompt bool, from int) wireReplay {
	t.Helper()
	srv := harness.Start(t, "--eviction-policy", policy, "--chunk-size", fmt.Sprint(wireChunkTokens),
		"--l1-size-gb", fmt.Sprint(float64(poolBytes)/(1<<30)))
	defer srv.Stop(t)
	sched := srv.Dial(t, srv.Protocol)
	w := harness.NewWorker(t, srv.Dial(t, srv.Protocol), 1, "chat", false)
	if w.ChunkBytes != wireChunkBytes {
		t.Fatalf("chunks of %d bytes, want %d", w.ChunkBytes, wireChunkBytes)
	}
	if w.Mode() != "shm" {
		t.Fatalf("worker in %s mode, want shm", w.Mode())
	}
	ctx := context.Background()
	var out wireReplay
	for i, tu := range trace {
		req := fmt.Sprintf("t%d", i)
		toks := harness.Tokens(tu.Conv, tu.Chunks, w.Chunk)
		hits, err := harness.LookupKeep(ctx, sched, w.Model, toks, req)
		if err != nil {
			t.Fatalf("turn %d: lookup: %v", i, err)
		}
		if hits > 0 {
			if _, err := w.Worker().Retrieve(ctx, w.Key(toks, hits, req), func(c int, chunk []byte) {
				if !bytes.Equal(chunk, harness.ChunkData(tu.Conv, c, w.ChunkBytes)) {
					out.wrong++
				}
			}); err != nil {
				t.Fatalf("turn %d: retrieve %d chunks: %v", i, hits, err)
			}
		}
		if hits < tu.Chunks {
			first := 0
			if midPrompt {
				first = hits
			}
			data := make([][]byte, tu.Chunks-first)
			for c := range data {
				data[c] = harness.ChunkData(tu.Conv, first+c, w.ChunkBytes)
			}
			k := w.Key(toks, tu.Chunks, req)
			k.Start = first * w.Chunk
			if _, err := w.Worker().Store(ctx, k, data); err != nil {
				t.Fatalf("turn %d: store of chunks %d to %d: %v", i, first, tu.Chunks, err)
			}
		}
		if _, err := sched.Call(ctx, protocol.EndSession, req); err != nil {
			t.Fatalf("turn %d: end session: %v", i, err)
		}
		if i >= from {
			out.asked += tu.Chunks
			out.hit += hits
		}
	}
	p := srv.Status(t).Pool
	out.usable, out.evictions = p.UsableRatio, p.Evictions
	return out
}

// TestEvictionPoliciesOnTheWire replays the chat trace under LRU and under
// prefix with a pool of half its working set: no wrong byte under either,
// the prefix pool's resident bytes all usable at the end, and prefix no more
// than a point below LRU. The ratio of their hits is logged, not asserted
// (docs/BENCHMARKS.md has the figures).
func TestEvictionPoliciesOnTheWire(t *testing.T) {
	if harness.RaceDetector {
		t.Skip("sequential replay; task test runs it without -race")
	}
	trace := chat.Trace(4000, 100, 100, 1)
	ws := chat.WorkingSet(trace)
	pool := int64(ws/2) * wireChunkBytes
	res := map[string]wireReplay{}
	for _, pol := range []string{"LRU", "prefix"} {
		r := replayWire(t, trace, pool, pol)
		res[pol] = r
		t.Logf("%s: %d of %d chunks hit (%.2f%%) over the second half; %d wrong; usable/resident %.4f at the end; %d evictions",
			pol, r.hit, r.asked, 100*float64(r.hit)/float64(r.asked), r.wrong, r.usable, r.evictions)
		if r.wrong != 0 {
			t.Errorf("%s: %d chunks retrieved with wrong bytes", pol, r.wrong)
		}
		if r.evictions == 0 {
			t.Errorf("%s: no eviction: the pool (%d bytes) held the trace (working set %d chunks)", pol, pool, ws)
		}
	}
	lru, pre := res["LRU"], res["prefix"]
	t.Logf("working set %d chunks, pool %d chunks; prefix hits %.3f× LRU's", ws, pool/wireChunkBytes, float64(pre.hit)/float64(lru.hit))
	if pre.usable < 0.99 {
		t.Errorf("prefix: usable/resident %.4f at the end, want ≥ 0.99", pre.usable)
	}
	if d := 100 * float64(lru.hit-pre.hit) / float64(lru.asked); d > 1 {
		t.Errorf("prefix hit %.2f points below LRU", d)
	}
}

// TestEvictionPoliciesOnTheWireLongContext replays long-context chat
// (chat.TraceWithContext: 8 conversations open, each opening on a context
// of 100 chunks and extended by 1 to 3 a turn) with pools of 0.5×, 1× and
// 2× its live set, where one prompt is an eighth of the pool or more. LRU,
// evicting a conversation's first chunks first, strands the rest of it;
// prefix keeps its head. Prefix must hit at least 1.2× the chunks LRU hits
// at 1×, never a point less at any size, with no wrong byte and every
// resident byte usable at the end.
func TestEvictionPoliciesOnTheWireLongContext(t *testing.T) {
	if harness.RaceDetector {
		t.Skip("sequential replay; task test runs it without -race")
	}
	trace := chat.TraceWithContext(1500, 8, 8, 100, 6)
	live := chat.LiveSet(trace)
	for _, f := range []float64{0.5, 1, 2} {
		pool := int64(f*float64(live)) * wireChunkBytes
		res := map[string]wireReplay{}
		for _, pol := range []string{"LRU", "prefix"} {
			r := replayWire(t, trace, pool, pol)
			res[pol] = r
			t.Logf("%.1f× live set, %s: %d of %d chunks hit (%.2f%%) over the second half; %d wrong; usable/resident %.4f at the end; %d evictions",
				f, pol, r.hit, r.asked, 100*float64(r.hit)/float64(r.asked), r.wrong, r.usable, r.evictions)
			if r.wrong != 0 {
				t.Errorf("%s: %d chunks retrieved with wrong bytes", pol, r.wrong)
			}
		}
		lru, pre := res["LRU"], res["prefix"]
		ratio := float64(pre.hit) / float64(max(lru.hit, 1))
		t.Logf("%.1f× live set (%d chunks): prefix hits %.3f× LRU's", f, pool/wireChunkBytes, ratio)
		if pre.usable < 0.99 {
			t.Errorf("%.1f×: prefix usable/resident %.4f at the end, want ≥ 0.99", f, pre.usable)
		}
		if d := 100 * float64(lru.hit-pre.hit) / float64(lru.asked); d > 1 {
			t.Errorf("%.1f×: prefix hit %.2f points below LRU", f, d)
		}
		if f == 1 && ratio < 1.2 {
			t.Errorf("1× live set: prefix hits %.3f× LRU's, want ≥ 1.2×", ratio)
		}
	}
}

// TestEvictionPoliciesOnTheWireRoundRobin replays round-robin chat (issue
// 37: 14 conversations served in turn, each extended by 2 chunks a turn for
// 10 turns; working set 252 chunks) under LRU and prefix, each turn a
// LOOKUP, the retrieve of the hits and a mid-prompt store of the misses,
// with pools of 128 chunks (the issue's; about half the working set), 1×
// and 2× the working set. Recency evicts the conversation that returns
// next; prefix, evicting by predicted next use, must hit at least 1.2× LRU's
// chunks where the working set exceeds the pool and no more than a point
// less elsewhere, with no wrong byte and every resident byte usable at the
// end.
func TestEvictionPoliciesOnTheWireRoundRobin(t *testing.T) {
	if harness.RaceDetector {
		t.Skip("sequential replay; task test runs it without -race")
	}
	trace := chat.RoundRobin(14, 2, 10)
	ws := chat.Live(chat.Prompts(trace))
	for _, chunks := range []int{128, ws, 2 * ws} {
		pool := int64(chunks) * wireChunkBytes
		res := map[string]wireReplay{}
		for _, pol := range []string{"LRU", "prefix"} {
			r := replayWireWith(t, trace, pool, pol, true, 0)
			res[pol] = r
			t.Logf("%d chunks, %s: %d of %d chunks hit (%.2f%%); %d wrong; usable/resident %.4f at the end; %d evictions",
				chunks, pol, r.hit, r.asked, 100*float64(r.hit)/float64(r.asked), r.wrong, r.usable, r.evictions)
			if r.wrong != 0 {
				t.Errorf("%d chunks, %s: %d chunks retrieved with wrong bytes", chunks, pol, r.wrong)
			}
		}
		lru, pre := res["LRU"], res["prefix"]
		ratio := float64(pre.hit) / float64(max(lru.hit, 1))
		t.Logf("%d-chunk pool, working set %d: prefix hits %.3f× LRU's", chunks, ws, ratio)
		if pre.usable != 1 {
			t.Errorf("%d chunks: prefix usable/resident %.4f at the end, want 1.000", chunks, pre.usable)
		}
		if d := 100 * float64(lru.hit-pre.hit) / float64(lru.asked); d > 1 {
			t.Errorf("%d chunks: prefix hit %.2f points below LRU", chunks, d)
		}
		if chunks < ws && ratio < 1.2 {
			t.Errorf("%d chunks (working set %d): prefix hits %.3f× LRU's, want ≥ 1.2×", chunks, ws, ratio)
		}
	}
}
