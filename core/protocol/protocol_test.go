package protocol_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"kvdock/assets"
	"kvdock/core/protocol"
	"kvdock/core/testkit/profiles"
)

func mustEncode(t testing.TB, v any) []byte {
	t.Helper()
	b, err := protocol.Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func loadProfile(t testing.TB, name string) *protocol.Profile {
	t.Helper()
	p := profiles.Load(t, name)
	return p
}

func TestProfileTables(t *testing.T) {
	seedTail := []string{"PREPARE_STORE", "COMMIT_STORE", "PREPARE_RETRIEVE", "COMMIT_RETRIEVE",
		"CLEAR", "GET_CHUNK_SIZE", "PING", "REPORT_BLOCK_ALLOCATION", "NOOP"}
	head := []string{"REGISTER_KV_CACHE", "UNREGISTER_KV_CACHE", "STORE", "RETRIEVE", "LOOKUP",
		"QUERY_PREFETCH_STATUS", "QUERY_PREFETCH_LOOKUP_HITS", "FREE_LOOKUP_LOCKS", "END_SESSION"}
	cases := map[string][]string{
		"nongpu-v1": append(append(append([]string{}, head...), "REGISTER_KV_CACHE_NON_GPU_CONTEXT"), seedTail...),
		"nongpu-v2": append(append(append([]string{}, head...), "REGISTER_KV_CACHE_NON_GPU_CONTEXT",
			"UNREGISTER_KV_CACHE_NON_GPU_CONTEXT"), seedTail...),
		"engine-driven": append(append(append([]string{}, head...), "REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT",
			"UNREGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT", "PREPARE_STORE", "COMMIT_STORE", "COMMIT_STORE_GROUP"),
			seedTail[2:]...),
	}
	if got := assets.ProtocolNames(); !reflect.DeepEqual(got, []string{"engine-driven", "engine-driven-v2", "engine-driven-v2-early", "nongpu-v1", "nongpu-v2", "rpc-messages"}) {
		t.Fatalf("ProtocolNames = %v", got)
	}
	for name, want := range cases {
		p := loadProfile(t, name)
		if p.Name != name {
			t.Errorf("%s: profile name %q", name, p.Name)
		}
		if p.ErrorMarker {
			t.Errorf("%s: error_marker must default to false", name)
		}
		if len(p.Requests) != len(want) {
			t.Fatalf("%s: %d requests, want %d", name, len(p.Requests), len(want))
		}
		for i, n := range want {
			s, ok := p.ByNumber(int64(i + 1))
			if !ok || s.Name != n {
				t.Errorf("%s: number %d = %v, want %s", name, i+1, s, n)
			}
		}
	}
	// Spot checks from the issue text.
	v1 := loadProfile(t, "nongpu-v1")
	for n, num := range map[string]int64{"REGISTER_KV_CACHE_NON_GPU_CONTEXT": 10, "PREPARE_STORE": 11,
		"COMMIT_STORE": 12, "PREPARE_RETRIEVE": 13, "COMMIT_RETRIEVE": 14, "CLEAR": 15,
		"GET_CHUNK_SIZE": 16, "PING": 17, "REPORT_BLOCK_ALLOCATION": 18, "NOOP": 19} {
		if s, _ := v1.ByName(n); s == nil || s.Number != num {
			t.Errorf("nongpu-v1 %s = %v, want %d", n, s, num)
		}
	}
	ed := loadProfile(t, "engine-driven")
	if s, _ := ed.ByNumber(10); s.Handler != protocol.RegisterKVCacheNonGPUContext {
		t.Errorf("engine-driven 10 handler %q", s.Handler)
	}
	if s, _ := ed.ByNumber(11); s.Handler != protocol.UnregisterKVCacheNonGPUContext {
		t.Errorf("engine-driven 11 handler %q", s.Handler)
	}
	if s, _ := ed.ByName(protocol.RegisterKVCacheNonGPUContext); s == nil || s.Number != 10 {
		t.Errorf("ByName by canonical handler: %v", s)
	}
	if s, _ := ed.ByNumber(21); s.Name != "NOOP" || s.Class != protocol.Inline || s.Result != "str" {
		t.Errorf("engine-driven NOOP: %+v", s)
	}
	if s, _ := v1.ByNumber(11); s.Class != protocol.Ordered {
		t.Errorf("PREPARE_STORE class %q", s.Class)
	}
	if s, _ := v1.ByNumber(5); s.Class != protocol.Shared {
		t.Errorf("LOOKUP class %q", s.Class)
	}
	if s, _ := v1.ByNumber(6); s.Result != protocol.ResultOptInt {
		t.Errorf("QUERY_PREFETCH_STATUS result %q", s.Result)
	}
	if s, _ := v1.ByNumber(3); s.Unsupported != protocol.KindCUDAUnsupported {
		t.Errorf("STORE unsupported %q", s.Unsupported)
	}
	if _, err := assets.Protocol("nope"); err == nil || !strings.Contains(err.Error(), "nongpu-v1") {
		t.Errorf("unknown profile error should list the known ones: %v", err)
	}
}

func TestParseRejectsBadTables(t *testing.T) {
	bad := `name: x
requests:
  - {name: A, number: 1, payload: [int], class: inline, handler: NOOP}
  - {name: B, number: 1, payload: [decimal], class: sideways, handler: NOPE}
  - {name: A, number: 2, payload: [], alternatives: [[]], class: shared, handler: PING}
`
	_, err := protocol.Parse([]byte(bad))
	if err == nil {
		t.Fatal("want error")
	}
	for _, want := range []string{"number 1 already used", "unknown payload type \"decimal\"", "class \"sideways\"",
		"handler \"NOPE\"", "name used twice", "two payload shapes with 0 frames"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

func intPtr(i int) *int { return &i }

func TestKeyRoundTrip(t *testing.T) {
	for _, k := range []protocol.Key{
		{ModelName: "m", WorldSize: 2, WorkerID: intPtr(1), TokenIDs: []uint32{1, 2, 70000, math.MaxUint32},
			Start: 0, End: 256, RequestID: "r1", CacheSalt: "s"},
		{ModelName: "m", WorldSize: 1, TokenIDs: []uint32{}, RequestID: "r2"},
	} {
		b := mustEncode(t, k)
		v, err := protocol.DecodeValue(protocol.TypeKey, b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(v.(protocol.Key), k) {
			t.Errorf("round trip: got %+v want %+v", v, k)
		}
		// Field order and presence as msgspec writes them.
		var m []any
		d := msgpack.NewDecoder(bytes.NewReader(b))
		n, _ := d.DecodeMapLen()
		for i := 0; i < n; i++ {
			key, _ := d.DecodeString()
			m = append(m, key)
			_ = d.Skip()
		}
		want := []any{"model_name", "world_size", "worker_id", "token_ids", "start", "end", "request_id", "cache_salt"}
		if !reflect.DeepEqual(m, want) {
			t.Errorf("field order %v", m)
		}
	}
}

func TestKeyEqualIgnoresRequestID(t *testing.T) {
	a := protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: []uint32{1}, RequestID: "a"}
	b := a
	b.RequestID = "b"
	if !a.Equal(b) {
		t.Error("request_id must not take part in equality")
	}
	b.WorkerID = intPtr(0)
	if a.Equal(b) {
		t.Error("worker_id must take part in equality")
	}
}

// encodeIntAs writes n with the given msgpack int code.
func encodeIntAs(code byte, n int64) []byte {
	switch code {
	case 0: // fixint
		return []byte{byte(int8(n))}
	case 0xcc:
		return []byte{code, byte(n)}
	case 0xcd, 0xd1:
		b := []byte{code, 0, 0}
		binary.BigEndian.PutUint16(b[1:], uint16(n))
		return b
	case 0xce, 0xd2:
		b := []byte{code, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], uint32(n))
		return b
	case 0xcf, 0xd3:
		b := make([]byte, 9)
		b[0] = code
		binary.BigEndian.PutUint64(b[1:], uint64(n))
		return b
	case 0xd0:
		return []byte{code, byte(int8(n))}
	}
	panic("bad code")
}

var intCodes = []byte{0, 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3}

// rawMap builds a msgpack map from ordered key/raw-value pairs.
func rawMap(kv ...any) []byte {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	_ = e.EncodeMapLen(len(kv) / 2)
	for i := 0; i < len(kv); i += 2 {
		_ = e.EncodeString(kv[i].(string))
		switch v := kv[i+1].(type) {
		case []byte:
			buf.Write(v)
		default:
			_ = e.Encode(v)
		}
	}
	return buf.Bytes()
}

func strRaw(s string) []byte {
	b, _ := msgpack.Marshal(s)
	return b
}

func TestAllIntWidthsEveryIntField(t *testing.T) {
	for _, c := range intCodes {
		n := int64(5)
		iv := encodeIntAs(c, n)
		keyFrame := rawMap("model_name", strRaw("m"), "world_size", iv, "worker_id", iv,
			"token_ids", append([]byte{0x92}, append(iv, iv...)...), "start", iv, "end", iv,
			"request_id", strRaw("r"))
		v, err := protocol.DecodeValue(protocol.TypeKey, keyFrame)
		if err != nil {
			t.Fatalf("code 0x%02x: key: %v", c, err)
		}
		k := v.(protocol.Key)
		if k.WorldSize != 5 || *k.WorkerID != 5 || !reflect.DeepEqual(k.TokenIDs, []uint32{5, 5}) || k.Start != 5 || k.End != 5 {
			t.Errorf("code 0x%02x: key %+v", c, k)
		}
		reg := rawMap("instance_id", iv, "model_name", strRaw("m"), "world_size", iv, "block_size", iv,
			"num_layers", iv, "hidden_dim_size", iv, "dtype_str", strRaw("float16"), "use_mla", []byte{0xc2})
		v, err = protocol.DecodeValue(protocol.TypeRegister, reg)
		if err != nil {
			t.Fatalf("code 0x%02x: register: %v", c, err)
		}
		want := protocol.RegisterPayload{InstanceID: 5, ModelName: "m", WorldSize: 5, BlockSize: 5,
			NumLayers: 5, HiddenDimSize: 5, DtypeStr: "float16"}
		if !reflect.DeepEqual(v.(protocol.RegisterPayload), want) {
			t.Errorf("code 0x%02x: register %+v", c, v)
		}
		v, err = protocol.DecodeValue(protocol.TypeInt, iv)
		if err != nil || v.(int64) != 5 {
			t.Errorf("code 0x%02x: int %v %v", c, v, err)
		}
		rec := append([]byte{0x91}, rawMap("req_id", strRaw("q"), "new_block_ids", append([]byte{0x91}, iv...),
			"new_token_ids", append([]byte{0x91}, iv...))...)
		v, err = protocol.DecodeValue(protocol.TypeRecords, rec)
		if err != nil {
			t.Fatalf("code 0x%02x: records: %v", c, err)
		}
		if r := v.([]protocol.BlockAllocationRecord); len(r) != 1 || r[0].NewBlockIDs[0] != 5 || r[0].NewTokenIDs[0] != 5 {
			t.Errorf("code 0x%02x: records %+v", c, r)
		}
	}
	// Negative ints in signed widths.
	for _, c := range []byte{0, 0xd0, 0xd1, 0xd2, 0xd3} {
		v, err := protocol.DecodeValue(protocol.TypeInt, encodeIntAs(c, -3))
		if err != nil || v.(int64) != -3 {
			t.Errorf("code 0x%02x: -3 decoded as %v %v", c, v, err)
		}
	}
	if _, err := protocol.DecodeValue(protocol.TypeInt, encodeIntAs(0xcf, -1)); err == nil {
		t.Error("uint64 above MaxInt64 must be rejected")
	}
}

func TestTolerantDecoding(t *testing.T) {
	// Unknown keys (older chunk_hash, proposed user_id) ignored; optional fields
	// missing get their defaults.
	frame := rawMap("chunk_hash", []byte{0xc4, 1, 9}, "model_name", strRaw("m"), "world_size", 1,
		"token_ids", []int{1, 2}, "start", 0, "end", 2, "request_id", strRaw("r"), "user_id",
		map[string]any{"nested": []any{1, "x"}})
	v, err := protocol.DecodeValue(protocol.TypeKey, frame)
	if err != nil {
		t.Fatal(err)
	}
	k := v.(protocol.Key)
	if k.WorkerID != nil || k.CacheSalt != "" || k.ModelName != "m" || len(k.TokenIDs) != 2 {
		t.Errorf("%+v", k)
	}
	// Missing required field.
	frame = rawMap("model_name", strRaw("m"), "world_size", 1)
	if _, err := protocol.DecodeValue(protocol.TypeKey, frame); err == nil || !strings.Contains(err.Error(), "missing required") {
		t.Errorf("missing fields: %v", err)
	}
	// Engine-driven register payloads carry more fields.
	reg := rawMap("instance_id", 7, "model_name", strRaw("m"), "world_size", 1, "block_size", 16,
		"num_layers", 2, "hidden_dim_size", 64, "dtype_str", strRaw("bfloat16"), "use_mla", true,
		"group_layouts", []any{})
	v, err = protocol.DecodeValue(protocol.TypeRegister, reg)
	if err != nil || !v.(protocol.RegisterPayload).UseMLA || v.(protocol.RegisterPayload).InstanceID != 7 {
		t.Errorf("register with extra fields: %+v %v", v, err)
	}
	// Trailing bytes are rejected.
	if _, err := protocol.DecodeValue(protocol.TypeInt, []byte{1, 2}); err == nil {
		t.Error("trailing bytes accepted")
	}
	// Arrays that claim more elements than the frame holds fail without allocating.
	if _, err := protocol.DecodeValue(protocol.TypeRecords, []byte{0xdd, 0x7f, 0xff, 0xff, 0xff}); err == nil {
		t.Error("lying array length accepted")
	}
}

func TestStrVsBin(t *testing.T) {
	bin := mustEncode(t, []byte("abc"))
	if bin[0] != 0xc4 {
		t.Errorf("[]byte encoded with code 0x%02x, want bin8", bin[0])
	}
	if b := mustEncode(t, []byte(nil)); !bytes.Equal(b, []byte{0xc4, 0}) {
		t.Errorf("nil []byte encoded as % x, want empty bin", b)
	}
	str := mustEncode(t, "abc")
	if str[0] != 0xa3 {
		t.Errorf("string encoded with code 0x%02x, want fixstr", str[0])
	}
	if _, err := protocol.DecodeValue(protocol.TypeStr, bin); err == nil {
		t.Error("bin accepted as str")
	}
	if _, err := protocol.DecodeValue(protocol.TypeBytes, str); err == nil {
		t.Error("str accepted as bytes")
	}
	// bytes payloads are slices of the frame, not copies.
	big := make([]byte, 70000)
	frame := mustEncode(t, big)
	v, err := protocol.DecodeValue(protocol.TypeBytes, frame)
	if err != nil {
		t.Fatal(err)
	}
	got := v.([]byte)
	if len(got) != len(big) || &got[0] != &frame[5] {
		t.Error("bytes payload was copied")
	}
	if _, err := protocol.DecodeValue(protocol.TypeBytes, frame[:len(frame)-1]); err == nil {
		t.Error("short bin accepted")
	}
}

func TestResultEncoding(t *testing.T) {
	check := func(name string, v any, want any) {
		t.Helper()
		var got any
		if err := msgpack.Unmarshal(mustEncode(t, v), &got); err != nil {
			t.Fatal(err)
		}
		wb, _ := msgpack.Marshal(want)
		var w any
		_ = msgpack.Unmarshal(wb, &w)
		if !reflect.DeepEqual(got, w) {
			t.Errorf("%s: got %#v want %#v", name, got, w)
		}
	}
	check("register", protocol.RegisterResponse{ShmName: "lmcache_l1_pool_x", PoolSize: 1 << 30},
		map[string]any{"shm_name": "lmcache_l1_pool_x", "pool_size": 1 << 30})
	check("prepare store pickle", protocol.PrepareStoreResponse{}, map[string]any{"context": map[string]any{}})
	check("prepare store shm", protocol.PrepareStoreResponse{Shm: true, Slots: []protocol.Slot{{Offset: 4096, Length: 16, Shape: []int{2, 2}, Dtype: "float32"}}, ChunkIndices: []int{1}},
		map[string]any{"context": map[string]any{"slots": []any{map[string]any{"offset": 4096, "length": 16, "shape": []any{2, 2}, "dtype": "float32"}}, "chunk_indices": []any{1}}})
	check("prepare retrieve miss", protocol.PrepareRetrieveResponse{}, map[string]any{"success": false, "data": []byte{}, "context": map[string]any{}})
	// Compact ints: 1 is a positive fixint.
	if b := mustEncode(t, 1); !bytes.Equal(b, []byte{1}) {
		t.Errorf("int 1 encoded as % x", b)
	}
	if b := mustEncode(t, int64(300)); !bytes.Equal(b, []byte{0xcd, 1, 44}) {
		t.Errorf("int 300 encoded as % x", b)
	}
}

func TestDecodeRequest(t *testing.T) {
	p := loadProfile(t, "nongpu-v1")
	enc := func(v any) []byte { return mustEncode(t, v) }
	key := protocol.Key{ModelName: "m", WorldSize: 1, WorkerID: intPtr(0), TokenIDs: []uint32{1}, End: 1, RequestID: "r"}
	spec, args, err := p.DecodeRequest([][]byte{enc(7), enc(12), enc(key), enc(3), enc([]byte("data"))})
	if err != nil || spec.Name != "COMMIT_STORE" || len(args) != 3 || string(args[2].([]byte)) != "data" || args[1].(int64) != 3 {
		t.Fatalf("COMMIT_STORE: %v %v %v", spec, args, err)
	}
	recs := []protocol.BlockAllocationRecord{{ReqID: "q", NewBlockIDs: []int64{1}, NewTokenIDs: []int64{2}}}
	for _, frames := range [][][]byte{
		{enc(1), enc(18), enc(recs)},
		{enc(1), enc(18), enc(4), enc("m"), enc(recs)},
	} {
		spec, args, err := p.DecodeRequest(frames)
		if err != nil || spec.Name != "REPORT_BLOCK_ALLOCATION" || args[len(args)-1].([]protocol.BlockAllocationRecord)[0].ReqID != "q" {
			t.Errorf("REPORT_BLOCK_ALLOCATION %d frames: %v %v", len(frames), args, err)
		}
	}
	spec, _, err = p.DecodeRequest([][]byte{enc(1), enc(3), []byte("cuda ipc")})
	if err != nil || spec.Unsupported != protocol.KindCUDAUnsupported {
		t.Errorf("STORE: %v %v", spec, err)
	}
	for _, c := range []struct {
		frames [][]byte
		kind   string
	}{
		{[][]byte{enc(1)}, protocol.KindShort},
		{[][]byte{enc(1), []byte("garbage")}, protocol.KindBadHeader},
		{[][]byte{{0xc1}, enc(19)}, protocol.KindBadHeader},
		{[][]byte{enc(1), enc(250)}, protocol.KindUnknownType},
		{[][]byte{enc(1), enc(19), enc(1)}, protocol.KindArity},
		{[][]byte{enc(1), enc(18), enc(1), enc(2)}, protocol.KindArity},
		{[][]byte{enc(1), enc(9), []byte("not msgpack")}, protocol.KindPayload},
		{[][]byte{enc(1), enc(9), enc(5)}, protocol.KindPayload},
	} {
		_, _, err := p.DecodeRequest(c.frames)
		var de *protocol.DecodeError
		if !errors.As(err, &de) || de.Kind != c.kind {
			t.Errorf("frames %q: err %v, want kind %s", c.frames, err, c.kind)
		}
	}
}

// FuzzDecodeFrames feeds random frame sets to every profile: decoding must never
// panic, a success must be a request of the profile, and the bytes allocated
// stay within a small multiple of the input (lying lengths, deep nesting and
// many items cannot make the decoder work or allocate beyond the frame).
func FuzzDecodeFrames(f *testing.F) {
	profiles := []*protocol.Profile{loadProfile(f, "nongpu-v1"), loadProfile(f, "nongpu-v2"), loadProfile(f, "engine-driven")}
	enc := func(v any) []byte { return mustEncode(f, v) }
	key := protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: []uint32{1, 2}, End: 2, RequestID: "r"}
	f.Add(joinFrames(enc(0), enc(19)))
	f.Add(joinFrames(enc(1), enc(11), enc(key), enc(0)))
	f.Add(joinFrames(enc(2), enc(12), enc(key), enc(0), enc([]byte{1, 2, 3})))
	f.Add(joinFrames(enc(3), enc(10), enc(protocol.RegisterPayload{ModelName: "m", DtypeStr: "float16"})))
	f.Add(joinFrames(enc(4), enc(18), enc([]protocol.BlockAllocationRecord{{ReqID: "x"}})))
	f.Add([]byte{0xff, 0x00})
	f.Add(joinFrames(enc(1), enc(11), rawMap(append(keyFields([]uint32{1}), "x", nested(30000, 0x91))...), enc(0)))
	f.Add(joinFrames(enc(4), enc(20), append([]byte{0xdd, 0, 1, 0, 0}, bytes.Repeat([]byte{0x80}, 4096)...)))
	f.Fuzz(func(t *testing.T, data []byte) {
		frames := splitFrames(data)
		for _, p := range profiles {
			before := heapAllocBytes()
			spec, args, err := p.DecodeRequest(frames)
			limit := uint64(maxAllocRatio*len(data) + allocPerFrame*len(frames) + allocFixedCost)
			if got := heapAllocBytes() - before; got > limit {
				t.Fatalf("%s: %d bytes allocated for %d input bytes in %d frames (limit %d)",
					p.Name, got, len(data), len(frames), limit)
			}
			if err == nil {
				if spec == nil {
					t.Fatal("nil spec without error")
				}
				if spec.Unsupported == "" && len(args) != len(frames)-2 {
					t.Fatalf("%s: %d args for %d frames", spec.Name, len(args), len(frames))
				}
			}
		}
	})
}

// Fuzz input format: frames separated by a 2-byte length prefix each.
func joinFrames(frames ...[]byte) []byte {
	var out []byte
	for _, f := range frames {
		out = binary.BigEndian.AppendUint16(out, uint16(len(f)))
		out = append(out, f...)
	}
	return out
}

func splitFrames(data []byte) [][]byte {
	var frames [][]byte
	for len(data) >= 2 {
		n := int(binary.BigEndian.Uint16(data))
		data = data[2:]
		if n > len(data) {
			n = len(data)
		}
		frames = append(frames, data[:n])
		data = data[n:]
	}
	return frames
}

func TestFuzzSeedCorpusCommitted(t *testing.T) {
	entries, err := os.ReadDir(filepath.Join("testdata", "fuzz", "FuzzDecodeFrames"))
	if err != nil || len(entries) == 0 {
		t.Fatalf("seed corpus missing: %v", err)
	}
}

// TestGroupLayouts covers register's group_layouts: a round trip of two
// groups, nil as none, and the hostile shapes (too many, missing fields,
// wrong types) refused with an error.
func TestGroupLayouts(t *testing.T) {
	p := protocol.RegisterPayload{InstanceID: 3, ModelName: "hy", WorldSize: 1, BlockSize: 4, NumLayers: 2,
		HiddenDimSize: 8, DtypeStr: "float16", GroupLayouts: []protocol.GroupLayout{
			{BlockSize: 4, NumLayers: 2, HiddenDimSize: 8, DtypeStr: "float16", TokensPerBlock: 4},
			{BlockSize: 16, NumLayers: 1, HiddenDimSize: 32, DtypeStr: "float32", UseMLA: true, TokensPerBlock: 16},
		}}
	v, err := protocol.DecodeValue(protocol.TypeRegister, mustEncode(t, p))
	if err != nil {
		t.Fatal(err)
	}
	got := v.(protocol.RegisterPayload)
	if len(got.GroupLayouts) != 2 || got.GroupLayouts[1] != p.GroupLayouts[1] || got.GroupLayouts[0] != p.GroupLayouts[0] {
		t.Errorf("round trip: %+v", got.GroupLayouts)
	}
	base := []any{"instance_id", 7, "model_name", strRaw("m"), "world_size", 1, "block_size", 16,
		"num_layers", 2, "hidden_dim_size", 64, "dtype_str", strRaw("bfloat16"), "use_mla", false}
	if v, err := protocol.DecodeValue(protocol.TypeRegister, rawMap(append(base, "group_layouts", nil)...)); err != nil || v.(protocol.RegisterPayload).GroupLayouts != nil {
		t.Errorf("nil group_layouts: %+v %v", v, err)
	}
	one := map[string]any{"block_size": 4, "num_layers": 1, "hidden_dim_size": 8, "dtype_str": "float16", "use_mla": false, "tokens_per_block": 4}
	many := make([]any, protocol.MaxGroupLayouts+1)
	for i := range many {
		many[i] = one
	}
	for name, gl := range map[string]any{
		"too many":      many,
		"missing dtype": []any{map[string]any{"block_size": 4, "num_layers": 1, "hidden_dim_size": 8}},
		"not a map":     []any{5},
		"not an array":  "x",
		"bad int":       []any{map[string]any{"block_size": "4", "num_layers": 1, "hidden_dim_size": 8, "dtype_str": "f"}},
	} {
		if _, err := protocol.DecodeValue(protocol.TypeRegister, rawMap(append(base, "group_layouts", gl)...)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A lying array length fails before allocating.
	frame := rawMap(append(base, "group_layouts", []byte{0xdd, 0x00, 0x00, 0x00, 0x10})...)
	if _, err := protocol.DecodeValue(protocol.TypeRegister, frame); err == nil {
		t.Error("lying group_layouts length accepted")
	}
}

// Load reads a table through the function it is handed and names the
// profile in a parse error.
func TestLoad(t *testing.T) {
	p, err := protocol.Load("nongpu-v1", assets.Protocol)
	if err != nil || p.Name == "" {
		t.Fatalf("embedded profile: %v, %v", p, err)
	}
	if _, err := protocol.Load("nope", assets.Protocol); err == nil || !strings.Contains(err.Error(), "nongpu-v1") {
		t.Errorf("unknown profile: %v", err)
	}
	bad := func(string) ([]byte, error) { return []byte("requests: [}"), nil }
	if _, err := protocol.Load("broken", bad); err == nil || !strings.Contains(err.Error(), "broken") {
		t.Errorf("bad table: %v", err)
	}
}
