package l1

import "kvdock/core/testkit/chat"

// chatTrace is chat.Trace as prompts: chat with think time, where a
// conversation comes back after the ones served since it was last served
// (multiTurnTrace's next prompt picks any open conversation alike).
func chatTrace(n, open int, think float64, seed uint64) []traceReq {
	turns := chat.Trace(n, open, think, seed)
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
