package rpc_test

import (
	"bytes"
	"context"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/core/rpc/client"
	"kvdock/core/testkit/logbuf"
	"kvdock/core/testkit/poll"
)

// echoHandlers register handlers that answer with their wire name and args,
// so a test sees which table a message was read under.
type seen struct {
	mu    sync.Mutex
	calls []string
}

func (s *seen) add(name string) {
	s.mu.Lock()
	s.calls = append(s.calls, name)
	s.mu.Unlock()
}

func (s *seen) last() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.calls) == 0 {
		return ""
	}
	return s.calls[len(s.calls)-1]
}

func recordAll(h *harness, s *seen, results map[string]any) {
	for _, name := range protocol.CanonicalNames() {
		h.srv.Handle(name, func(_ context.Context, r *rpc.Request) (any, error) {
			s.add(r.Spec.Profile + ":" + r.Spec.Handler + fmt.Sprint(len(r.Args)))
			return results[name], nil
		})
	}
}

func TestMessageProfileOverTheWire(t *testing.T) {
	p := profile(t, "rpc-messages")
	h := start(t, rpc.Options{Profile: p})
	var s seen
	recordAll(h, &s, map[string]any{protocol.CommitStore: true, protocol.GetChunkSize: int64(64),
		protocol.Noop: "OK", protocol.Ping: true, protocol.QueryPrefetchStatus: nil,
		protocol.RegisterKVCacheNonGPUContext: protocol.RegisterResponse{ShmName: "seg", PoolSize: 4}})
	c := dial(t, h)
	ctx := context.Background()
	var n int64
	r, err := c.Call(ctx, "GET_CHUNK_SIZE")
	if err != nil || r.Decode(&n) != nil || n != 64 {
		t.Fatalf("GET_CHUNK_SIZE %v %v %d", r, err, n)
	}
	k := protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: []uint32{1, 2}, End: 2, RequestID: "r"}
	var ok bool
	if r, err := c.Call(ctx, "COMMIT_STORE", k, int64(3), []byte("data")); err != nil || r.Decode(&ok) != nil || !ok {
		t.Fatalf("COMMIT_STORE %v %v", r, err)
	}
	if s.last() != "rpc-messages:COMMIT_STORE3" {
		t.Errorf("handler saw %s", s.last())
	}
	// None results: an empty struct / a nil field, never a missing frame.
	if r, err := c.Call(ctx, "QUERY_PREFETCH_STATUS", "r"); err != nil || r.Present {
		t.Fatalf("QUERY_PREFETCH_STATUS %+v %v", r, err)
	}
	if r, err := c.Call(ctx, "END_SESSION", "r"); err != nil || r.Present {
		t.Fatalf("END_SESSION %+v %v", r, err)
	}
	if _, err := c.Call(ctx, "CLEAR"); err != nil || s.last() != "rpc-messages:CLEAR0" {
		t.Fatalf("CLEAR {} %v %s", err, s.last())
	}
	if _, err := c.Call(ctx, "CLEAR", true); err != nil || s.last() != "rpc-messages:CLEAR1" {
		t.Fatalf("CLEAR {force} %v %s", err, s.last())
	}
	if _, err := c.Call(ctx, "PING", nil); err != nil || s.last() != "rpc-messages:PING1" {
		t.Fatalf("PING {None} %v %s", err, s.last())
	}
	var rr protocol.RegisterResponse
	reg := protocol.RegisterPayload{InstanceID: 1, ModelName: "m", WorldSize: 1, BlockSize: 16, NumLayers: 1,
		HiddenDimSize: 8, DtypeStr: "float16"}
	r, err = c.Call(ctx, "REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT", reg)
	if err != nil || !r.Present {
		t.Fatalf("register %v %v", r, err)
	}
	if rr, err = protocol.DecodeRegisterResponse(r.Raw, protocol.DefaultLimits()); err != nil || rr.ShmName != "seg" {
		t.Fatalf("register reply %+v %v", rr, err)
	}
	// The raw reply frame of a None result is the empty struct.
	d := rawDealer(t, h.srv.Endpoint())
	msg, _ := protocol.EncodeMessage(mustSpec(t, p, "END_SESSION"), "x")
	if _, err := d.SendMessage(enc(t, int64(9)), enc(t, int64(13)), msg); err != nil {
		t.Fatal(err)
	}
	reply, err := d.RecvMessageBytes(0)
	if err != nil || len(reply) != 3 || !bytes.Equal(reply[2], []byte{0x80}) {
		t.Fatalf("END_SESSION raw reply %x %v", reply, err)
	}
}

func mustSpec(t *testing.T, p *protocol.Profile, name string) *protocol.Spec {
	t.Helper()
	s, ok := p.ByName(name)
	if !ok {
		t.Fatalf("%s: no %s", p.Name, name)
	}
	return s
}

// autoProfiles are the detection tables, newest first, as the engine gives them.
// startAuto starts an auto server over every table, nongpu-v1 the default,
// logging to the returned buffer.
func startAuto(t *testing.T) ([]*protocol.Profile, *harness, *logbuf.Buffer) {
	t.Helper()
	profiles := autoProfiles(t)
	logs := &logbuf.Buffer{}
	h := start(t, rpc.Options{Profile: profiles[5], Detect: profiles,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	return profiles, h, logs
}

func autoProfiles(t *testing.T) []*protocol.Profile {
	return []*protocol.Profile{profile(t, "rpc-messages"), profile(t, "engine-driven-v2"),
		profile(t, "engine-driven-v2-early"), profile(t, "engine-driven"), profile(t, "nongpu-v2"),
		profile(t, "nongpu-v1")}
}

// TestAutoDetectsEachTable runs one worker flow per table (register, store,
// retrieve, as LMCache's workers do) against one auto server and checks
// that every request reached the handler its own table names, and that
// each peer was settled on its table with the evidence logged.
func TestAutoDetectsEachTable(t *testing.T) {
	profiles, h, logs := startAuto(t)
	var s seen
	recordAll(h, &s, map[string]any{protocol.CommitStore: true, protocol.CommitRetrieve: true,
		protocol.GetExperimental:              []string{},
		protocol.PrepareStore:                 protocol.PrepareStoreResponse{},
		protocol.PrepareRetrieve:              protocol.PrepareRetrieveResponse{Success: true, Data: []byte("x")},
		protocol.RegisterKVCacheNonGPUContext: protocol.RegisterResponse{}, protocol.GetChunkSize: int64(64)})
	k := protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: []uint32{1, 2}, End: 2, RequestID: "r"}
	reg := protocol.RegisterPayload{InstanceID: 1, ModelName: "m", WorldSize: 1, BlockSize: 16, NumLayers: 1,
		HiddenDimSize: 8, DtypeStr: "float16"}
	for _, p := range profiles {
		c, err := client.Dial(h.srv.Endpoint(), p, client.Options{Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		type step struct {
			name string
			args []any
		}
		var steps []step
		if _, ok := p.ByName(protocol.GetExperimental); ok {
			// Workers of the frozen numbers ask first; it is what tells
			// the two engine-driven-v2 numberings apart.
			steps = append(steps, step{protocol.GetExperimental, nil})
		}
		steps = append(steps, []step{
			{protocol.RegisterKVCacheNonGPUContext, []any{reg}},
			{protocol.PrepareStore, []any{k, int64(1)}},
			{protocol.CommitStore, []any{k, int64(1), []byte("bytes")}},
			{protocol.PrepareRetrieve, []any{k, int64(1)}},
			{protocol.CommitRetrieve, []any{k, int64(1)}},
			{protocol.GetChunkSize, nil},
		}...)
		for _, st := range steps {
			r, err := c.Call(ctx, st.name, st.args...)
			if err != nil {
				t.Fatalf("%s worker: %s: %v", p.Name, st.name, err)
			}
			spec, _ := p.ByName(st.name)
			got := s.last()
			if !strings.HasSuffix(got, ":"+spec.Handler+fmt.Sprint(len(st.args))) {
				t.Errorf("%s worker: %s reached %s", p.Name, st.name, got)
			}
			if st.name == protocol.CommitRetrieve {
				var ok bool
				if r.Decode(&ok) != nil || !ok {
					t.Errorf("%s worker: COMMIT_RETRIEVE answered %+v", p.Name, r)
				}
			}
		}
		c.Close()
	}
	st := h.srv.Stats()
	for _, p := range profiles {
		if st.Detections[p.Name] != 1 {
			t.Errorf("detections %v: want one peer per table", st.Detections)
		}
	}
	if st.AmbiguousDetections != 0 {
		t.Errorf("ambiguous detections %d: every table was told apart", st.AmbiguousDetections)
	}
	out := logs.String()
	for _, p := range profiles {
		if !strings.Contains(out, "profile="+p.Name) || !strings.Contains(out, "evidence=") {
			t.Errorf("no detection log for %s:\n%s", p.Name, out)
		}
	}
}

// TestAutoAmbiguousUnanswered: a message its candidates read as different
// requests with no reply every reading's client decodes is dropped
// unanswered and counted; one with such a reply is served; a message
// fitting no table is bad input and narrows nothing.
func TestAutoAmbiguousUnanswered(t *testing.T) {
	_, h, logs := startAuto(t)
	var s seen
	recordAll(h, &s, map[string]any{protocol.Ping: true, protocol.GetChunkSize: int64(64), protocol.Noop: "OK"})
	d := rawDealer(t, h.srv.Endpoint())
	send := func(typ int64, payload ...[]byte) {
		t.Helper()
		frames := append([][]byte{enc(t, int64(1)), enc(t, typ)}, payload...)
		if _, err := d.SendMessage(toAny(frames)...); err != nil {
			t.Fatal(err)
		}
	}
	// 17 with no payload: nongpu-v1 PING (bool), nongpu-v2 GET_CHUNK_SIZE
	// (int), engine-driven CLEAR (no result frame): no reply decodes in
	// all three, and CLEAR never runs on a guess.
	send(17)
	poll.Until(t, statsLimit, "ambiguous 17 counted", func() bool { return h.srv.Stats().BadInput[protocol.KindAmbiguous] == 1 })
	if s.last() != "" {
		t.Errorf("ambiguous 17 ran %s", s.last())
	}
	if !strings.Contains(logs.String(), "ambiguous") {
		t.Errorf("no ambiguity log:\n%s", logs.String())
	}
	// Type 99 fits no table: bad input, no reply, and the next message
	// still decides.
	send(99)
	// 19 []: nongpu-v1 NOOP (str), engine-driven PING (bool): "OK" decodes
	// in both (bool("OK")).
	send(19)
	reply, err := d.RecvMessageBytes(0)
	if err != nil {
		t.Fatal(err)
	}
	if h.srv.Stats().BadInput[protocol.KindUnknownType] != 1 {
		t.Errorf("bad input %v", h.srv.Stats().BadInput)
	}
	if s.last() != "nongpu-v1:NOOP0" || len(reply) != 3 || !bytes.Equal(reply[2], enc(t, "OK")) {
		t.Errorf("19 served as %s, reply %x", s.last(), reply)
	}
	// A GPU-path request (3: STORE or REGISTER_Q_CACHE in every table) is
	// no evidence: counted as unsupported under the default, and a later
	// message still decides.
	send(3, enc(t, "a"), enc(t, int64(1)))
	send(11, enc(t, protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: []uint32{1}, End: 1}), enc(t, int64(1)))
	if _, err := d.RecvMessageBytes(0); err != nil {
		t.Fatal(err)
	}
	if h.srv.Stats().BadInput[protocol.KindCUDAUnsupported] != 1 {
		t.Errorf("bad input %v", h.srv.Stats().BadInput)
	}
	if s.last() != "nongpu-v1:PREPARE_STORE2" || h.srv.Stats().Detections["nongpu-v1"] != 1 {
		t.Errorf("11 [key, int] served as %s, detections %v", s.last(), h.srv.Stats().Detections)
	}
}

// TestAutoFirstMessages: each era's NOOP, CLEAR, PING and GET_CHUNK_SIZE
// as a peer's first message, under every default: never CLEAR on a guess,
// and a reply only when every reading's client decodes it (int() and
// bool() coerce, a str client needs a str, a CLEAR client no frame).
func TestAutoFirstMessages(t *testing.T) {
	profiles := autoProfiles(t)
	const none = "" // no reply
	cases := []struct {
		what    string
		typ     int64
		payload []any
		served  string // handler reached, "" none
		reply   any    // decoded reply frame, none: no reply at all
	}{
		{"nongpu-v1 CLEAR (decided)", 15, nil, "CLEAR", nil},
		{"nongpu-v1 GET_CHUNK_SIZE / nongpu-v2 CLEAR", 16, nil, none, none},
		{"nongpu-v1 PING / nongpu-v2 GET_CHUNK_SIZE / engine-driven CLEAR", 17, nil, none, none},
		{"nongpu-v2 PING / engine-driven GET_CHUNK_SIZE", 18, nil, "GET_CHUNK_SIZE", int64(64)},
		{"nongpu-v1 NOOP / engine-driven PING", 19, nil, "NOOP", "OK"},
		{"nongpu-v2 NOOP (decided)", 20, nil, "NOOP", "OK"},
		{"engine-driven NOOP / engine-driven-v2 GET_CHUNK_SIZE", 21, nil, "GET_CHUNK_SIZE", "64"},
		{"engine-driven CLEAR [force] (decided)", 17, []any{true}, "CLEAR", nil},
		{"engine-driven PING [id] (decided)", 19, []any{int64(3)}, "PING", true},
		{"engine-driven-v2 CLEAR [force] (both numberings: CLEAR)", 20, []any{false}, "CLEAR", nil},
		{"engine-driven-v2 PING [None]", 22, []any{nil}, "PING", true},
		{"engine-driven-v2 NOOP", 24, nil, "NOOP", "OK"},
		{"engine-driven-v2 GET_EXPERIMENTAL (decided)", 32, nil, "GET_EXPERIMENTAL", []any{}},
		{"engine-driven-v2-early GET_EXPERIMENTAL (decided)", 40, nil, "GET_EXPERIMENTAL", []any{}},
	}
	for _, def := range profiles {
		h := start(t, rpc.Options{Profile: def, Detect: profiles})
		var s seen
		recordAll(h, &s, map[string]any{protocol.Ping: true, protocol.GetChunkSize: int64(64), protocol.Noop: "OK",
			protocol.GetExperimental: []string{}})
		for i, c := range cases {
			d := rawDealer(t, h.srv.Endpoint())
			_ = d.SetRcvtimeo(300 * time.Millisecond)
			frames := []any{enc(t, int64(i)), enc(t, c.typ)}
			for _, a := range c.payload {
				frames = append(frames, enc(t, a))
			}
			before := len(s.calls)
			if _, err := d.SendMessage(frames...); err != nil {
				t.Fatal(err)
			}
			reply, err := d.RecvMessageBytes(0)
			s.mu.Lock()
			ran := ""
			if len(s.calls) > before {
				ran = s.calls[len(s.calls)-1]
			}
			s.mu.Unlock()
			if c.served == none {
				if err == nil {
					t.Errorf("default %s, %s: answered %x", def.Name, c.what, reply)
				}
				if ran != "" {
					t.Errorf("default %s, %s: ran %s", def.Name, c.what, ran)
				}
				continue
			}
			if err != nil {
				t.Errorf("default %s, %s: no reply (%v)", def.Name, c.what, err)
				continue
			}
			if !strings.Contains(ran, ":"+c.served) {
				t.Errorf("default %s, %s: ran %q, want %s", def.Name, c.what, ran, c.served)
			}
			if c.reply == nil {
				if len(reply) != 2 {
					t.Errorf("default %s, %s: reply %x, want no result frame", def.Name, c.what, reply)
				}
				continue
			}
			if len(reply) != 3 || !bytes.Equal(reply[2], enc(t, c.reply)) {
				t.Errorf("default %s, %s: reply %x, want %#v", def.Name, c.what, reply, c.reply)
			}
		}
	}
}

// TestAutoRegisteredWorkerAsksChunkSize: after a registration every frames
// era of the seed numbering reads, the nongpu workers' GET_CHUNK_SIZE (16
// in nongpu-v1, 17 in nongpu-v2, which nongpu-v2 and engine-driven read as
// CLEAR) is answered: a registered worker never clears, so the CLEAR
// reading does not hold the reply back, and it still never runs.
func TestAutoRegisteredWorkerAsksChunkSize(t *testing.T) {
	profiles := autoProfiles(t)
	h := start(t, rpc.Options{Profile: profiles[0], Detect: profiles})
	var s seen
	recordAll(h, &s, map[string]any{protocol.Ping: true, protocol.GetChunkSize: int64(64),
		protocol.RegisterKVCacheNonGPUContext: protocol.RegisterResponse{ShmName: "seg", PoolSize: 4}})
	reg := protocol.RegisterPayload{InstanceID: 1, ModelName: "m", WorldSize: 1, BlockSize: 16, NumLayers: 1,
		HiddenDimSize: 8, DtypeStr: "float16"}
	for _, typ := range []int64{16, 17} {
		d := rawDealer(t, h.srv.Endpoint())
		if _, err := d.SendMessage(enc(t, int64(1)), enc(t, int64(10)), enc(t, reg)); err != nil {
			t.Fatal(err)
		}
		if _, err := d.RecvMessageBytes(0); err != nil {
			t.Fatalf("register: %v", err)
		}
		if _, err := d.SendMessage(enc(t, int64(2)), enc(t, typ)); err != nil {
			t.Fatal(err)
		}
		reply, err := d.RecvMessageBytes(0)
		if err != nil || len(reply) != 3 || !bytes.Equal(reply[2], enc(t, int64(64))) {
			t.Fatalf("GET_CHUNK_SIZE %d after registering: %x %v", typ, reply, err)
		}
		if !strings.HasSuffix(s.last(), ":GET_CHUNK_SIZE0") {
			t.Errorf("type %d ran %s", typ, s.last())
		}
	}
}

// TestAutoStateBounded: peers beyond MaxDetectPeers push the least recently
// seen out; the server keeps serving.
func TestAutoStateBounded(t *testing.T) {
	profiles := autoProfiles(t)
	h := start(t, rpc.Options{Profile: profiles[5], Detect: profiles, MaxDetectPeers: 4})
	for i := range 12 {
		d, err := zmq.NewSocket(zmq.DEALER)
		if err != nil {
			t.Fatal(err)
		}
		_ = d.SetLinger(0)
		_ = d.SetRcvtimeo(2 * time.Second)
		if err := d.SetIdentity(fmt.Sprintf("peer-%d", i)); err != nil {
			t.Fatal(err)
		}
		if err := d.Connect(h.srv.Endpoint()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		if _, err := d.SendMessage(enc(t, int64(1)), enc(t, int64(19))); err != nil {
			t.Fatal(err)
		}
		if _, err := d.RecvMessageBytes(0); err != nil {
			t.Fatalf("peer %d: %v", i, err)
		}
	}
	if n := rpc.DetectPeers(h.srv); n > 4 {
		t.Errorf("%d peers remembered, bound 4", n)
	}
}

func toAny(frames [][]byte) []any {
	out := make([]any, len(frames))
	for i, f := range frames {
		out[i] = f
	}
	return out
}

// TestAutoSettlesAPeerThatStaysAmbiguous: a peer whose messages every
// candidate reads alike (a scheduler sending LOOKUP, which means LOOKUP in
// the three older tables) is served throughout and settled after the bound
// on undecided messages, once.
func TestAutoSettlesAPeerThatStaysAmbiguous(t *testing.T) {
	profiles := autoProfiles(t)
	h := start(t, rpc.Options{Profile: profiles[0], Detect: profiles})
	var s seen
	recordAll(h, &s, nil)
	d := rawDealer(t, h.srv.Endpoint())
	k := enc(t, protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: []uint32{1}, End: 1})
	for i := range 100 {
		if _, err := d.SendMessage(enc(t, int64(i)), enc(t, int64(5)), k, enc(t, int64(1))); err != nil {
			t.Fatal(err)
		}
		// LOOKUP answers nothing under frames tables: wait for the handler.
		deadline := time.Now().Add(10 * time.Second)
		for {
			s.mu.Lock()
			n := len(s.calls)
			s.mu.Unlock()
			if n == i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("message %d not handled (%d calls)", i, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if !strings.HasSuffix(s.last(), ":LOOKUP2") {
		t.Errorf("LOOKUP served as %s", s.last())
	}
	if got := h.srv.Stats().Detections; len(got) != 1 || got["engine-driven"] != 1 {
		t.Errorf("detections %v, want the newest fitting table once", got)
	}
	if got := h.srv.Stats().AmbiguousDetections; got != 1 {
		t.Errorf("ambiguous detections %d, want 1 (the peer was settled by the tie-break)", got)
	}
}

// TestAutoDecodedArgsKeepTheirFrames: a message decoded while its peer's
// table is still being detected is handed to the handler as decoded args,
// and a bytes field inside a newest-table message struct points into the
// frame. The frame must then stay borrowed from libzmq until the handler is
// done (counted in flight), never be copied and freed under the args: the
// handler sees exactly the bytes sent.
func TestAutoDecodedArgsKeepTheirFrames(t *testing.T) {
	profiles := autoProfiles(t)
	h := start(t, rpc.Options{Profile: profiles[5], Detect: profiles, MaxMessageBytes: 64 << 20})
	type seen struct {
		crc      uint32
		n        int
		inflight int64
	}
	got := make(chan seen, 1)
	h.srv.Handle(protocol.CommitStore, func(_ context.Context, req *rpc.Request) (any, error) {
		data := req.Args[2].([]byte)
		got <- seen{crc: crc32.ChecksumIEEE(data), n: len(data), inflight: h.srv.Stats().InFlightBytes}
		return true, nil
	})
	const size = 3 << 20
	data := make([]byte, size)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	p := profiles[0] // rpc-messages: one struct frame carrying the data
	k := protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: []uint32{1, 2}, End: 2, RequestID: "r"}
	msg, err := protocol.EncodeMessage(mustSpec(t, p, protocol.CommitStore), k, int64(1), data)
	if err != nil {
		t.Fatal(err)
	}
	d := rawDealer(t, h.srv.Endpoint())
	spec := mustSpec(t, p, protocol.CommitStore)
	if _, err := d.SendMessage(enc(t, int64(1)), enc(t, spec.Number), msg); err != nil {
		t.Fatal(err)
	}
	s := <-got
	if _, err := d.RecvMessageBytes(0); err != nil {
		t.Fatalf("no reply: %v", err)
	}
	if s.n != size || s.crc != crc32.ChecksumIEEE(data) {
		t.Errorf("handler saw %d bytes crc %x; sent %d crc %x", s.n, s.crc, size, crc32.ChecksumIEEE(data))
	}
	if s.inflight < size {
		t.Errorf("%d in-flight bytes while the handler ran, want >= %d: the frame under the decoded args was released", s.inflight, size)
	}
	poll.Until(t, statsLimit, "in-flight bytes released", func() bool { return h.srv.Stats().InFlightBytes == 0 })
}

// TestDeferredAnswerUnderMessageProfile: a deferred answer is encoded under
// the profile its request came in (the newest table wraps every reply in a
// struct), not under a table it lost on the way.
func TestDeferredAnswerUnderMessageProfile(t *testing.T) {
	p := profile(t, "rpc-messages")
	h := start(t, rpc.Options{Profile: p})
	answers := make(chan func(any, error), 1)
	h.srv.Handle(protocol.QueryPrefetchStatus, func(_ context.Context, req *rpc.Request) (any, error) {
		answers <- req.Defer().Answer
		return nil, nil
	})
	c := dial(t, h)
	done := make(chan error, 1)
	var n int64
	go func() {
		r, err := c.Call(context.Background(), "QUERY_PREFETCH_STATUS", "r")
		if err == nil {
			err = r.Decode(&n)
		}
		done <- err
	}()
	answer := <-answers
	answer(int64(7), nil)
	select {
	case err := <-done:
		if err != nil || n != 7 {
			t.Fatalf("deferred reply: %d %v", n, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no deferred reply")
	}
	if st := h.srv.Stats(); st.BadInput[protocol.KindPanic] != 0 {
		t.Fatalf("panics: %v", st.BadInput)
	}
}

// fakeInstances is the registrations as the detection sees them: the
// table of each instance, and the instance each holder peer holds.
type fakeInstances struct {
	tables map[int64]string
	held   map[string]int64
}

func (f fakeInstances) InstanceTable(id int64) (string, bool) {
	p, ok := f.tables[id]
	return p, ok
}

func (fakeInstances) PeerDecided([]byte, string) {}

func (f fakeInstances) PeerTable(peer []byte) (string, bool) {
	id, ok := f.held[string(peer)]
	if !ok {
		return "", false
	}
	return f.InstanceTable(id)
}

// TestAutoHeldPeersOutliveChurn: peers cycling identities, decided or not,
// never change how a peer holding a registered instance is served, and a
// decided peer is never kept among the undecided: the decided table
// forgets its least recently seen peer instead, counted.
func TestAutoHeldPeersOutliveChurn(t *testing.T) {
	profiles := autoProfiles(t)
	inst := fakeInstances{tables: map[int64]string{7: "nongpu-v2"}, held: map[string]int64{"worker": 7}}
	srv, err := rpc.New(rpc.Options{Host: "localhost", Profile: profiles[0], Detect: profiles, MaxDetectPeers: 4,
		Instances: inst, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	var s seen
	h := &harness{srv: srv}
	recordAll(h, &s, map[string]any{protocol.GetChunkSize: int64(64), protocol.Noop: "OK",
		protocol.GetExperimental: []string{}, protocol.Ping: true})
	if err := srv.Bind(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	call := func(d *zmq.Socket, typ int64) ([][]byte, error) {
		if _, err := d.SendMessage(enc(t, int64(1)), enc(t, typ)); err != nil {
			t.Fatal(err)
		}
		return d.RecvMessageBytes(0)
	}
	w, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	_ = w.SetLinger(0)
	_ = w.SetRcvtimeo(2 * time.Second)
	if err := w.SetIdentity("worker"); err != nil {
		t.Fatal(err)
	}
	if err := w.Connect(srv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	churn := func(n int) {
		for i := range n {
			d := rawDealer(t, srv.Endpoint())
			typ := int64(32) // decided at once: engine-driven-v2's GET_EXPERIMENTAL
			if i%2 == 1 {
				typ = 18 // undecided: engine-driven GET_CHUNK_SIZE or nongpu-v2 PING
			}
			if _, err := call(d, typ); err != nil {
				t.Fatalf("churn peer %d: %v", i, err)
			}
			d.Close()
		}
	}
	// nongpu-v2's GET_CHUNK_SIZE (17) is nongpu-v1's PING and
	// engine-driven's CLEAR too: from a peer of unknown table it goes
	// unanswered; from the holder of a nongpu-v2 instance it is answered.
	for round := range 3 {
		churn(24)
		if n := rpc.DetectPeers(srv); n > 8 {
			t.Errorf("%d peers remembered, bound 4 + 4", n)
		}
		reply, err := call(w, 17)
		if err != nil || len(reply) != 3 || !bytes.Equal(reply[2], enc(t, int64(64))) {
			t.Fatalf("round %d: the holder after churn: GET_CHUNK_SIZE %x %v", round, reply, err)
		}
	}
	ev, undecided := rpc.DetectEvictions(srv)
	if ev == 0 {
		t.Errorf("no decided peer forgotten by 72 peers through a table of 4")
	}
	if undecided > 4 {
		t.Errorf("%d undecided peers, bound 4", undecided)
	}
}

// TestAutoInstanceTableWins: a message that names a registered instance is
// read under the table that instance registered through: from a peer
// decided on another table (nongpu-v2, by its NOOP at 20), 14 [key, 7]
// is nongpu-v2's PREPARE_RETRIEVE, but instance 7 registered through
// nongpu-v1, whose 14 is COMMIT_RETRIEVE; from a peer never seen it
// decides the peer. A message naming an instance not registered, or one
// whose table reads it otherwise, is read as before.
func TestAutoInstanceTableWins(t *testing.T) {
	profiles := autoProfiles(t)
	inst := fakeInstances{tables: map[int64]string{7: "nongpu-v1"}, held: map[string]int64{}}
	h := start(t, rpc.Options{Profile: profiles[5], Detect: profiles, Instances: inst, Logger: quietLogger()})
	var s seen
	recordAll(h, &s, map[string]any{protocol.CommitRetrieve: true, protocol.Noop: "OK",
		protocol.PrepareRetrieve: protocol.PrepareRetrieveResponse{Success: true, Data: []byte("x")}})
	k := enc(t, protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: []uint32{1}, End: 1})
	call := func(d *zmq.Socket, typ int64, payload ...[]byte) {
		t.Helper()
		if _, err := d.SendMessage(append([][]byte{enc(t, int64(1)), enc(t, typ)}, payload...)); err != nil {
			t.Fatal(err)
		}
		if _, err := d.RecvMessageBytes(0); err != nil {
			t.Fatalf("type %d: %v", typ, err)
		}
	}
	decided := rawDealer(t, h.srv.Endpoint())
	call(decided, 20)
	if got := s.last(); got != "nongpu-v2:NOOP0" {
		t.Fatalf("NOOP read as %s", got)
	}
	call(decided, 14, k, enc(t, int64(7)))
	if got := s.last(); got != "nongpu-v1:COMMIT_RETRIEVE2" {
		t.Errorf("a decided nongpu-v2 peer's 14 naming nongpu-v1's instance 7 read as %s", got)
	}
	call(decided, 14, k, enc(t, int64(8)))
	if got := s.last(); got != "nongpu-v2:PREPARE_RETRIEVE2" {
		t.Errorf("14 naming an unregistered instance read as %s, want the peer's table", got)
	}
	fresh := rawDealer(t, h.srv.Endpoint())
	call(fresh, 14, k, enc(t, int64(7)))
	if got := s.last(); got != "nongpu-v1:COMMIT_RETRIEVE2" {
		t.Errorf("a new peer's 14 naming instance 7 read as %s", got)
	}
	call(fresh, 19)
	if got := s.last(); got != "nongpu-v1:NOOP0" {
		t.Errorf("the new peer's 19 read as %s: it was not decided on its instance's table", got)
	}
}
