package kvevents

import (
	"encoding/binary"
	"math"
	"slices"
)

// encodeBatch appends to dst vLLM's EventBatch, always positional:
// [ts, [events...], data_parallel_rank]. Events are tagged maps with the keys
// in vLLM's declaration order, or positional arrays led by the tag (array).
// Hashes are integers; fields without a default are always present.
//
// The msgpack is appended by hand, in its smallest forms: a batch is most
// of the publisher's work (a 256-token chunk is 256 integers), and a
// general encoder's call per integer cost several times as much
// (BenchmarkTrackerFlush).
func encodeBatch(dst []byte, ts float64, evs []Event, blockSize int, array bool, dpRank int) []byte {
	n := 16
	for i := range evs {
		n += 64 + 9*len(evs[i].Hashes) + 5*evs[i].tokenCount()
	}
	b := mpArray(slices.Grow(dst, n), 3)
	b = append(b, 0xcb)
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(ts))
	b = mpArray(b, len(evs))
	for i := range evs {
		b = encodeEvent(b, &evs[i], blockSize, array)
	}
	return mpUint(b, uint64(dpRank))
}

func encodeEvent(b []byte, ev *Event, blockSize int, array bool) []byte {
	field := func(b []byte, name string) []byte {
		if array {
			return b
		}
		return mpStr(b, name)
	}
	if ev.Stored {
		if array {
			b = mpArray(b, 8)
		} else {
			b = mpStr(mpMap(b, 8), "type")
		}
		b = mpStr(b, "BlockStored")
		b = hashes(field(b, "block_hashes"), ev.Hashes)
		b = field(b, "parent_block_hash")
		if ev.HasParent {
			b = mpUint(b, ev.Parent)
		} else {
			b = append(b, 0xc0)
		}
		b = mpArray(field(b, "token_ids"), ev.tokenCount())
		for _, run := range ev.Tokens {
			b = appendTokens(b, run)
		}
		b = mpUint(field(b, "block_size"), uint64(blockSize))
		b = append(field(b, "lora_id"), 0xc0)
		b = mpStr(field(b, "medium"), ev.Medium)
		return append(field(b, "lora_name"), 0xc0)
	}
	if array {
		b = mpArray(b, 3)
	} else {
		b = mpStr(mpMap(b, 3), "type")
	}
	b = mpStr(b, "BlockRemoved")
	b = hashes(field(b, "block_hashes"), ev.Hashes)
	return mpStr(field(b, "medium"), ev.Medium)
}

// tokenCount is the number of ev's tokens, over its runs.
func (ev *Event) tokenCount() int {
	n := 0
	for _, run := range ev.Tokens {
		n += len(run)
	}
	return n
}

// appendTokens appends run as msgpack unsigned integers, each in its
// smallest form. Token ids are most of a batch's bytes, so the room is
// grown once for the run and the bytes written in place, not appended one
// call at a time (encode_ns/store in BenchmarkStorePublish).
func appendTokens(b []byte, run []uint32) []byte {
	n := len(b)
	b = slices.Grow(b, 5*len(run))[:n+5*len(run)]
	for _, tk := range run {
		d := b[n : n+5]
		switch {
		case tk < 0x80:
			d[0] = byte(tk)
			n++
		case tk <= math.MaxUint8:
			d[0], d[1] = 0xcc, byte(tk)
			n += 2
		case tk <= math.MaxUint16:
			d[0], d[1], d[2] = 0xcd, byte(tk>>8), byte(tk)
			n += 3
		default:
			d[0], d[1], d[2], d[3], d[4] = 0xce, byte(tk>>24), byte(tk>>16), byte(tk>>8), byte(tk)
			n += 5
		}
	}
	return b[:n]
}

func hashes(b []byte, hs []uint64) []byte {
	b = mpArray(b, len(hs))
	for _, h := range hs {
		b = mpUint(b, h)
	}
	return b
}

// mpUint appends v as a msgpack unsigned integer in its smallest form.
func mpUint(b []byte, v uint64) []byte {
	switch {
	case v < 0x80:
		return append(b, byte(v))
	case v <= math.MaxUint8:
		return append(b, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}

// mpStr appends s as a msgpack str.
func mpStr(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

// mpArray appends the header of a msgpack array of n items.
func mpArray(b []byte, n int) []byte { return mpLen(b, n, 0x90, 0xdc) }

// mpMap appends the header of a msgpack map of n pairs.
func mpMap(b []byte, n int) []byte { return mpLen(b, n, 0x80, 0xde) }

// mpLen appends a container header: fix (n < 16), 16-bit or 32-bit length.
func mpLen(b []byte, n int, fix, c16 byte) []byte {
	switch {
	case n < 16:
		return append(b, fix|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, c16), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, c16+1), uint32(n))
}
