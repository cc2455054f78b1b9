package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/tests/harness"
	"kvdock/tests/harness/attackkit"
)

// What one peer can do to another worker by
// messages alone (unregister its id; taking its model with another layout:
// layouts_hostile_test.go),
// and what a thousand peers with maximal names and routing ids make
// /status weigh.

// namedPeer is a DEALER with a routing id of the test's choosing: a peer
// as another process on the host may present itself.
type namedPeer struct {
	zctx *zmq.Context
	sock *zmq.Socket
	prof *protocol.Profile
	uid  int64
}

func dialNamed(t testing.TB, srv *harness.Server, id []byte) *namedPeer {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	p := dialNamedIn(t, zctx, srv, id)
	p.zctx = zctx
	return p
}

// dialNamedIn is dialNamed on a context the caller terminates.
func dialNamedIn(t testing.TB, zctx *zmq.Context, srv *harness.Server, id []byte) *namedPeer {
	t.Helper()
	sock, err := zctx.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	// Long enough for the queued requests to leave before close.
	_ = sock.SetLinger(5 * time.Second)
	_ = sock.SetRcvtimeo(5 * time.Second)
	if err := sock.SetIdentity(string(id)); err != nil {
		t.Fatalf("routing id of %d bytes: %v", len(id), err)
	}
	if err := sock.Connect(srv.Endpoint); err != nil {
		t.Fatal(err)
	}
	p := &namedPeer{sock: sock, prof: harness.Profile(t, srv.Protocol)}
	t.Cleanup(p.close)
	return p
}

func (p *namedPeer) close() {
	if p.sock != nil {
		_ = p.sock.Close()
		p.sock = nil
		if p.zctx != nil {
			_ = p.zctx.Term()
		}
	}
}

// send queues one request of canonical name with its arguments.
func (p *namedPeer) send(t testing.TB, name string, args ...any) {
	t.Helper()
	spec, ok := p.prof.ByName(name)
	if !ok {
		t.Fatalf("%s not in profile", name)
	}
	msg := [][]byte{attackkit.Enc(t, p.uid), attackkit.Enc(t, spec.Number)}
	p.uid++
	for _, a := range args {
		msg = append(msg, attackkit.Enc(t, a))
	}
	for i, f := range msg {
		flag := zmq.SNDMORE
		if i == len(msg)-1 {
			flag = 0
		}
		if _, err := p.sock.SendBytes(f, flag); err != nil {
			t.Fatalf("send %s: %v", name, err)
		}
	}
}

// hostileName is a model name of keys.MaxModelLen (256) bytes that JSON
// writes at its longest: control bytes (six characters each as \u00XX),
// distinct per i.
func hostileName(i int) string {
	b := []byte(strings.Repeat("\x01", 256))
	for k := 0; k < 4; k++ {
		b[255-k] = byte(1 + (i>>(5*k))&31)
	}
	return string(b)
}

// hostilePeerID is a 255-byte routing id (ZMQ's longest), distinct per i.
func hostilePeerID(i int) []byte {
	b := []byte(strings.Repeat("\xff", 255))
	copy(b, fmt.Sprintf("peer-%06d-", i))
	return b
}

// TestHostileStatusSize: 1,024 contexts (server.max_instances' default),
// each registered by its own peer with a 255-byte routing id and a 256-byte
// model name of control bytes, each with a store and a lookup, keep
// GET /status under 1 MiB.
func TestHostileStatusSize(t *testing.T) {
	const n = 1024
	srv := harness.Start(t, "--chunk-size", "16")
	wid := 0
	before := attackkit.Handled(t, srv, protocol.Lookup)
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	const batch = 128
	for b := 0; b < n; b += batch {
		var peers []*namedPeer
		for i := b; i < b+batch && i < n; i++ {
			p := dialNamedIn(t, zctx, srv, hostilePeerID(i))
			peers = append(peers, p)
			name := hostileName(i)
			p.send(t, protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{InstanceID: int64(10000 + i),
				ModelName: name, WorldSize: 1, BlockSize: 16, NumLayers: harness.WorkerLayers, HiddenDimSize: harness.WorkerHidden, DtypeStr: "float32"})
			k := protocol.Key{ModelName: name, WorldSize: 1, WorkerID: &wid, TokenIDs: harness.Tokens(i, 1, 16), End: 16, RequestID: "s"}
			p.send(t, protocol.PrepareStore, k, int64(10000+i))
			p.send(t, protocol.CommitStore, k, int64(10000+i), []byte{})
			lk := k
			lk.WorkerID, lk.RequestID = nil, fmt.Sprint("l", i)
			lk.TokenIDs = harness.Tokens(i+n, 1, 16) // a miss, counted per model
			p.send(t, protocol.Lookup, lk, 1)
		}
		for _, p := range peers {
			p.close()
		}
	}
	_ = zctx.Term() // once every request has left
	if !attackkit.WaitHandled(t, srv, protocol.Lookup, before+n, time.Minute, "1,024 hostile peers") {
		t.Fatal("the lookups were not all handled")
	}
	st := srv.Status(t)
	if st.Transfer.Instances != n {
		t.Fatalf("%d instances registered, want %d", st.Transfer.Instances, n)
	}
	stores := int(st.Requests.ByType[protocol.CommitStore].OK)
	sb := attackkit.StatusBytes(t, srv, 30*time.Second)
	logSections(t, srv)
	t.Logf("/status with %d contexts (256-byte control-byte names, 255-byte routing ids, %d stores): %d bytes", n, stores, sb)
	if stores < n/2 {
		t.Errorf("only %d of %d stores counted: the traffic did not happen", stores, n)
	}
	if sb >= 1<<20 {
		t.Errorf("/status is %d bytes with %d contexts, bound 1 MiB", sb, n)
	}
	if len(st.NonCudaContextMeta) != n || len(st.Contexts)+st.ContextsOmitted != n {
		t.Errorf("/status lists %d contexts' meta, details %d and counts %d omitted; want all %d accounted for",
			len(st.NonCudaContextMeta), len(st.Contexts), st.ContextsOmitted, n)
	}
	attackkit.Alive(t, srv, time.Second, "1,024 hostile peers")
}

// logSections logs the size of each top-level part of /status (compact).
func logSections(t testing.TB, srv *harness.Server) {
	t.Helper()
	var parts map[string]json.RawMessage
	if err := attackkit.GetJSON(&http.Client{Timeout: 30 * time.Second}, srv, &parts); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for k, v := range parts {
		if len(v) > 4096 {
			fmt.Fprintf(&b, " %s=%d", k, len(v))
		}
	}
	t.Logf("/status parts over 4 KiB (compact bytes):%s", b.String())
}

// transferCounters reads /status's transfer counters by name, so the test
// reads the same document whatever fields a build has.
func transferCounters(t testing.TB, srv *harness.Server) map[string]float64 {
	t.Helper()
	var st struct {
		Transfer map[string]float64 `json:"transfer"`
		Events   []struct {
			Message string `json:"message"`
		} `json:"events"`
	}
	if err := attackkit.GetJSON(&http.Client{Timeout: 10 * time.Second}, srv, &st); err != nil {
		t.Fatal(err)
	}
	return st.Transfer
}

// shownPeer is a routing id as kvdock shows it: its first 16 bytes in hex.
func shownPeer(id []byte) string { return fmt.Sprintf("%x", id[:min(len(id), 16)]) }

// eventsWith returns the /status events whose message contains every part.
func eventsWith(t testing.TB, srv *harness.Server, parts ...string) []string {
	t.Helper()
	var out []string
	for _, e := range srv.Status(t).Events {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(e.Message, p)
		}
		if ok {
			out = append(out, e.Message)
		}
	}
	return out
}

// victimAnswered checks that each transfer request of instance id is
// answered within limit, with the failure reply of an instance that is
// not registered: no slots, commit false, retrieve a miss.
func victimAnswered(t *testing.T, srv *harness.Server, id int64, model string, limit time.Duration) {
	t.Helper()
	c := srv.Dial(t, srv.Protocol)
	wid := 0
	k := protocol.Key{ModelName: model, WorldSize: 1, WorkerID: &wid, TokenIDs: harness.Tokens(int(id), 1, 16), End: 16, RequestID: "v"}
	call := func(name string, args ...any) client.Reply {
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		defer cancel()
		start := time.Now()
		r, err := c.Call(ctx, name, args...)
		if err != nil || !r.Present {
			t.Fatalf("%s of instance %d not answered within %v (%v after %v): the worker waits out its timeout on every request",
				name, id, limit, err, time.Since(start).Round(time.Millisecond))
		}
		return r
	}
	var ps harness.PrepStore
	if err := call(protocol.PrepareStore, k, id).Decode(&ps); err != nil || len(ps.Context.Slots) != 0 {
		t.Fatalf("PREPARE_STORE of instance %d: %+v, %v; want no slots", id, ps, err)
	}
	var ok bool
	if err := call(protocol.CommitStore, k, id, []byte{}).Decode(&ok); err != nil || ok {
		t.Fatalf("COMMIT_STORE of instance %d: %v, %v; want false", id, ok, err)
	}
	var pr harness.PrepRetrieve
	if err := call(protocol.PrepareRetrieve, k, id).Decode(&pr); err != nil || pr.Success {
		t.Fatalf("PREPARE_RETRIEVE of instance %d: success %v, %v; want a miss", id, pr.Success, err)
	}
	if err := call(protocol.CommitRetrieve, k, id).Decode(&ok); err != nil || ok {
		t.Fatalf("COMMIT_RETRIEVE of instance %d: %v, %v; want false", id, ok, err)
	}
}

// TestHostileUnregisterOfAnotherPeersInstance: a peer sends UNREGISTER
// naming a live worker's id. The registration stays (the refusal is
// counted and its event names both peers) and the worker stores and
// retrieves on. Once the operator removes the instance, the worker's
// requests are answered with their failure replies within a second, never
// left to its timeout.
func TestHostileUnregisterOfAnotherPeersInstance(t *testing.T) {
	srv := harness.Start(t, "--chunk-size", "16")
	w := harness.NewWorker(t, srv.Dial(t, srv.Protocol), 700, "victim", false)
	squatterID := []byte("squatter-unregister")
	sq := dialNamed(t, srv, squatterID)
	before := attackkit.Handled(t, srv, protocol.UnregisterKVCache)
	sq.send(t, protocol.UnregisterKVCache, int64(700))
	if !attackkit.WaitHandled(t, srv, protocol.UnregisterKVCache, before+1, 10*time.Second, "another peer's UNREGISTER") {
		t.Fatal("UNREGISTER not handled")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	toks := harness.Tokens(70, 2, w.Chunk)
	data := attackkit.SeqData(70, 2, w.ChunkBytes)
	if r, err := w.Store(ctx, toks, data, "after-unregister"); err != nil || r != "true" {
		t.Fatalf("the victim's store after another peer's UNREGISTER: %q, %v", r, err)
	}
	attackkit.ReadBack(t, w, toks, data, "after-unregister-r")
	if n := transferCounters(t, srv)["refused_unregisters"]; n != 1 {
		t.Errorf("refused_unregisters = %v, want 1", n)
	}
	if ev := eventsWith(t, srv, "UNREGISTER of instance 700", shownPeer(squatterID), "refused"); len(ev) != 1 {
		t.Errorf("no refusal event naming the squatter: %v", ev)
	}

	// The operator's removal ends it; the worker is answered, not hung.
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/unregister?instance_id=700", srv.HTTPPort), "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	victimAnswered(t, srv, 700, "victim", time.Second)
	if n := transferCounters(t, srv)["unknown_instance_requests"]; n != 4 {
		t.Errorf("unknown-instance requests counted %v, want 4", n)
	}
	attackkit.Alive(t, srv, time.Second, "a hostile UNREGISTER")
}
