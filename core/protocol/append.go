package protocol

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Raw is a result that is already one encoded msgpack document; AppendEncode
// (and so the rpc server's reply path) writes it as it is. Handlers return it
// to build a large reply in one exactly sized buffer instead of having it
// copied again by the encoder.
type Raw []byte

// The append helpers below write what msgpack.Encoder writes for the same
// value (shortest ints, fixstr/str8/16/32, fixmap/fixarray/16/32), without an
// encoder or a bytes.Buffer; tests compare them byte for byte.

func appendMapLen(b []byte, n int) []byte {
	return appendHeader(b, n, msgpcode.FixedMapLow, msgpcode.Map16, msgpcode.Map32)
}

func appendArrayLen(b []byte, n int) []byte {
	return appendHeader(b, n, msgpcode.FixedArrayLow, msgpcode.Array16, msgpcode.Array32)
}

// appendHeader writes a map or array header of n elements in its shortest form.
func appendHeader(b []byte, n int, fix, c16, c32 byte) []byte {
	switch {
	case n < 16:
		return append(b, fix|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, c16), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, c32), uint32(n))
}

func appendStr(b []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		b = append(b, msgpcode.FixedStrLow|byte(n))
	case n <= math.MaxUint8:
		b = append(b, msgpcode.Str8, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, msgpcode.Str16), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, msgpcode.Str32), uint32(n))
	}
	return append(b, s...)
}

func appendUint(b []byte, n uint64) []byte {
	switch {
	case n <= math.MaxInt8:
		return append(b, byte(n))
	case n <= math.MaxUint8:
		return append(b, msgpcode.Uint8, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, msgpcode.Uint16), uint16(n))
	case n <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, msgpcode.Uint32), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(b, msgpcode.Uint64), n)
}

func appendInt(b []byte, n int64) []byte {
	switch {
	case n >= 0:
		return appendUint(b, uint64(n))
	case n >= int64(int8(msgpcode.NegFixedNumLow)):
		return append(b, byte(n))
	case n >= math.MinInt8:
		return append(b, msgpcode.Int8, byte(n))
	case n >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, msgpcode.Int16), uint16(n))
	case n >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, msgpcode.Int32), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(b, msgpcode.Int64), uint64(n))
}

// appendBinHeader writes the header of a bin of n bytes.
func appendBinHeader(b []byte, n int) ([]byte, error) {
	switch {
	case n <= math.MaxUint8:
		return append(b, msgpcode.Bin8, byte(n)), nil
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, msgpcode.Bin16), uint16(n)), nil
	case n <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, msgpcode.Bin32), uint32(n)), nil
	}
	return nil, fmt.Errorf("msgpack encode: %d bytes exceed the bin32 limit", n)
}

// keySize bounds the encoded size of k (exact for the token array).
func (k Key) keySize() int {
	return 96 + len(k.ModelName) + len(k.RequestID) + len(k.CacheSalt) + 5*len(k.TokenIDs)
}

// AppendMsgpack appends k encoded exactly as EncodeMsgpack writes it.
func (k Key) AppendMsgpack(b []byte) []byte {
	if need := k.keySize(); cap(b)-len(b) < need {
		nb := make([]byte, len(b), len(b)+need)
		copy(nb, b)
		b = nb
	}
	b = appendMapLen(b, 8)
	b = appendStr(appendStr(b, "model_name"), k.ModelName)
	b = appendInt(appendStr(b, "world_size"), int64(k.WorldSize))
	b = appendStr(b, "worker_id")
	if k.WorkerID == nil {
		b = append(b, msgpcode.Nil)
	} else {
		b = appendInt(b, int64(*k.WorkerID))
	}
	b = appendArrayLen(appendStr(b, "token_ids"), len(k.TokenIDs))
	for _, t := range k.TokenIDs {
		b = appendUint(b, uint64(t))
	}
	b = appendInt(appendStr(b, "start"), int64(k.Start))
	b = appendInt(appendStr(b, "end"), int64(k.End))
	b = appendStr(appendStr(b, "request_id"), k.RequestID)
	b = appendStr(appendStr(b, "cache_salt"), k.CacheSalt)
	return b
}

// PickleReplySize is the exact size AppendPickleRetrieveReply writes for a
// pickle of n bytes.
func PickleReplySize(n int) int { return RetrieveReplySize(n, 1) }

// RetrieveReplySize is the exact size AppendRetrieveReply writes for a
// pickle of n bytes and an encoded context of ctxLen bytes.
func RetrieveReplySize(n, ctxLen int) int {
	// fixmap(3) + "success" + bool + "data" + bin header + n + "context" + context
	hdr := 5
	switch {
	case n <= math.MaxUint8:
		hdr = 2
	case n <= math.MaxUint16:
		hdr = 3
	}
	return 1 + 8 + 1 + 5 + hdr + n + 8 + ctxLen
}

// AppendPickleRetrieveReply writes a successful PREPARE_RETRIEVE reply whose
// data is the n bytes fill appends (fill must append exactly n bytes), the
// same document PrepareRetrieveResponse{Success: true, Data: …} encodes to.
// With dst's spare capacity at least PickleReplySize(n) nothing is reallocated.
func AppendPickleRetrieveReply(dst []byte, n int, fill func([]byte) ([]byte, error)) ([]byte, error) {
	return AppendRetrieveReply(dst, n, fill, nil)
}

// AppendRetrieveReply is AppendPickleRetrieveReply with the reply's context
// given as its encoding (ctx, from AppendContext; nil: the empty map): the
// document PrepareRetrieveResponse{Success: true, Data: …, Slots: …} encodes
// to. With dst's spare capacity at least RetrieveReplySize(n, len(ctx))
// nothing is reallocated.
func AppendRetrieveReply(dst []byte, n int, fill func([]byte) ([]byte, error), ctx []byte) ([]byte, error) {
	dst = appendMapLen(dst, 3)
	dst = append(appendStr(dst, "success"), msgpcode.True)
	dst = appendStr(dst, "data")
	dst, err := appendBinHeader(dst, n)
	if err != nil {
		return nil, err
	}
	start := len(dst)
	if dst, err = fill(dst); err != nil {
		return nil, err
	}
	if got := len(dst) - start; got != n {
		return nil, fmt.Errorf("pickle reply: data of %d bytes, header says %d", got, n)
	}
	dst = appendStr(dst, "context")
	if ctx == nil {
		return appendMapLen(dst, 0), nil
	}
	return append(dst, ctx...), nil
}
