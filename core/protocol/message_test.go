package protocol_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"kvdock/core/protocol"
)

// pack encodes v with the reference msgpack library (maps as msgspec
// writes dataclasses when the keys are given in declaration order).
func pack(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.SetSortMapKeys(true)
	if err := e.Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func msgSpec(t *testing.T, p *protocol.Profile, num int64) *protocol.Spec {
	t.Helper()
	s, ok := p.ByNumber(num)
	if !ok {
		t.Fatalf("%s: no request %d", p.Name, num)
	}
	return s
}

// TestFrozenTables pins the newest profile and the last frames era to
// upstream's frozen wire ids (tests/v1/multiprocess/test_protocols.py @
// 00e8c126; POLL_KV_EVENTS: protocols/base.py @ 593e6c13).
func TestFrozenTables(t *testing.T) {
	for _, name := range []string{"rpc-messages", "engine-driven-v2"} {
		p := loadProfile(t, name)
		if p.Message() != (name == "rpc-messages") || p.ErrorMarker {
			t.Fatalf("%s: framing %q error_marker %v", name, p.Framing, p.ErrorMarker)
		}
		checkFrozen(t, p)
	}
	ed2 := loadProfile(t, "engine-driven-v2")
	for num, shape := range map[int64]string{10: "[str float]", 20: "[bool]", 22: "[int?]"} {
		if s := msgSpec(t, ed2, num); fmt.Sprint(s.Payload) != shape {
			t.Errorf("engine-driven-v2 %s payload %v, want %s", s.Name, s.Payload, shape)
		}
	}
}

func checkFrozen(t *testing.T, p *protocol.Profile) {
	t.Helper()
	frozen := map[string]int64{"REGISTER_KV_CACHE": 1, "UNREGISTER_KV_CACHE": 2, "REGISTER_Q_CACHE": 3,
		"UNREGISTER_Q_CACHE": 4, "STORE_Q": 5, "STORE": 6, "RETRIEVE": 7, "LOOKUP": 8,
		"QUERY_PREFETCH_STATUS": 9, "WAIT_PREFETCH_STATUS": 10, "QUERY_PREFETCH_LOOKUP_HITS": 11,
		"FREE_LOOKUP_LOCKS": 12, "END_SESSION": 13, "REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT": 14,
		"UNREGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT": 15, "PREPARE_STORE": 16, "COMMIT_STORE": 17,
		"PREPARE_RETRIEVE": 18, "COMMIT_RETRIEVE": 19, "CLEAR": 20, "GET_CHUNK_SIZE": 21, "PING": 22,
		"REPORT_BLOCK_ALLOCATION": 23, "NOOP": 24, "GET_EXPERIMENTAL": 32}
	if p.Name == "engine-driven-v2" {
		// The KV event poll channel, appended after CB_PROTOCOL_HANDSHAKE
		// (33) in protocols/base.py @ 593e6c13.
		frozen["POLL_KV_EVENTS"] = 34
	}
	if len(p.Requests) != len(frozen) {
		t.Fatalf("%d requests, want %d", len(p.Requests), len(frozen))
	}
	for name, num := range frozen {
		if s, ok := p.ByNumber(num); !ok || s.Name != name {
			t.Errorf("%s: number %d = %v, want %s", p.Name, num, s, name)
		}
	}
	served := map[string]int64{"engine-driven-v2": 2} // UNREGISTER_KV_CACHE [instance_id], as in every frames era
	for _, num := range []int64{1, 2, 3, 4, 5, 6, 7} {
		if served[p.Name] == num {
			continue
		}
		if s := msgSpec(t, p, num); s.Unsupported != protocol.KindCUDAUnsupported {
			t.Errorf("%s served", s.Name)
		}
	}
}

func TestMessageDecodeRequests(t *testing.T) {
	p := loadProfile(t, "rpc-messages")
	key := map[string]any{"model_name": "m", "world_size": 1, "worker_id": 0, "token_ids": []int{1, 2, 3},
		"start": 0, "end": 3, "request_id": "r", "cache_salt": "", "num_kv_readers": 1,
		"request_configs": nil, "null_chunk_mask": nil}
	// COMMIT_STORE {key, instance_id, data}: data is a slice of the frame.
	data := []byte("payload bytes")
	frame := pack(t, map[string]any{"key": key, "instance_id": 7, "data": data})
	args, err := p.DecodePayload(msgSpec(t, p, 17), [][]byte{frame})
	if err != nil {
		t.Fatal(err)
	}
	k := args[0].(protocol.Key)
	if k.ModelName != "m" || len(k.TokenIDs) != 3 || args[1].(int64) != 7 || !bytes.Equal(args[2].([]byte), data) {
		t.Fatalf("args %+v", args)
	}
	// Registration: the request struct is the payload itself (9 fields).
	reg := map[string]any{"instance_id": 3, "model_name": "m", "world_size": 1, "block_size": 16,
		"num_layers": 2, "hidden_dim_size": 8, "dtype_str": "float16", "use_mla": false, "num_physical_slots": nil}
	args, err = p.DecodePayload(msgSpec(t, p, 14), [][]byte{pack(t, reg)})
	if err != nil || args[0].(protocol.RegisterPayload).InstanceID != 3 {
		t.Fatalf("register %v %v", args, err)
	}
	// PING {instance_id: None} and {instance_id: 5}.
	args, err = p.DecodePayload(msgSpec(t, p, 22), [][]byte{pack(t, map[string]any{"instance_id": nil})})
	if err != nil || len(args) != 1 || args[0] != nil {
		t.Fatalf("ping nil: %v %v", args, err)
	}
	args, err = p.DecodePayload(msgSpec(t, p, 22), [][]byte{pack(t, map[string]any{"instance_id": 5})})
	if err != nil || args[0] != int64(5) {
		t.Fatalf("ping 5: %v %v", args, err)
	}
	// CLEAR {} (before PR #5158) and {force: true}.
	args, err = p.DecodePayload(msgSpec(t, p, 20), [][]byte{pack(t, map[string]any{})})
	if err != nil || len(args) != 0 {
		t.Fatalf("clear {}: %v %v", args, err)
	}
	args, err = p.DecodePayload(msgSpec(t, p, 20), [][]byte{pack(t, map[string]any{"force": true})})
	if err != nil || len(args) != 1 || args[0] != true {
		t.Fatalf("clear force: %v %v", args, err)
	}
	// WAIT {request_id, timeout}: a float, an int accepted too.
	args, err = p.DecodePayload(msgSpec(t, p, 10), [][]byte{pack(t, map[string]any{"request_id": "r", "timeout": 1.5})})
	if err != nil || args[1].(float64) != 1.5 {
		t.Fatalf("wait: %v %v", args, err)
	}
	args, err = p.DecodePayload(msgSpec(t, p, 10), [][]byte{pack(t, map[string]any{"request_id": "r", "timeout": 2})})
	if err != nil || args[1].(float64) != 2 {
		t.Fatalf("wait int timeout: %v %v", args, err)
	}
	// GET_CHUNK_SIZE {} with an unknown nested field skipped.
	args, err = p.DecodePayload(msgSpec(t, p, 21), [][]byte{pack(t, map[string]any{"future": []any{map[string]any{"a": 1}}})})
	if err != nil || len(args) != 0 {
		t.Fatalf("chunk size: %v %v", args, err)
	}
}

func TestMessageDecodeRejects(t *testing.T) {
	p := loadProfile(t, "rpc-messages")
	cases := []struct {
		name   string
		num    int64
		frames [][]byte
		want   string
	}{
		{"two frames", 21, [][]byte{pack(t, map[string]any{}), pack(t, map[string]any{})}, "want 1 request message"},
		{"no frame", 21, nil, "want 1 request message"},
		{"not a map", 15, [][]byte{pack(t, 7)}, "expected map"},
		{"missing field", 15, [][]byte{pack(t, map[string]any{"other": 1})}, `missing required field "instance_id"`},
		{"wrong type", 15, [][]byte{pack(t, map[string]any{"instance_id": "x"})}, `field "instance_id"`},
		{"nan timeout", 10, [][]byte{pack(t, map[string]any{"request_id": "r", "timeout": nanValue()})}, "not finite"},
		{"trailing bytes", 15, [][]byte{append(pack(t, map[string]any{"instance_id": 1}), 0xc0)}, "trailing"},
		{"long string", 13, [][]byte{pack(t, map[string]any{"request_id": strings.Repeat("x", 300)})}, "request_id"},
		{"register not a map", 14, [][]byte{pack(t, "x")}, "register_payload"},
	}
	// A repeated field (msgpack maps may repeat keys; msgspec keeps the last).
	rep := []byte{0x82}
	rep = append(rep, pack(t, "instance_id")...)
	rep = append(rep, 1)
	rep = append(rep, pack(t, "instance_id")...)
	rep = append(rep, 2)
	cases = append(cases, struct {
		name   string
		num    int64
		frames [][]byte
		want   string
	}{"repeated field", 15, [][]byte{rep}, "repeated"})
	// Deep nesting in an unknown field: skipped iteratively, refused past the bound.
	deep := []byte{0x81}
	deep = append(deep, pack(t, "x")...)
	for range protocol.MaxSkipDepth + 5 {
		deep = append(deep, 0x91)
	}
	deep = append(deep, 0xc0)
	cases = append(cases, struct {
		name   string
		num    int64
		frames [][]byte
		want   string
	}{"deep unknown", 21, [][]byte{deep}, "deep"})
	// An unknown field announcing 2^31 items it does not carry, and a map
	// announcing more pairs than bytes: refused before any allocation.
	huge := []byte{0x81}
	huge = append(huge, pack(t, "x")...)
	huge = append(huge, 0xdd, 0x80, 0, 0, 0)
	bigMap := []byte{0xdf, 0x7f, 0xff, 0xff, 0xff}
	for _, f := range [][]byte{huge, bigMap} {
		if _, err := p.DecodePayload(msgSpec(t, p, 21), [][]byte{f}); err == nil {
			t.Errorf("frame %x decoded", f)
		}
	}
	for _, c := range cases {
		_, err := p.DecodePayload(msgSpec(t, p, c.num), c.frames)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.name, err, c.want)
		}
	}
}

func nanValue() float64 {
	zero := 0.0
	return zero / zero
}

func TestMessageReplyFrames(t *testing.T) {
	p := loadProfile(t, "rpc-messages")
	dec := func(b []byte) any {
		var v any
		if err := msgpack.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		num  int64
		res  any
		want string
	}{
		{17, true, "map[success:true]"},
		{9, nil, "map[chunk_count:<nil>]"},
		{9, int64(3), "map[chunk_count:3]"},
		{21, int64(256), "map[chunk_size:256]"},
		{24, "OK", "map[message:OK]"},
		{22, true, "map[ok:true]"},
		{8, nil, "map[]"},
		{15, nil, "map[]"},
		{14, protocol.RegisterResponse{ShmName: "s", PoolSize: 9}, "map[pool_size:9 shm_name:s]"},
		{32, []string{}, "map[names:[]]"},
	} {
		b, ok, err := p.ReplyFrame(msgSpec(t, p, c.num), c.res)
		if err != nil || !ok {
			t.Fatalf("%d: %v %v", c.num, ok, err)
		}
		if got := fmtAny(dec(b)); got != c.want {
			t.Errorf("%d reply %s, want %s", c.num, got, c.want)
		}
	}
	// Frames profiles keep "None = no frame".
	v1 := loadProfile(t, "nongpu-v1")
	if _, ok, _ := v1.ReplyFrame(msgSpec(t, v1, 6), nil); ok {
		t.Error("frames profile sent a frame for None")
	}
	if b, ok, _ := v1.ReplyFrame(msgSpec(t, v1, 12), true); !ok || !bytes.Equal(b, []byte{0xc3}) {
		t.Errorf("frames bool reply %x", b)
	}
}

func fmtAny(v any) string {
	var b strings.Builder
	b.WriteString(strings.ReplaceAll(strings.TrimSpace(sprint(v)), "  ", " "))
	return b.String()
}

func TestParseRejectsBadMessageTables(t *testing.T) {
	bad := `name: x
framing: message
requests:
  - {name: A, number: 1, payload: [int, int], class: inline, handler: NOOP}
  - {name: B, number: 2, payload: [int], fields: [a, b], class: inline, handler: NOOP}
  - {name: C, number: 3, payload: [], result: bool, class: inline, handler: NOOP}
  - {name: D, number: 4, payload: [], result: none, reply: [x], class: inline, handler: NOOP}
  - {name: E, number: 5, payload: [int], fields: [a], optional: 2, class: inline, handler: NOOP}
  - {name: F, number: 6, payload: [], alternatives: [[int]], class: inline, handler: NOOP}
`
	_, err := protocol.Parse([]byte(bad))
	for _, want := range []string{"2 payload types without field names", "2 fields for 1 payload types",
		"needs exactly one reply field", "make no sense", "optional 2 of 1", "alternatives are for framing: frames"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if _, err := protocol.Parse([]byte("name: y\nframing: smoke\nrequests:\n  - {name: A, number: 1, payload: [], class: inline, handler: NOOP}\n")); err == nil ||
		!strings.Contains(err.Error(), "framing") {
		t.Errorf("bad framing accepted: %v", err)
	}
	if _, err := protocol.Parse([]byte("name: y\nrequests:\n  - {name: A, number: 1, payload: [int], fields: [a], class: inline, handler: NOOP}\n")); err == nil ||
		!strings.Contains(err.Error(), "need framing: message") {
		t.Errorf("fields in a frames profile accepted: %v", err)
	}
}

func sprint(v any) string { return fmt.Sprint(v) }
