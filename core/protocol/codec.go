package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Payload type names used in profile tables and what a handler receives for each.
const (
	TypeKey      = "key"              // Key
	TypeInt      = "int"              // int64
	TypeOptInt   = "int?"             // int64, or nil for msgpack nil
	TypeBool     = "bool"             // bool
	TypeFloat    = "float"            // float64 (finite; ints accepted)
	TypeStr      = "str"              // string
	TypeBytes    = "bytes"            // []byte, a slice of the received frame
	TypeRegister = "register_payload" // RegisterPayload
	TypeRecords  = "records"          // []BlockAllocationRecord
)

// Result type names used in profile tables (documentation for clients; the
// server encodes whatever the handler returns).
const (
	ResultNone             = "none"
	ResultInt              = "int"
	ResultOptInt           = "int?"
	ResultBool             = "bool"
	ResultStr              = "str"
	ResultRegister         = "register_response"
	ResultPrepareStore     = "prepare_store_response"
	ResultPrepareRetrieve  = "prepare_retrieve_response"
	ResultOptRegisterReply = "register_response?"
	ResultStrList          = "list[str]"
	ResultKVEventPoll      = "kv_event_poll_result"
)

func knownPayloadType(t string) bool {
	switch t {
	case TypeKey, TypeInt, TypeOptInt, TypeBool, TypeFloat, TypeStr, TypeBytes, TypeRegister, TypeRecords:
		return true
	}
	return false
}

func knownResultType(t string) bool {
	switch t {
	case ResultNone, ResultInt, ResultOptInt, ResultBool, ResultStr, ResultRegister,
		ResultPrepareStore, ResultPrepareRetrieve, ResultOptRegisterReply, ResultStrList, ResultKVEventPoll:
		return true
	}
	return false
}

// DecodeValue decodes one payload frame as the named type under DefaultLimits.
// The whole frame must be one msgpack document; trailing bytes are an error
// (msgspec rejects them too). TypeBytes returns a slice of frame, not a copy.
func DecodeValue(typ string, frame []byte) (any, error) {
	return DecodeValueLimits(typ, frame, DefaultLimits())
}

// dec is one frame being decoded: the msgpack decoder reads from r, a reader
// over frame (so fast paths can parse frame's bytes and seek r past them).
type dec struct {
	d     *msgpack.Decoder
	r     *bytes.Reader
	frame []byte
	lim   Limits
	ints  int // ints decoded so far into records (bounded by lim.MaxTokens)
}

// pos is the offset in frame of the next byte the decoder reads.
func (x *dec) pos() int { return len(x.frame) - x.r.Len() }

// skip skips one value of any type without recursion (skipValue).
func (x *dec) skip() error {
	pos := x.pos()
	end, err := skipValue(x.frame, pos)
	if err != nil {
		return err
	}
	_, err = x.r.Seek(int64(end-pos), io.SeekCurrent)
	return err
}

// DecodeValueLimits is DecodeValue under the given limits (zero fields take
// the defaults).
func DecodeValueLimits(typ string, frame []byte, lim Limits) (any, error) {
	switch typ {
	case TypeBytes:
		return decodeBin(frame)
	case TypeInt:
		// Hot path (uid and type frames of every request): no decoder.
		if n, ok := fastInt(frame); ok {
			return n, nil
		}
	}
	r := bytes.NewReader(frame)
	d := msgpack.NewDecoder(r)
	x := &dec{d: d, r: r, frame: frame, lim: lim.withDefaults()}
	var (
		v   any
		err error
	)
	switch typ {
	case TypeKey:
		v, err = decodeKey(x)
	case TypeInt:
		v, err = decodeLooseInt(d)
	case TypeOptInt:
		// An untyped nil for msgpack nil (so a handler's args[i] == nil
		// holds), an int64 otherwise.
		var isNil bool
		if isNil, err = peekNil(d); err == nil && !isNil {
			v, err = decodeLooseInt(d)
		}
	case TypeBool:
		v, err = decodeLooseBool(d)
	case TypeFloat:
		v, err = decodeFloat(d)
	case TypeStr:
		v, err = x.str()
	case TypeRegister:
		v, err = decodeRegister(x)
	case TypeRecords:
		v, err = decodeRecords(x)
	default:
		return nil, fmt.Errorf("unknown payload type %q", typ)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", typ, err)
	}
	if r.Len() != 0 {
		return nil, fmt.Errorf("%s: %d trailing bytes", typ, r.Len())
	}
	return v, nil
}

// fastInt decodes a frame that is exactly one msgpack int; ok is false for
// anything else (the caller then takes the general path for the error).
func fastInt(b []byte) (int64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	c := b[0]
	switch {
	case c <= 0x7f && len(b) == 1:
		return int64(c), true
	case c >= 0xe0 && len(b) == 1:
		return int64(int8(c)), true
	}
	be := func(n int) (uint64, bool) {
		if len(b) != 1+n {
			return 0, false
		}
		var v uint64
		for _, x := range b[1:] {
			v = v<<8 | uint64(x)
		}
		return v, true
	}
	switch c {
	case msgpcode.Uint8, msgpcode.Uint16, msgpcode.Uint32, msgpcode.Uint64:
		v, ok := be(1 << (c - msgpcode.Uint8))
		if !ok || v > math.MaxInt64 {
			return 0, false
		}
		return int64(v), true
	case msgpcode.Int8:
		v, ok := be(1)
		return int64(int8(v)), ok
	case msgpcode.Int16:
		v, ok := be(2)
		return int64(int16(v)), ok
	case msgpcode.Int32:
		v, ok := be(4)
		return int64(int32(v)), ok
	case msgpcode.Int64:
		v, ok := be(8)
		return int64(v), ok
	}
	return 0, false
}

// decodeBin reads a msgpack bin document and returns its body as a slice of frame.
func decodeBin(frame []byte) ([]byte, error) {
	if len(frame) == 0 {
		return nil, errors.New("bytes: empty frame")
	}
	var n, hdr int
	switch frame[0] {
	case msgpcode.Bin8:
		if len(frame) < 2 {
			return nil, errors.New("bytes: truncated bin8 header")
		}
		n, hdr = int(frame[1]), 2
	case msgpcode.Bin16:
		if len(frame) < 3 {
			return nil, errors.New("bytes: truncated bin16 header")
		}
		n, hdr = int(frame[1])<<8|int(frame[2]), 3
	case msgpcode.Bin32:
		if len(frame) < 5 {
			return nil, errors.New("bytes: truncated bin32 header")
		}
		n = int(uint32(frame[1])<<24 | uint32(frame[2])<<16 | uint32(frame[3])<<8 | uint32(frame[4]))
		hdr = 5
	default:
		return nil, fmt.Errorf("bytes: expected msgpack bin, got code 0x%02x", frame[0])
	}
	if len(frame)-hdr != n {
		return nil, fmt.Errorf("bytes: bin length %d, frame carries %d", n, len(frame)-hdr)
	}
	return frame[hdr : hdr+n : hdr+n], nil
}

// remaining is how many bytes the decoder has left; DecodeValue always reads
// from a bytes.Reader.
func remaining(d *msgpack.Decoder) int {
	if r, ok := d.Buffered().(*bytes.Reader); ok {
		return r.Len()
	}
	return math.MaxInt
}

func peekNil(d *msgpack.Decoder) (bool, error) {
	c, err := d.PeekCode()
	if err != nil {
		return false, err
	}
	if c == msgpcode.Nil {
		return true, d.DecodeNil()
	}
	return false, nil
}

func isIntCode(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64)
}

// decodeInt accepts every msgpack int width and nothing else.
func decodeInt(d *msgpack.Decoder) (int64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	if !isIntCode(c) {
		return 0, fmt.Errorf("expected int, got code 0x%02x", c)
	}
	if c == msgpcode.Uint64 {
		u, err := d.DecodeUint64()
		if err != nil {
			return 0, err
		}
		if u > math.MaxInt64 {
			return 0, fmt.Errorf("int %d out of range", u)
		}
		return int64(u), nil
	}
	return d.DecodeInt64()
}

// decodeLooseInt is a top-level int payload: upstream decodes untyped and calls
// int(), so a bool is accepted as 0/1.
func decodeLooseInt(d *msgpack.Decoder) (int64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.True || c == msgpcode.False {
		b, err := d.DecodeBool()
		if b {
			return 1, err
		}
		return 0, err
	}
	return decodeInt(d)
}

// decodeLooseBool accepts a bool or an int (upstream calls bool()).
func decodeLooseBool(d *msgpack.Decoder) (bool, error) {
	c, err := d.PeekCode()
	if err != nil {
		return false, err
	}
	if c == msgpcode.True || c == msgpcode.False {
		return d.DecodeBool()
	}
	n, err := decodeInt(d)
	return n != 0, err
}

// decodeStr reads a string of at most max bytes; the length is checked before
// anything is allocated, and a longer string is an error that does not quote it.
func decodeStr(d *msgpack.Decoder, max int) (string, error) {
	c, err := d.PeekCode()
	if err != nil {
		return "", err
	}
	if !msgpcode.IsString(c) {
		return "", fmt.Errorf("expected str, got code 0x%02x", c)
	}
	n, err := d.DecodeBytesLen()
	if err != nil {
		return "", err
	}
	if n > max {
		return "", fmt.Errorf("str of %d bytes exceeds the limit of %d", n, max)
	}
	if n > remaining(d) {
		return "", fmt.Errorf("str length %d exceeds frame", n)
	}
	b := make([]byte, n)
	if err := d.ReadFull(b); err != nil {
		return "", err
	}
	return string(b), nil
}

// str is decodeStr at x's position: a fixstr or str8 that the frame holds
// is read straight from the frame's bytes (one allocation, the string's);
// anything else, and every error, goes through decodeStr from the same
// position, so results and error messages are those of the general path.
func (x *dec) str() (string, error) {
	if b, ok := x.strBytes(); ok {
		return string(b), nil
	}
	return decodeStr(x.d, x.lim.MaxString)
}

// key is str for a map key: a field name the decoders know is returned as
// that constant, without allocating.
func (x *dec) key() (string, error) {
	if b, ok := x.strBytes(); ok {
		return fieldName(b), nil
	}
	return decodeStr(x.d, x.lim.MaxString)
}

// strBytes reads a fixstr or str8 of at most lim.MaxString bytes that the
// frame holds and moves past it; ok false (nothing read) for anything else.
func (x *dec) strBytes() ([]byte, bool) {
	pos := x.pos()
	if pos < 0 || pos >= len(x.frame) {
		return nil, false
	}
	n, head := 0, 0
	switch c := x.frame[pos]; {
	case msgpcode.IsFixedString(c):
		n, head = int(c&msgpcode.FixedStrMask), 1
	case c == msgpcode.Str8 && pos+1 < len(x.frame):
		n, head = int(x.frame[pos+1]), 2
	default:
		return nil, false
	}
	end := pos + head + n
	if n > x.lim.MaxString || end > len(x.frame) {
		return nil, false
	}
	if _, err := x.r.Seek(int64(head+n), io.SeekCurrent); err != nil {
		return nil, false
	}
	return x.frame[pos+head : end], true
}

// fieldName returns the field names the decoders know as constants (the
// switch compares without converting b); any other name is a copy.
func fieldName(b []byte) string {
	switch string(b) {
	case "block_size":
		return "block_size"
	case "cache_salt":
		return "cache_salt"
	case "chunk_indices":
		return "chunk_indices"
	case "context":
		return "context"
	case "data":
		return "data"
	case "dtype":
		return "dtype"
	case "dtype_str":
		return "dtype_str"
	case "end":
		return "end"
	case "group_ids":
		return "group_ids"
	case "group_layouts":
		return "group_layouts"
	case "hidden_dim_size":
		return "hidden_dim_size"
	case "instance_id":
		return "instance_id"
	case "length":
		return "length"
	case "model_name":
		return "model_name"
	case "new_block_ids":
		return "new_block_ids"
	case "new_token_ids":
		return "new_token_ids"
	case "num_layers":
		return "num_layers"
	case "offset":
		return "offset"
	case "pool_size":
		return "pool_size"
	case "req_id":
		return "req_id"
	case "request_id":
		return "request_id"
	case "shape":
		return "shape"
	case "shm_name":
		return "shm_name"
	case "slots":
		return "slots"
	case "start":
		return "start"
	case "success":
		return "success"
	case "token_ids":
		return "token_ids"
	case "tokens_per_block":
		return "tokens_per_block"
	case "use_mla":
		return "use_mla"
	case "worker_id":
		return "worker_id"
	case "world_size":
		return "world_size"
	}
	return string(b)
}

func decodeSmallInt(d *msgpack.Decoder) (int, error) {
	n, err := decodeInt(d)
	if err != nil {
		return 0, err
	}
	if n < math.MinInt32 || n > math.MaxInt32 {
		return 0, fmt.Errorf("int %d out of range", n)
	}
	return int(n), nil
}

// mapFields walks a msgpack map, calling field for every string key; unknown
// keys must be skipped by field (it returns false for them).
func mapFields(x *dec, field func(name string) (bool, error)) error {
	d := x.d
	c, err := d.PeekCode()
	if err != nil {
		return err
	}
	if !msgpcode.IsFixedMap(c) && c != msgpcode.Map16 && c != msgpcode.Map32 {
		return fmt.Errorf("expected map, got code 0x%02x", c)
	}
	n, err := d.DecodeMapLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		name, err := x.key()
		if err != nil {
			return fmt.Errorf("map key: %w", err)
		}
		known, err := field(name)
		if err != nil {
			return fmt.Errorf("field %q: %w", name, err)
		}
		if !known {
			if err := x.skip(); err != nil {
				return fmt.Errorf("field %q: %w", name, err)
			}
		}
	}
	return nil
}

// required tracks which required fields a map carried.
type required map[string]bool

func (r required) check(what string) error {
	for name, seen := range r {
		if !seen {
			return fmt.Errorf("%s: missing required field %q", what, name)
		}
	}
	return nil
}

// decodeKey reads a key map.
func decodeKey(x *dec) (Key, error) {
	d := x.d
	var k Key
	req := required{"model_name": false, "world_size": false, "token_ids": false,
		"start": false, "end": false, "request_id": false}
	err := mapFields(x, func(name string) (bool, error) {
		var err error
		if _, ok := req[name]; ok {
			req[name] = true
		}
		switch name {
		case "model_name":
			k.ModelName, err = x.str()
		case "world_size":
			k.WorldSize, err = decodeSmallInt(d)
		case "worker_id":
			var isNil bool
			if isNil, err = peekNil(d); err == nil && !isNil {
				var w int
				if w, err = decodeSmallInt(d); err == nil {
					k.WorkerID = &w
				}
			}
		case "token_ids":
			k.TokenIDs, err = decodeTokens(x)
		case "start":
			k.Start, err = decodeSmallInt(d)
		case "end":
			k.End, err = decodeSmallInt(d)
		case "request_id":
			k.RequestID, err = x.str()
		case "cache_salt":
			k.CacheSalt, err = x.str()
		default:
			return false, nil
		}
		return true, err
	})
	if err != nil {
		return Key{}, err
	}
	return k, req.check("key")
}

// decodeArrayLen reads an array header whose length the frame can hold:
// every element takes at least one byte, so a lying length cannot make the
// decoder allocate more than the frame holds.
func decodeArrayLen(d *msgpack.Decoder) (int, error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, errors.New("expected array, got nil")
	}
	if n > remaining(d) {
		return 0, fmt.Errorf("array length %d exceeds frame", n)
	}
	return n, nil
}

// decodeTokens reads the token array. The common encodings (positive fixint,
// uint8/16/32) are parsed straight from the frame's bytes; anything else, and
// every error, goes through the decoder from the same position, so results and
// error messages are those of the general path.
func decodeTokens(x *dec) ([]uint32, error) {
	d, r, frame := x.d, x.r, x.frame
	if pos := len(frame) - r.Len(); pos >= 0 && pos <= len(frame) {
		if out, used, ok := fastTokens(frame[pos:], x.lim.MaxTokens); ok {
			if _, err := r.Seek(int64(used), io.SeekCurrent); err == nil {
				return out, nil
			}
		}
	}
	n, err := decodeArrayLen(d)
	if err != nil {
		return nil, err
	}
	if n > x.lim.MaxTokens {
		return nil, fmt.Errorf("%d tokens exceed the limit of %d per request", n, x.lim.MaxTokens)
	}
	out := make([]uint32, n)
	for i := range out {
		t, err := decodeInt(d)
		if err != nil {
			return nil, fmt.Errorf("token %d: %w", i, err)
		}
		if t < 0 || t > math.MaxUint32 {
			return nil, fmt.Errorf("token %d: %d out of range", i, t)
		}
		out[i] = uint32(t)
	}
	return out, nil
}

// fastTokens parses an array of at most max unsigned ints up to uint32 from b;
// ok is false for any other element, a bad header, a short frame or too many
// tokens (the general path then reports the error).
func fastTokens(b []byte, max int) (out []uint32, used int, ok bool) {
	if len(b) == 0 {
		return nil, 0, false
	}
	var n, i int
	switch c := b[0]; {
	case msgpcode.IsFixedArray(c):
		n, i = int(c&0x0f), 1
	case c == msgpcode.Array16 && len(b) >= 3:
		n, i = int(binary.BigEndian.Uint16(b[1:])), 3
	case c == msgpcode.Array32 && len(b) >= 5:
		n, i = int(binary.BigEndian.Uint32(b[1:])), 5
	default:
		return nil, 0, false
	}
	// Every element takes at least one byte (the same bound decodeArrayLen sets).
	if n > len(b)-i || n > max {
		return nil, 0, false
	}
	out = make([]uint32, n)
	for k := range out {
		if i >= len(b) {
			return nil, 0, false
		}
		c := b[i]
		switch {
		case c <= msgpcode.PosFixedNumHigh:
			out[k] = uint32(c)
			i++
		case c == msgpcode.Uint8 && i+2 <= len(b):
			out[k] = uint32(b[i+1])
			i += 2
		case c == msgpcode.Uint16 && i+3 <= len(b):
			out[k] = uint32(binary.BigEndian.Uint16(b[i+1:]))
			i += 3
		case c == msgpcode.Uint32 && i+5 <= len(b):
			out[k] = binary.BigEndian.Uint32(b[i+1:])
			i += 5
		default:
			return nil, 0, false
		}
	}
	return out, i, true
}

// decodeInts reads an int array; all arrays of one payload together hold at
// most lim.MaxTokens ints.
func decodeInts(x *dec) ([]int64, error) {
	d := x.d
	n, err := decodeArrayLen(d)
	if err != nil {
		return nil, err
	}
	if x.ints += n; x.ints > x.lim.MaxTokens {
		return nil, fmt.Errorf("more than %d ints in one payload", x.lim.MaxTokens)
	}
	out := make([]int64, n)
	for i := range out {
		if out[i], err = decodeInt(d); err != nil {
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
	}
	return out, nil
}

func decodeRegister(x *dec) (RegisterPayload, error) {
	d := x.d
	var p RegisterPayload
	req := required{"instance_id": false, "model_name": false, "world_size": false,
		"block_size": false, "num_layers": false, "hidden_dim_size": false,
		"dtype_str": false, "use_mla": false}
	err := mapFields(x, func(name string) (bool, error) {
		var err error
		if _, ok := req[name]; ok {
			req[name] = true
		}
		switch name {
		case "instance_id":
			p.InstanceID, err = decodeInt(d)
		case "model_name":
			p.ModelName, err = x.str()
		case "world_size":
			p.WorldSize, err = decodeSmallInt(d)
		case "block_size":
			p.BlockSize, err = decodeSmallInt(d)
		case "num_layers":
			p.NumLayers, err = decodeSmallInt(d)
		case "hidden_dim_size":
			p.HiddenDimSize, err = decodeSmallInt(d)
		case "dtype_str":
			p.DtypeStr, err = x.str()
		case "use_mla":
			p.UseMLA, err = decodeLooseBool(d)
		case "group_layouts":
			p.GroupLayouts, err = decodeGroupLayouts(x)
		default:
			return false, nil
		}
		return true, err
	})
	if err != nil {
		return RegisterPayload{}, err
	}
	return p, req.check("register payload")
}

// decodeGroupLayouts reads register's group_layouts: nil or an array of at
// most MaxGroupLayouts GroupLayoutInfo maps.
func decodeGroupLayouts(x *dec) ([]GroupLayout, error) {
	d := x.d
	if c, err := d.PeekCode(); err == nil && c == msgpcode.Nil {
		return nil, d.DecodeNil()
	}
	n, err := decodeArrayLen(d)
	if err != nil {
		return nil, err
	}
	if n > MaxGroupLayouts {
		return nil, fmt.Errorf("%d group layouts exceed the limit of %d", n, MaxGroupLayouts)
	}
	out := make([]GroupLayout, n)
	for i := range out {
		g := &out[i]
		req := required{"block_size": false, "num_layers": false, "hidden_dim_size": false, "dtype_str": false}
		err := mapFields(x, func(name string) (bool, error) {
			var err error
			if _, ok := req[name]; ok {
				req[name] = true
			}
			switch name {
			case "block_size":
				g.BlockSize, err = decodeSmallInt(d)
			case "num_layers":
				g.NumLayers, err = decodeSmallInt(d)
			case "hidden_dim_size":
				g.HiddenDimSize, err = decodeSmallInt(d)
			case "dtype_str":
				g.DtypeStr, err = x.str()
			case "use_mla":
				g.UseMLA, err = decodeLooseBool(d)
			case "tokens_per_block":
				g.TokensPerBlock, err = decodeSmallInt(d)
			default:
				return false, nil
			}
			return true, err
		})
		if err == nil {
			err = req.check("group layout")
		}
		if err != nil {
			return nil, fmt.Errorf("group layout %d: %w", i, err)
		}
	}
	return out, nil
}

func decodeRecords(x *dec) ([]BlockAllocationRecord, error) {
	d := x.d
	n, err := decodeArrayLen(d)
	if err != nil {
		return nil, err
	}
	// A record carries its three required keys (39 bytes at least), so a
	// lying count cannot allocate records the frame could never fill.
	const minRecordBytes = 39
	if n > remaining(d)/minRecordBytes {
		return nil, fmt.Errorf("%d records exceed frame", n)
	}
	out := make([]BlockAllocationRecord, n)
	for i := range out {
		r := &out[i]
		req := required{"req_id": false, "new_block_ids": false, "new_token_ids": false}
		err := mapFields(x, func(name string) (bool, error) {
			var err error
			if _, ok := req[name]; ok {
				req[name] = true
			}
			switch name {
			case "req_id":
				r.ReqID, err = x.str()
			case "new_block_ids":
				r.NewBlockIDs, err = decodeInts(x)
			case "new_token_ids":
				r.NewTokenIDs, err = decodeInts(x)
			default:
				return false, nil
			}
			return true, err
		})
		if err == nil {
			err = req.check("block allocation record")
		}
		if err != nil {
			return nil, fmt.Errorf("record %d: %w", i, err)
		}
	}
	return out, nil
}

// Encode writes v as one msgpack document the way msgspec would: shortest ints,
// str for strings, bin for []byte, maps for the structs of this package.
func Encode(v any) ([]byte, error) {
	return AppendEncode(nil, v)
}

// AppendEncode is Encode appending to dst.
func AppendEncode(dst []byte, v any) ([]byte, error) {
	// Fast paths for the common scalar results (NOOP, PING, GET_CHUNK_SIZE,
	// COMMIT_*): no encoder allocation.
	switch x := v.(type) {
	case Raw:
		return append(dst, x...), nil
	case Key:
		return x.AppendMsgpack(dst), nil
	case string:
		if len(x) < 32 {
			return append(append(dst, 0xa0|byte(len(x))), x...), nil
		}
	case bool:
		if x {
			return append(dst, msgpcode.True), nil
		}
		return append(dst, msgpcode.False), nil
	case int:
		if x >= 0 && x <= 0x7f {
			return append(dst, byte(x)), nil
		}
	case int64:
		if x >= 0 && x <= 0x7f {
			return append(dst, byte(x)), nil
		}
	case []byte:
		// Size the output once: large payloads must not be copied by buffer
		// growth. msgspec writes bin (also for b"", never nil).
		n := len(x)
		switch {
		case n <= math.MaxUint8:
			dst = append(slices.Grow(dst, 2+n), msgpcode.Bin8, byte(n))
		case n <= math.MaxUint16:
			dst = append(slices.Grow(dst, 3+n), msgpcode.Bin16, byte(n>>8), byte(n))
		case n <= math.MaxUint32:
			dst = append(slices.Grow(dst, 5+n), msgpcode.Bin32, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
		default:
			return nil, fmt.Errorf("msgpack encode: %d bytes exceed the bin32 limit", n)
		}
		return append(dst, x...), nil
	}
	buf := bytes.NewBuffer(dst)
	e := msgpack.NewEncoder(buf)
	e.UseCompactInts(true)
	if err := e.Encode(v); err != nil {
		return nil, fmt.Errorf("msgpack encode %T: %w", v, err)
	}
	return buf.Bytes(), nil
}
