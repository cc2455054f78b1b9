package protocol

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func mustEncode(t testing.TB, v any) []byte {
	t.Helper()
	b, err := Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// encodeMap writes a map with the given keys and values in order, so tests
// can build replies the encoders never write (unknown keys, odd orders).
func encodeMap(t testing.TB, kv ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(true)
	if err := e.EncodeMapLen(len(kv) / 2); err != nil {
		t.Fatal(err)
	}
	for _, v := range kv {
		if raw, ok := v.(Raw); ok {
			buf.Write(raw)
			continue
		}
		if err := e.Encode(v); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

var testSlots = []Slot{
	{Offset: 0, Length: 4096, Shape: []int{2, 2, 16, 16}, Dtype: "float32"},
	{Offset: 1 << 40, Length: 1 << 20, Shape: []int{27, 256, 576}, Dtype: "bfloat16"},
}

// TestReplyDecodersInvertEncoders: every reply the server encodes decodes
// back to the same value.
func TestReplyDecodersInvertEncoders(t *testing.T) {
	for _, r := range []RegisterResponse{{}, {ShmName: "lmcache_l1_pool_x", PoolSize: 1 << 30}} {
		got, err := DecodeRegisterResponse(mustEncode(t, r), Limits{})
		if err != nil || got != r {
			t.Errorf("register %+v: got %+v, %v", r, got, err)
		}
	}
	for _, r := range []PrepareStoreResponse{
		{},
		{Shm: true, Slots: []Slot{}, ChunkIndices: []int{}},
		{Shm: true, Slots: testSlots, ChunkIndices: []int{0, 3}},
	} {
		got, err := DecodePrepareStoreResponse(mustEncode(t, r), Limits{})
		if err != nil || !reflect.DeepEqual(got, r) {
			t.Errorf("prepare_store %+v: got %+v, %v", r, got, err)
		}
	}
	for _, r := range []PrepareRetrieveResponse{
		{Data: []byte{}},
		{Success: true, Data: []byte("pickle"), Slots: nil},
		{Success: true, Data: []byte{}, Slots: testSlots},
		{Success: true, Data: bytes.Repeat([]byte{7}, 70000)},
	} {
		got, err := DecodePrepareRetrieveResponse(mustEncode(t, r), Limits{})
		if err != nil || !reflect.DeepEqual(got, r) {
			t.Errorf("prepare_retrieve %d bytes %d slots: got %+v, %v", len(r.Data), len(r.Slots), got.Success, err)
		}
	}
	// The server's one-buffer pickle reply is the same document.
	data := bytes.Repeat([]byte{9}, 300)
	raw, err := AppendPickleRetrieveReply(nil, len(data), func(b []byte) ([]byte, error) { return append(b, data...), nil })
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodePrepareRetrieveResponse(raw, Limits{})
	if err != nil || !got.Success || !bytes.Equal(got.Data, data) || got.Slots != nil {
		t.Fatalf("pickle reply: %+v %v", got, err)
	}
	for res, v := range map[string]any{ResultInt: int64(256), ResultOptInt: int64(3), ResultBool: true, ResultStr: "OK"} {
		got, err := DecodeResult(res, mustEncode(t, v), Limits{})
		if err != nil || got != v {
			t.Errorf("%s: got %v, %v", res, got, err)
		}
	}
	if _, err := DecodeResult(ResultNone, []byte{0xc0}, Limits{}); err == nil {
		t.Error("a result frame for a none result accepted")
	}
}

// TestRetrieveDataAliasesFrame: the data of a retrieve reply is not copied
// (a pickle of many chunks would be copied once more per retrieve).
func TestRetrieveDataAliasesFrame(t *testing.T) {
	frame := mustEncode(t, PrepareRetrieveResponse{Success: true, Data: bytes.Repeat([]byte{1}, 1000)})
	got, err := DecodePrepareRetrieveResponse(frame, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(frame, got.Data)
	frame[i] = 2
	if got.Data[0] != 2 {
		t.Fatal("data is a copy of the frame")
	}
	if cap(got.Data) != len(got.Data) {
		t.Fatalf("data's capacity %d reaches past it (%d): an append would overwrite the frame", cap(got.Data), len(got.Data))
	}
}

// TestReplyDecodersTolerate what msgspec tolerates: unknown keys at every
// level (skipped, nested too), defaults for missing optional fields, ints
// of any width, bools as ints.
func TestReplyDecodersTolerate(t *testing.T) {
	nested := Raw(mustEncode(t, map[string]any{"a": []any{map[string]any{"b": []any{1, "x", nil}}}}))
	reg, err := DecodeRegisterResponse(encodeMap(t, "future", nested, "pool_size", uint64(5)), Limits{})
	if err != nil || reg != (RegisterResponse{PoolSize: 5}) {
		t.Errorf("register with unknown key: %+v %v", reg, err)
	}
	if reg, err := DecodeRegisterResponse(encodeMap(t), Limits{}); err != nil || reg != (RegisterResponse{}) {
		t.Errorf("empty register reply: %+v %v", reg, err)
	}
	slot := Raw(encodeMap(t, "dtype", "float32", "x", nested, "shape", []int{4}, "length", 16, "offset", int64(1)<<33))
	ps, err := DecodePrepareStoreResponse(encodeMap(t, "zz", nested,
		"context", Raw(encodeMap(t, "other", nested, "slots", Raw(append([]byte{0x91}, slot...))))), Limits{})
	want := PrepareStoreResponse{Shm: true, Slots: []Slot{{Offset: 1 << 33, Length: 16, Shape: []int{4}, Dtype: "float32"}}}
	if err != nil || !reflect.DeepEqual(ps, want) {
		t.Errorf("prepare_store with unknown keys: %+v %v", ps, err)
	}
	pr, err := DecodePrepareRetrieveResponse(encodeMap(t, "success", 1), Limits{})
	if err != nil || !pr.Success || pr.Data != nil || pr.Slots != nil {
		t.Errorf("prepare_retrieve of success only: %+v %v", pr, err)
	}
}

// TestReplyDecodersRefuseHostileReplies: a server is a peer too. Each
// reply below is refused with an error, quickly and without allocating
// what it announces.
func TestReplyDecodersRefuseHostileReplies(t *testing.T) {
	slot := func(kv ...any) Raw {
		base := map[string]any{"offset": 0, "length": 16, "shape": []int{4}, "dtype": "float32"}
		for i := 0; i < len(kv); i += 2 {
			base[kv[i].(string)] = kv[i+1]
		}
		var args []any
		for _, k := range []string{"offset", "length", "shape", "dtype"} {
			if v, ok := base[k]; ok && v != nil {
				args = append(args, k, v)
			}
		}
		return Raw(encodeMap(t, args...))
	}
	store := func(slots ...Raw) []byte {
		arr := []byte{0xdd, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(arr[1:], uint32(len(slots)))
		for _, s := range slots {
			arr = append(arr, s...)
		}
		return encodeMap(t, "context", Raw(encodeMap(t, "slots", Raw(arr))))
	}
	deep := bytes.Repeat([]byte{0x91}, MaxSkipDepth+2)
	deep = append(deep, 0xc0)
	lying := []byte{0xdd, 0x7f, 0xff, 0xff, 0xff} // array32 of 2^31-1 slots
	cases := map[string]struct {
		frame []byte
		dec   func([]byte, Limits) error
		lim   Limits
		want  string
	}{
		"slot count beyond the frame": {encodeMap(t, "context", Raw(encodeMap(t, "slots", Raw(lying)))), storeDec, Limits{}, "exceeds frame"},
		"slot count beyond the limit": {store(slot(), slot(), slot()), storeDec, Limits{MaxTokens: 2}, "limit of 2"},
		"negative offset":             {store(slot("offset", -1)), storeDec, Limits{}, "negative"},
		"negative length":             {store(slot("length", -16)), storeDec, Limits{}, "negative"},
		"missing offset":              {store(slot("offset", nil)), storeDec, Limits{}, `"offset"`},
		"missing dtype":               {store(slot("dtype", nil, "shape", []int{4, 4, 4, 4, 4, 4, 4, 4})), storeDec, Limits{}, `"dtype"`},
		"shape too deep":              {store(slot("shape", make([]int, MaxSlotDims+1))), storeDec, Limits{}, "dimensions"},
		"negative dimension":          {store(slot("shape", []int{-4})), storeDec, Limits{}, "out of range"},
		"dtype beyond the limit":      {store(slot("dtype", strings.Repeat("f", 300))), storeDec, Limits{}, "exceeds the limit"},
		"offset as a string":          {store(slot("offset", "0")), storeDec, Limits{}, "expected int"},
		"uint64 offset overflow":      {store(slot("offset", uint64(1)<<63)), storeDec, Limits{}, "out of range"},
		"chunk index negative":        {encodeMap(t, "context", Raw(encodeMap(t, "chunk_indices", []int{-1}))), storeDec, Limits{}, "out of range"},
		"chunk indices beyond limit":  {encodeMap(t, "context", Raw(encodeMap(t, "chunk_indices", []int{0, 1, 2}))), storeDec, Limits{MaxTokens: 2}, "limit of 2"},
		"context not a map":           {encodeMap(t, "context", []int{1}), storeDec, Limits{}, "expected map"},
		"unknown value nested deep":   {encodeMap(t, "x", Raw(deep)), storeDec, Limits{}, "nesting deeper"},
		"trailing bytes":              {append(encodeMap(t), 0xc0), storeDec, Limits{}, "trailing"},
		"not a map":                   {mustEncode(t, "OK"), storeDec, Limits{}, "expected map"},
		"empty frame":                 {nil, storeDec, Limits{}, "EOF"},
		"success missing":             {encodeMap(t, "data", []byte{}), retrieveDec, Limits{}, `"success"`},
		"data as a string":            {encodeMap(t, "success", true, "data", "abc"), retrieveDec, Limits{}, "expected bin"},
		"data longer than the frame":  {encodeMap(t, "success", true, "data", Raw([]byte{0xc6, 0x7f, 0, 0, 0, 1})), retrieveDec, Limits{}, "exceeds frame"},
		"retrieve slots lying":        {encodeMap(t, "success", true, "context", Raw(encodeMap(t, "slots", Raw(lying)))), retrieveDec, Limits{}, "exceeds frame"},
		"shm name beyond the limit":   {encodeMap(t, "shm_name", strings.Repeat("n", 1000)), registerDec, Limits{}, "exceeds the limit"},
		"negative pool size":          {encodeMap(t, "pool_size", -1), registerDec, Limits{}, "negative"},
		"key beyond the limit":        {encodeMap(t, strings.Repeat("k", 1000), 1), registerDec, Limits{}, "map key"},
	}
	for name, tc := range cases {
		err := tc.dec(tc.frame, tc.lim)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", name, err, tc.want)
		}
		if err != nil && len(err.Error()) > 400 {
			t.Errorf("%s: error of %d bytes quotes the peer's input", name, len(err.Error()))
		}
	}
	// The lying count allocates nothing of its size.
	frame := encodeMap(t, "context", Raw(encodeMap(t, "slots", Raw(lying))))
	if allocs := testing.AllocsPerRun(20, func() { _ = storeDec(frame, Limits{}) }); allocs > 30 {
		t.Errorf("a lying slot count cost %.0f allocations", allocs)
	}
}

func storeDec(b []byte, l Limits) error {
	_, err := DecodePrepareStoreResponse(b, l)
	return err
}

func retrieveDec(b []byte, l Limits) error {
	_, err := DecodePrepareRetrieveResponse(b, l)
	return err
}

func registerDec(b []byte, l Limits) error {
	_, err := DecodeRegisterResponse(b, l)
	return err
}

// TestReplyDecodersTruncated: every prefix of a valid reply is an error,
// never a panic or a partial value.
func TestReplyDecodersTruncated(t *testing.T) {
	frames := map[string][]byte{
		"store":    mustEncode(t, PrepareStoreResponse{Shm: true, Slots: testSlots, ChunkIndices: []int{0, 1}}),
		"retrieve": mustEncode(t, PrepareRetrieveResponse{Success: true, Data: []byte("abc"), Slots: testSlots}),
		"register": mustEncode(t, RegisterResponse{ShmName: "x", PoolSize: 1 << 30}),
	}
	decs := map[string]func([]byte, Limits) error{"store": storeDec, "retrieve": retrieveDec, "register": registerDec}
	for name, f := range frames {
		for n := range len(f) {
			if err := decs[name](f[:n], Limits{}); err == nil {
				t.Fatalf("%s: prefix of %d of %d bytes accepted", name, n, len(f))
			}
		}
	}
}

// FuzzReplyDecoders: no input panics, and what decodes re-encodes to a
// document that decodes to the same value.
func FuzzReplyDecoders(f *testing.F) {
	f.Add(mustEncode(f, PrepareStoreResponse{Shm: true, Slots: testSlots, ChunkIndices: []int{0, 1}}))
	f.Add(mustEncode(f, PrepareRetrieveResponse{Success: true, Data: []byte("abc"), Slots: testSlots}))
	f.Add(mustEncode(f, RegisterResponse{ShmName: "x", PoolSize: 1 << 30}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if ps, err := DecodePrepareStoreResponse(b, Limits{}); err == nil {
			again, err := DecodePrepareStoreResponse(mustEncode(t, ps), Limits{})
			if err != nil || again.Shm != ps.Shm || len(again.Slots) != len(ps.Slots) {
				t.Fatalf("store %+v re-decodes as %+v, %v", ps, again, err)
			}
		}
		if pr, err := DecodePrepareRetrieveResponse(b, Limits{}); err == nil {
			again, err := DecodePrepareRetrieveResponse(mustEncode(t, pr), Limits{})
			if err != nil || again.Success != pr.Success || !bytes.Equal(again.Data, pr.Data) || len(again.Slots) != len(pr.Slots) {
				t.Fatalf("retrieve re-decodes as %+v, %v", again, err)
			}
		}
		if r, err := DecodeRegisterResponse(b, Limits{}); err == nil {
			if again, err := DecodeRegisterResponse(mustEncode(t, r), Limits{}); err != nil || again != r {
				t.Fatalf("register %+v re-decodes as %+v, %v", r, again, err)
			}
		}
		for _, res := range []string{ResultInt, ResultBool, ResultStr} {
			_, _ = DecodeResult(res, b, Limits{})
		}
	})
}
