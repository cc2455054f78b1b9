package chat

import "testing"

// TestTraceWithContextOpensOnTheContext: every conversation's first prompt
// is its context and 1 to 3 chunks, and Trace is TraceWithContext without
// one, prompt for prompt.
func TestTraceWithContextOpensOnTheContext(t *testing.T) {
	plain := Trace(2000, 8, 8, 3)
	long := TraceWithContext(2000, 8, 8, 50, 3)
	seen := map[int]bool{}
	for i, tu := range long {
		if tu.Conv != plain[i].Conv || tu.Chunks != plain[i].Chunks+50 {
			t.Fatalf("prompt %d: %+v with the context, %+v without", i, tu, plain[i])
		}
		if !seen[tu.Conv] && (tu.Chunks < 51 || tu.Chunks > 53) {
			t.Fatalf("conversation %d opens on %d chunks, want 51 to 53", tu.Conv, tu.Chunks)
		}
		seen[tu.Conv] = true
	}
}

// TestLiveSetCountsOpenConversations: the live set of a trace of 8 open
// conversations is about 8 conversations' chunks, far below WorkingSet,
// which counts the ones that ended in the last eighth too.
func TestLiveSetCountsOpenConversations(t *testing.T) {
	tr := TraceWithContext(4000, 8, 8, 100, 3)
	live, ws := LiveSet(tr), WorkingSet(tr)
	t.Logf("live set %d chunks, working set %d", live, ws)
	if live < 8*100 || live > 8*(100+48) {
		t.Fatalf("live set %d chunks, want between %d and %d (8 conversations of 100 to 148)", live, 8*100, 8*148)
	}
	if ws < 2*live {
		t.Fatalf("working set %d not above twice the live set %d", ws, live)
	}
}
