package protocol

import (
	"bytes"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Reply decoders are the inverse of the reply encoders above: what a worker
// (kvdock's bench, the Go tests) reads from a server. A server is a peer too,
// so they are bounded like the request decoders: every length is checked
// against the frame and the limits before anything is allocated, unknown
// fields are skipped without recursion, trailing bytes are an error.

// MaxSlotDims bounds the shape of one slot: a chunk tensor has three (MLA) or
// four dimensions.
const MaxSlotDims = 8

// minSlotBytes is the smallest encoding of a slot map carrying its four
// required keys: fixmap + "offset" 0 + "length" 0 + "shape" [] + "dtype" "".
const minSlotBytes = 1 + 7 + 1 + 7 + 1 + 6 + 1 + 6 + 1

// DecodeResult decodes a reply frame 3 as the named result type (the Result*
// names of profile tables) under lim. ResultNone and an absent frame are the
// caller's business: a reply without frame 3 is None.
func DecodeResult(result string, frame []byte, lim Limits) (any, error) {
	switch result {
	case ResultInt, ResultOptInt:
		return DecodeValueLimits(TypeInt, frame, lim)
	case ResultBool:
		return DecodeValueLimits(TypeBool, frame, lim)
	case ResultStr:
		return DecodeValueLimits(TypeStr, frame, lim)
	case ResultRegister, ResultOptRegisterReply:
		return DecodeRegisterResponse(frame, lim)
	case ResultPrepareStore:
		return DecodePrepareStoreResponse(frame, lim)
	case ResultPrepareRetrieve:
		return DecodePrepareRetrieveResponse(frame, lim)
	case ResultKVEventPoll:
		return DecodeKVEventPollResult(frame, lim)
	case ResultNone:
		return nil, fmt.Errorf("result %q carries no frame, got %d bytes", result, len(frame))
	}
	return nil, fmt.Errorf("unknown result type %q", result)
}

// newDec starts decoding one reply frame.
func newDec(frame []byte, lim Limits) *dec {
	r := bytes.NewReader(frame)
	return &dec{d: msgpack.NewDecoder(r), r: r, frame: frame, lim: lim.withDefaults()}
}

// finish reports trailing bytes and wraps err with what was decoded.
func (x *dec) finish(what string, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if x.r.Len() != 0 {
		return fmt.Errorf("%s: %d trailing bytes", what, x.r.Len())
	}
	return nil
}

// DecodeRegisterResponse reads {shm_name, pool_size}; both have defaults
// upstream ("" and 0), so either may be missing.
func DecodeRegisterResponse(frame []byte, lim Limits) (RegisterResponse, error) {
	x := newDec(frame, lim)
	var r RegisterResponse
	err := mapFields(x, func(name string) (bool, error) {
		var err error
		switch name {
		case "shm_name":
			r.ShmName, err = x.str()
		case "pool_size":
			r.PoolSize, err = decodeInt(x.d)
			if err == nil && r.PoolSize < 0 {
				err = fmt.Errorf("%d is negative", r.PoolSize)
			}
		default:
			return false, nil
		}
		return true, err
	})
	if err := x.finish("register response", err); err != nil {
		return RegisterResponse{}, err
	}
	return r, nil
}

// DecodePrepareStoreResponse reads {"context": {...}}. Shm is true when the
// context carries "slots" (an empty list: everything cached or no room);
// ChunkIndices is nil when the context has none (the worker then takes
// 0..len(Slots)-1).
func DecodePrepareStoreResponse(frame []byte, lim Limits) (PrepareStoreResponse, error) {
	x := newDec(frame, lim)
	var r PrepareStoreResponse
	err := mapFields(x, func(name string) (bool, error) {
		if name != "context" {
			return false, nil
		}
		return true, mapFields(x, func(name string) (bool, error) {
			var err error
			switch name {
			case "slots":
				r.Shm = true
				r.Slots, err = decodeSlots(x)
			case "chunk_indices":
				r.ChunkIndices, err = decodeIndices(x)
			case "group_ids":
				r.GroupIDs, err = decodeIndices(x)
			default:
				return false, nil
			}
			return true, err
		})
	})
	if err := x.finish("prepare_store response", err); err != nil {
		return PrepareStoreResponse{}, err
	}
	return r, nil
}

// DecodePrepareRetrieveResponse reads {success, data, context}. Data is a
// slice of frame, not a copy (a pickle of many chunks is not copied again);
// Slots is nil when the context carries none.
func DecodePrepareRetrieveResponse(frame []byte, lim Limits) (PrepareRetrieveResponse, error) {
	x := newDec(frame, lim)
	var r PrepareRetrieveResponse
	req := required{"success": false}
	err := mapFields(x, func(name string) (bool, error) {
		var err error
		if _, ok := req[name]; ok {
			req[name] = true
		}
		switch name {
		case "success":
			r.Success, err = decodeLooseBool(x.d)
		case "data":
			r.Data, err = x.bin()
		case "context":
			err = mapFields(x, func(name string) (bool, error) {
				var err error
				switch name {
				case "slots":
					r.Slots, err = decodeSlots(x)
				case "group_ids":
					r.GroupIDs, err = decodeIndices(x)
				default:
					return false, nil
				}
				return true, err
			})
		default:
			return false, nil
		}
		return true, err
	})
	if err == nil {
		err = req.check("prepare_retrieve response")
	}
	if err := x.finish("prepare_retrieve response", err); err != nil {
		return PrepareRetrieveResponse{}, err
	}
	return r, nil
}

// bin reads a msgpack bin as a slice of the frame.
func (x *dec) bin() ([]byte, error) {
	c, err := x.d.PeekCode()
	if err != nil {
		return nil, err
	}
	if !msgpcode.IsBin(c) {
		return nil, fmt.Errorf("expected bin, got code 0x%02x", c)
	}
	start := x.pos()
	end, err := skipValue(x.frame, start)
	if err != nil {
		return nil, err
	}
	b, err := decodeBin(x.frame[start:end])
	if err != nil {
		return nil, err
	}
	if _, err := x.r.Seek(int64(end), io.SeekStart); err != nil {
		return nil, err
	}
	return b, nil
}

// decodeSlots reads an array of slot maps. The count is bounded by the frame
// (each slot takes minSlotBytes at least) and by lim.MaxTokens (one slot per
// chunk, and a chunk holds one token at least).
func decodeSlots(x *dec) ([]Slot, error) {
	n, err := decodeArrayLen(x.d)
	if err != nil {
		return nil, err
	}
	if n > remaining(x.d)/minSlotBytes {
		return nil, fmt.Errorf("%d slots exceed frame", n)
	}
	if n > x.lim.MaxTokens {
		return nil, fmt.Errorf("%d slots exceed the limit of %d", n, x.lim.MaxTokens)
	}
	out := make([]Slot, n)
	for i := range out {
		if out[i], err = decodeSlot(x); err != nil {
			return nil, fmt.Errorf("slot %d: %w", i, err)
		}
	}
	return out, nil
}

// decodeSlot reads one {offset, length, shape, dtype}; all four are required
// and none may be negative.
func decodeSlot(x *dec) (Slot, error) {
	d := x.d
	var s Slot
	req := required{"offset": false, "length": false, "shape": false, "dtype": false}
	nonNeg := func(v int64, err error) (int64, error) {
		if err == nil && v < 0 {
			err = fmt.Errorf("%d is negative", v)
		}
		return v, err
	}
	err := mapFields(x, func(name string) (bool, error) {
		var err error
		if _, ok := req[name]; ok {
			req[name] = true
		}
		switch name {
		case "offset":
			s.Offset, err = nonNeg(decodeInt(d))
		case "length":
			s.Length, err = nonNeg(decodeInt(d))
		case "shape":
			s.Shape, err = decodeShape(d)
		case "dtype":
			s.Dtype, err = x.str()
		default:
			return false, nil
		}
		return true, err
	})
	if err != nil {
		return Slot{}, err
	}
	return s, req.check("slot")
}

func decodeShape(d *msgpack.Decoder) ([]int, error) {
	n, err := decodeArrayLen(d)
	if err != nil {
		return nil, err
	}
	if n > MaxSlotDims {
		return nil, fmt.Errorf("%d dimensions exceed the limit of %d", n, MaxSlotDims)
	}
	out := make([]int, n)
	for i := range out {
		v, err := decodeInt(d)
		if err != nil {
			return nil, fmt.Errorf("dimension %d: %w", i, err)
		}
		if v < 0 || v > math.MaxInt32 {
			return nil, fmt.Errorf("dimension %d: %d out of range", i, v)
		}
		out[i] = int(v)
	}
	return out, nil
}

// decodeIndices reads chunk_indices: non-negative ints, at most lim.MaxTokens.
func decodeIndices(x *dec) ([]int, error) {
	n, err := decodeArrayLen(x.d)
	if err != nil {
		return nil, err
	}
	if n > x.lim.MaxTokens {
		return nil, fmt.Errorf("%d chunk indices exceed the limit of %d", n, x.lim.MaxTokens)
	}
	out := make([]int, n)
	for i := range out {
		v, err := decodeInt(x.d)
		if err != nil {
			return nil, fmt.Errorf("index %d: %w", i, err)
		}
		if v < 0 || v > math.MaxInt32 {
			return nil, fmt.Errorf("index %d: %d out of range", i, v)
		}
		out[i] = int(v)
	}
	return out, nil
}
