package l1

import "kvdock/core/testkit/chat"

// chatTrace is chat.Trace as prompts: chat with think time, where a
// conversation comes back after the ones served since it was last served
// (multiTurnTrace's next prompt picks any open conversation alike).
func chatTrace(n, open int, think float64, seed uint64) []traceReq {
	return prompts(chat.Trace(n, open, think, seed))
}

// longChatTrace is chat.TraceWithContext as prompts, and its live set in
// bytes of accAlign objects (the pool sizes of its evaluation are
// multiples of the live set: its working set counts the many conversations
// that ended in the last eighth).
func longChatTrace(n, open int, think float64, context int, seed uint64) ([]traceReq, int64) {
	turns := chat.TraceWithContext(n, open, think, context, seed)
	return prompts(turns), int64(chat.LiveSet(turns)) * accAlign
}

func prompts(turns []chat.Turn) []traceReq {
	out := make([]traceReq, len(turns))
	for i, tu := range turns {
		ch := make([][]uint32, tu.Chunks)
		for c := range ch {
			ch[c] = chunkTokens(uint64(tu.Conv)<<20|uint64(c), 1)
		}
		out[i] = traceReq{chunks: ch}
	}
	return out
}
