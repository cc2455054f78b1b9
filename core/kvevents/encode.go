package kvevents

import (
	"bytes"

	"github.com/vmihailenco/msgpack/v5"
)

// encodeBatch writes vLLM's EventBatch, always positional:
// [ts, [events...], data_parallel_rank]. Events are tagged maps with the keys
// in vLLM's declaration order, or positional arrays led by the tag (array).
// Hashes are integers; fields without a default are always present.
func encodeBatch(ts float64, evs []Event, blockSize int, medium string, array bool, dpRank int) []byte {
	var b bytes.Buffer
	e := msgpack.NewEncoder(&b)
	// Writes to a bytes.Buffer cannot fail.
	_ = e.EncodeArrayLen(3)
	_ = e.EncodeFloat64(ts)
	_ = e.EncodeArrayLen(len(evs))
	for i := range evs {
		encodeEvent(e, &evs[i], blockSize, medium, array)
	}
	_ = e.EncodeInt(int64(dpRank))
	return b.Bytes()
}

func encodeEvent(e *msgpack.Encoder, ev *Event, blockSize int, medium string, array bool) {
	field := func(name string) {
		if !array {
			_ = e.EncodeString(name)
		}
	}
	if ev.Stored {
		if array {
			_ = e.EncodeArrayLen(8)
		} else {
			_ = e.EncodeMapLen(8)
			_ = e.EncodeString("type")
		}
		_ = e.EncodeString("BlockStored")
		field("block_hashes")
		hashes(e, ev.Hashes)
		field("parent_block_hash")
		if ev.HasParent {
			_ = e.EncodeUint(ev.Parent)
		} else {
			_ = e.EncodeNil()
		}
		field("token_ids")
		_ = e.EncodeArrayLen(len(ev.Tokens))
		for _, tk := range ev.Tokens {
			_ = e.EncodeUint(uint64(tk))
		}
		field("block_size")
		_ = e.EncodeInt(int64(blockSize))
		field("lora_id")
		_ = e.EncodeNil()
		field("medium")
		_ = e.EncodeString(medium)
		field("lora_name")
		_ = e.EncodeNil()
		return
	}
	if array {
		_ = e.EncodeArrayLen(3)
	} else {
		_ = e.EncodeMapLen(3)
		_ = e.EncodeString("type")
	}
	_ = e.EncodeString("BlockRemoved")
	field("block_hashes")
	hashes(e, ev.Hashes)
	field("medium")
	_ = e.EncodeString(medium)
}

func hashes(e *msgpack.Encoder, hs []uint64) {
	_ = e.EncodeArrayLen(len(hs))
	for _, h := range hs {
		_ = e.EncodeUint(h)
	}
}
