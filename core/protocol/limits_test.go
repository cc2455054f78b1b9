package protocol_test

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"kvdock/core/protocol"
)

// keyFields are the required fields of a key, as raw map pairs.
func keyFields(tokens any) []any {
	return []any{"model_name", "m", "world_size", 1, "token_ids", tokens, "start", 0, "end", 2, "request_id", "r"}
}

func registerFields() []any {
	return []any{"instance_id", 1, "model_name", "m", "world_size", 1, "block_size", 16,
		"num_layers", 2, "hidden_dim_size", 8, "dtype_str", "float16", "use_mla", false}
}

// nested is depth fixarray-of-one headers around a nil, in one of three
// container encodings.
func nested(depth int, code byte) []byte {
	var b bytes.Buffer
	for range depth {
		switch code {
		case 0x91:
			b.WriteByte(0x91)
		case 0xdc:
			b.Write([]byte{0xdc, 0, 1})
		case 0x81: // fixmap {nil: …}
			b.Write([]byte{0x81, 0xc0})
		}
	}
	b.WriteByte(0xc0)
	return b.Bytes()
}

// TestDeepNestingIsCleanError: 8 MB of nesting under an unknown field used to
// overflow the goroutine stack in msgpack's recursive Skip (a fatal error no
// recover catches); it must be a decode error, quickly.
func TestDeepNestingIsCleanError(t *testing.T) {
	p := loadProfile(t, "nongpu-v1")
	for _, code := range []byte{0x91, 0xdc, 0x81} {
		deep := nested(8<<20/3, code)
		frames := map[string][]byte{
			protocol.TypeKey:      rawMap(append(keyFields([]uint32{1, 2}), "x", deep)...),
			protocol.TypeRegister: rawMap(append(registerFields(), "future", deep)...),
			protocol.TypeRecords: append([]byte{0x91}, rawMap("req_id", "a", "new_block_ids", []int{},
				"new_token_ids", []int{}, "extra", deep)...),
		}
		for typ, frame := range frames {
			start := time.Now()
			_, err := protocol.DecodeValue(typ, frame)
			if err == nil || !strings.Contains(err.Error(), "nesting deeper than") {
				t.Errorf("%s, code 0x%02x: err = %v, want a nesting error", typ, code, err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("%s: took %v", typ, d)
			}
		}
	}
	// The same through a whole request of the profile.
	key := rawMap(append(keyFields([]uint32{1}), "x", nested(8<<20, 0x91))...)
	if _, _, err := p.DecodeRequest([][]byte{mustEncode(t, 1), mustEncode(t, 11), key, mustEncode(t, 0)}); err == nil {
		t.Fatal("nested LOOKUP key decoded")
	}
	// Within the depth limit, nesting is skipped and the fields after it read.
	ok := rawMap(append([]any{"x", nested(protocol.MaxSkipDepth, 0x91)}, keyFields([]uint32{7, 8})...)...)
	v, err := protocol.DecodeValue(protocol.TypeKey, ok)
	if err != nil || v.(protocol.Key).TokenIDs[1] != 8 {
		t.Fatalf("nesting at the limit: %v %v", v, err)
	}
}

// TestSkipEveryType: unknown fields of every msgpack type are skipped exactly
// (the fields after them decode), and truncated or lying ones are errors.
func TestSkipEveryType(t *testing.T) {
	ext := []byte{0xd4, 1, 2} // fixext1
	values := []any{
		nil, true, false, 0, -1, 127, -32, 255, 65535, 1 << 20, 1 << 40, -1 << 40, int8(-100),
		float32(1.5), 2.5, "", "s", strings.Repeat("x", 40), strings.Repeat("y", 300), strings.Repeat("z", 70000),
		[]byte{}, []byte{1}, make([]byte, 300), make([]byte, 70000),
		[]any{}, []any{1, "a", []any{nil, map[string]any{"k": []int{1, 2}}}}, make([]int, 20), make([]int, 70000),
		map[string]any{}, map[string]any{"a": 1, "b": map[string]any{"c": []byte{1}}},
		time.Unix(1, 0), time.Unix(1<<40, 5),
	}
	lim := protocol.Limits{MaxString: 1 << 20}
	for i, v := range values {
		raw, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		frame := rawMap(append([]any{"unknown", raw}, keyFields([]uint32{5, 6})...)...)
		got, err := protocol.DecodeValueLimits(protocol.TypeKey, frame, lim)
		if err != nil || got.(protocol.Key).TokenIDs[0] != 5 {
			t.Errorf("value %d (%T): %v", i, v, err)
		}
		if len(raw) > 1 {
			cut := rawMap("unknown", raw[:len(raw)-1])
			if _, err := protocol.DecodeValue(protocol.TypeKey, cut); err == nil {
				t.Errorf("value %d truncated: decoded", i)
			}
		}
	}
	for _, raw := range [][]byte{
		ext, {0xc1}, {0xdd, 0xff, 0xff, 0xff, 0xff}, {0xdf, 0x7f, 0xff, 0xff, 0xff},
		{0xc6, 0xff, 0xff, 0xff, 0xff}, {0xdb, 0, 0, 1}, {0xde, 0, 2, 1},
	} {
		_, err := protocol.DecodeValue(protocol.TypeKey, rawMap(append([]any{"unknown", raw}, keyFields([]uint32{1})...)...))
		if bytes.Equal(raw, ext) {
			if err != nil {
				t.Errorf("fixext: %v", err)
			}
		} else if err == nil {
			t.Errorf("% x: decoded", raw)
		}
	}
}

// TestStringCaps: every string a peer can make us keep is capped at decode,
// and the error does not quote the string.
func TestStringCaps(t *testing.T) {
	long := strings.Repeat("Q", protocol.DefaultMaxString+1)
	fit := strings.Repeat("Q", protocol.DefaultMaxString)
	replace := func(kv []any, field string, v any) []any {
		out := append([]any(nil), kv...)
		for i := 0; i < len(out); i += 2 {
			if out[i] == field {
				out[i+1] = v
				return out
			}
		}
		return append(out, field, v)
	}
	cases := []struct {
		typ, field string
		base       []any
	}{
		{protocol.TypeKey, "model_name", keyFields([]uint32{1})},
		{protocol.TypeKey, "request_id", keyFields([]uint32{1})},
		{protocol.TypeKey, "cache_salt", keyFields([]uint32{1})},
		{protocol.TypeRegister, "model_name", registerFields()},
		{protocol.TypeRegister, "dtype_str", registerFields()},
	}
	for _, c := range cases {
		if _, err := protocol.DecodeValue(c.typ, rawMap(replace(c.base, c.field, fit)...)); err != nil {
			t.Errorf("%s.%s of %d bytes: %v", c.typ, c.field, len(fit), err)
		}
		_, err := protocol.DecodeValue(c.typ, rawMap(replace(c.base, c.field, long)...))
		if err == nil || !strings.Contains(err.Error(), "exceeds the limit") || strings.Contains(err.Error(), "QQQ") {
			t.Errorf("%s.%s of %d bytes: err = %v", c.typ, c.field, len(long), err)
		}
	}
	// A long unknown key name, a top-level str (session ids) and a record's req_id.
	if _, err := protocol.DecodeValue(protocol.TypeKey, rawMap(append([]any{long, 1}, keyFields([]uint32{1})...)...)); err == nil {
		t.Error("long map key decoded")
	}
	if _, err := protocol.DecodeValue(protocol.TypeStr, strRaw(long)); err == nil {
		t.Error("long str payload decoded")
	}
	rec := append([]byte{0x91}, rawMap("req_id", long, "new_block_ids", []int{}, "new_token_ids", []int{})...)
	if _, err := protocol.DecodeValue(protocol.TypeRecords, rec); err == nil {
		t.Error("long req_id decoded")
	}
	// A lying str32 length is refused before anything is allocated.
	if _, err := protocol.DecodeValueLimits(protocol.TypeStr, []byte{0xdb, 0x7f, 0xff, 0xff, 0xff, 'a'},
		protocol.Limits{MaxString: 1 << 31}); err == nil {
		t.Error("lying str32 decoded")
	}
}

// int64Tokens encodes n tokens as int64s (the decoder's general path).
func int64Tokens(n int) []byte {
	b := []byte{0xdd, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(n))
	for i := range n {
		b = append(b, 0xd3)
		b = binary.BigEndian.AppendUint64(b, uint64(i))
	}
	return b
}

// TestTokenCap: a key carries at most MaxTokens tokens, on both decode paths,
// and a block allocation report at most MaxTokens ints in all.
func TestTokenCap(t *testing.T) {
	over := make([]uint32, protocol.DefaultMaxTokens+1)
	_, err := protocol.DecodeValue(protocol.TypeKey, rawMap(keyFields(over)...))
	if err == nil || !strings.Contains(err.Error(), "tokens exceed the limit") {
		t.Fatalf("%d tokens: err = %v", len(over), err)
	}
	if _, err := protocol.DecodeValue(protocol.TypeKey, rawMap(keyFields(over[:protocol.DefaultMaxTokens])...)); err != nil {
		t.Fatalf("%d tokens: %v", protocol.DefaultMaxTokens, err)
	}
	lim := protocol.Limits{MaxTokens: 100}
	if _, err := protocol.DecodeValueLimits(protocol.TypeKey, rawMap(keyFields(int64Tokens(101))...), lim); err == nil {
		t.Error("101 int64 tokens decoded under a cap of 100")
	}
	if _, err := protocol.DecodeValueLimits(protocol.TypeKey, rawMap(keyFields(int64Tokens(100))...), lim); err != nil {
		t.Errorf("100 int64 tokens: %v", err)
	}
	rec := rawMap("req_id", "a", "new_block_ids", make([]int, 60), "new_token_ids", make([]int, 60))
	if _, err := protocol.DecodeValueLimits(protocol.TypeRecords, append([]byte{0x91}, rec...), lim); err == nil {
		t.Error("120 ints in records decoded under a cap of 100")
	}
}

// heapAllocBytes is the bytes allocated so far. ReadMemStats flushes every
// cache, so the count is exact (runtime/metrics counts whole spans).
func heapAllocBytes() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.TotalAlloc
}

// maxAllocRatio bounds decoding allocations against the input: tokens grow
// 4×, record ints 8×, records about 3×, plus a fixed cost per frame.
const (
	maxAllocRatio  = 12
	allocPerFrame  = 8 << 10
	allocFixedCost = 16 << 10
)

// TestDecodeAllocationBound: lying counts cannot make the decoder allocate
// beyond a small multiple of the frame.
func TestDecodeAllocationBound(t *testing.T) {
	frames := map[string][]byte{
		"records count": append([]byte{0xdd, 0x00, 0x10, 0x00, 0x00}, bytes.Repeat([]byte{0x80}, 1<<20)...),
		"ints":          append([]byte{0x91}, rawMap("req_id", "a", "new_block_ids", make([]int, 1<<20), "new_token_ids", []int{})...),
		"tokens":        rawMap(keyFields(make([]uint32, 1<<20))...),
		"strings":       rawMap(append(keyFields([]uint32{1}), "x", bytes.Repeat([]byte{0xa0}, 1<<20))...),
	}
	for name, frame := range frames {
		for _, typ := range []string{protocol.TypeKey, protocol.TypeRecords, protocol.TypeRegister} {
			before := heapAllocBytes()
			_, _ = protocol.DecodeValue(typ, frame)
			if got, limit := heapAllocBytes()-before, uint64(maxAllocRatio*len(frame)+allocPerFrame+allocFixedCost); got > limit {
				t.Errorf("%s as %s: %d bytes allocated for a %d-byte frame (limit %d)", name, typ, got, len(frame), limit)
			}
		}
	}
}
