package protocol_test

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"kvdock/core/protocol"
)

// encoderBytes encodes v with a msgpack.Encoder (the general path the append
// fast paths must match byte for byte).
func encoderBytes(t *testing.T, v msgpack.CustomEncoder) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(true)
	if err := v.EncodeMsgpack(e); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestKeyAppendMatchesEncoder(t *testing.T) {
	w := func(i int) *int { return &i }
	toks := []uint32{0, 1, 127, 128, 255, 256, 65535, 65536, math.MaxUint32}
	many := make([]uint32, 70000)
	for i := range many {
		many[i] = uint32(i * 61)
	}
	for i, k := range []protocol.Key{
		{},
		{ModelName: "m", WorldSize: 1, TokenIDs: toks, Start: 0, End: 9, RequestID: "r"},
		{ModelName: strings.Repeat("x", 31), WorkerID: w(0), TokenIDs: many[:15], End: -1, CacheSalt: "s"},
		{ModelName: strings.Repeat("x", 32), WorkerID: w(-33), TokenIDs: many[:16], Start: -200, End: 1 << 20},
		{ModelName: strings.Repeat("y", 256), WorkerID: w(math.MaxInt32), TokenIDs: many, RequestID: strings.Repeat("r", 70000), Start: math.MinInt32},
	} {
		want := encoderBytes(t, k)
		if got := k.AppendMsgpack(nil); !bytes.Equal(got, want) {
			t.Errorf("key %d: AppendMsgpack differs from EncodeMsgpack", i)
		}
		got, err := protocol.AppendEncode([]byte{0xaa}, k)
		if err != nil || !bytes.Equal(got[1:], want) || got[0] != 0xaa {
			t.Errorf("key %d: AppendEncode differs (%v)", i, err)
		}
		// The 70000-byte request id exercises str32; the default cap is 256.
		back, err := protocol.DecodeValueLimits(protocol.TypeKey, want, protocol.Limits{MaxString: 1 << 20})
		if err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
		if bk := back.(protocol.Key); !bk.Equal(k) || bk.RequestID != k.RequestID {
			t.Errorf("key %d: round trip %+v", i, bk)
		}
	}
}

func TestRawPassesThrough(t *testing.T) {
	got, err := protocol.Encode(protocol.Raw{0x93, 1, 2, 3})
	if err != nil || !bytes.Equal(got, []byte{0x93, 1, 2, 3}) {
		t.Errorf("Raw encoded as %x (%v)", got, err)
	}
}

func TestPickleRetrieveReplyMatchesEncoder(t *testing.T) {
	for _, n := range []int{0, 1, 255, 256, 65535, 65536, 1 << 20} {
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(i * 7)
		}
		want := mustEncode(t, protocol.PrepareRetrieveResponse{Success: true, Data: data})
		if protocol.PickleReplySize(n) != len(want) {
			t.Errorf("n=%d: PickleReplySize %d, encoder writes %d", n, protocol.PickleReplySize(n), len(want))
		}
		got, err := protocol.AppendPickleRetrieveReply(make([]byte, 0, protocol.PickleReplySize(n)), n,
			func(b []byte) ([]byte, error) { return append(b, data...), nil })
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("n=%d: reply differs (%v)", n, err)
		}
		if cap(got) != len(want) {
			t.Errorf("n=%d: buffer grew to %d", n, cap(got))
		}
	}
	_, err := protocol.AppendPickleRetrieveReply(nil, 5, func(b []byte) ([]byte, error) { return append(b, 1), nil })
	if err == nil {
		t.Error("a fill of the wrong length must fail")
	}
}

// TestRetrieveReplyWithSlotsMatchesEncoder: a reply carrying both the
// pickled chunks and the slots (an SHM instance not yet proven to map the
// segment) is the document the encoder writes for both fields.
func TestRetrieveReplyWithSlotsMatchesEncoder(t *testing.T) {
	slots := []protocol.Slot{{Offset: 0, Length: 64, Shape: []int{2, 4}, Dtype: "float16"}, {Offset: 4096, Length: 64, Shape: []int{2, 4}, Dtype: "float16"}}
	for _, r := range []protocol.PrepareRetrieveResponse{
		{Success: true, Slots: slots},
		{Success: true, Slots: slots, GroupIDs: []int{0, 1}},
	} {
		data := bytes.Repeat([]byte{0xab}, 300)
		r.Data = data
		want := mustEncode(t, r)
		ctx, err := r.AppendContext(nil)
		if err != nil {
			t.Fatal(err)
		}
		size := protocol.RetrieveReplySize(len(data), len(ctx))
		got, err := protocol.AppendRetrieveReply(make([]byte, 0, size), len(data),
			func(b []byte) ([]byte, error) { return append(b, data...), nil }, ctx)
		if err != nil || !bytes.Equal(got, want) || len(got) != size {
			t.Errorf("groups %v: reply %x (%v), want %x (size %d)", r.GroupIDs, got, err, want, size)
		}
	}
}

// keyWithTokens builds a key frame whose token_ids value is raw.
func keyWithTokens(raw []byte) []byte {
	return rawMap("model_name", strRaw("m"), "world_size", 1, "token_ids", raw, "start", 0, "end", 2,
		"request_id", strRaw("r"))
}

func TestTokenDecodingEdgeCases(t *testing.T) {
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	for _, c := range []struct {
		name string
		raw  []byte
		want []uint32
		err  string
	}{
		{"fixints", []byte{0x92, 0, 0x7f}, []uint32{0, 127}, ""},
		{"uint widths", cat([]byte{0x93}, encodeIntAs(0xcc, 200), encodeIntAs(0xcd, 60000), encodeIntAs(0xce, math.MaxUint32)), []uint32{200, 60000, math.MaxUint32}, ""},
		{"array16", cat([]byte{0xdc, 0, 2}, []byte{1, 2}), []uint32{1, 2}, ""},
		{"array32", cat([]byte{0xdd, 0, 0, 0, 2}, []byte{1, 2}), []uint32{1, 2}, ""},
		{"signed positive (slow path)", cat([]byte{0x92, 1}, encodeIntAs(0xd3, 5)), []uint32{1, 5}, ""},
		{"empty", []byte{0x90}, []uint32{}, ""},
		{"negative", []byte{0x92, 1, 0xff}, nil, "token 1: -1 out of range"},
		{"uint64 too big", cat([]byte{0x91}, encodeIntAs(0xcf, math.MaxUint32+1)), nil, "token 0: 4294967296 out of range"},
		{"not an int", []byte{0x92, 1, 0xa1, 'x'}, nil, "token 1: expected int"},
		{"nil array", []byte{0xc0}, nil, "expected array, got nil"},
		{"lying length", []byte{0xdd, 0x7f, 0xff, 0xff, 0xff}, nil, "exceeds frame"},
	} {
		v, err := protocol.DecodeValue(protocol.TypeKey, keyWithTokens(c.raw))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got := v.(protocol.Key).TokenIDs; !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: tokens %v, want %v", c.name, got, c.want)
		}
	}
	// A truncated token array fails whatever the element width.
	frame := keyWithTokens(cat([]byte{0x92, 1}, encodeIntAs(0xce, 70000)))
	for cut := 1; cut < 5; cut++ {
		i := bytes.Index(frame, encodeIntAs(0xce, 70000))
		short := append(append([]byte{}, frame[:i+5-cut]...), frame[i+5:]...)
		if _, err := protocol.DecodeValue(protocol.TypeKey, short); err == nil {
			t.Errorf("cut %d: truncated token accepted", cut)
		}
	}
}

func BenchmarkDecodeKey4096(b *testing.B) {
	k := protocol.Key{ModelName: "meta-llama/Llama-3.1-8B", WorldSize: 1, TokenIDs: make([]uint32, 4096), End: 4096, RequestID: "req-1"}
	for i := range k.TokenIDs {
		k.TokenIDs[i] = uint32(i * 37 % 128256)
	}
	frame := k.AppendMsgpack(nil)
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		if _, err := protocol.DecodeValue(protocol.TypeKey, frame); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeKey4096(b *testing.B) {
	k := protocol.Key{ModelName: "meta-llama/Llama-3.1-8B", WorldSize: 1, TokenIDs: make([]uint32, 4096), End: 4096, RequestID: "req-1"}
	for i := range k.TokenIDs {
		k.TokenIDs[i] = uint32(i * 37 % 128256)
	}
	for b.Loop() {
		if _, err := protocol.Encode(k); err != nil {
			b.Fatal(err)
		}
	}
}
