package reliability

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/tests/harness"
	"kvdock/tests/harness/attackkit"
	"kvdock/transfer/torchpickle"
)

// hostile pickles: code execution, bombs and huge declared sizes.
func hostilePickles(t testing.TB) map[string][]byte {
	t.Helper()
	const (
		proto, global, binuni, tuple1, reduce, stop = 0x80, 'c', 'X', 0x85, 'R', '.'
		mark, none, longBinput, emptyList           = '(', 'N', 'r', ']'
		binbytes8, binunicode8, frame, dup, tuple2  = 0x8e, 0x8d, 0x95, '2', 0x86
		emptyTuple, memoize, binget, appends        = ')', 0x94, 'h', 'e'
	)
	uni := func(p []byte, s string) []byte {
		p = binary.LittleEndian.AppendUint32(append(p, binuni), uint32(len(s)))
		return append(p, s...)
	}
	call := func(mod, name, arg string) []byte {
		p := append([]byte{proto, 2, global}, mod+"\n"+name+"\n"...)
		return append(uni(p, arg), tuple1, reduce, stop)
	}
	marks := []byte{proto, 4}
	for range 200000 {
		marks = append(marks, mark)
	}
	memo := []byte{proto, 4, none}
	for i := range 100000 {
		memo = binary.LittleEndian.AppendUint32(append(memo, longBinput), uint32(i*7919))
	}
	doubling := []byte{proto, 4, emptyTuple}
	for range 60 {
		doubling = append(doubling, dup, tuple2) // 2^60 leaves if expanded
	}
	// A real tensor pickle whose storage claims 2^60 elements.
	real, err := torchpickle.AppendEncode(nil, []torchpickle.Tensor{{Dtype: "float32", Shape: []int{4099}, Data: make([]byte, 4099*4)}})
	if err != nil {
		t.Fatal(err)
	}
	claim := bytes.Clone(real)
	at := len(claim) - 4099*4 - 8 - 2*8 // raw element count, before the data and the trailing args
	if i := bytes.LastIndex(claim[:len(claim)-4099*4], binary.LittleEndian.AppendUint64(nil, 4099)); i > 0 {
		at = i
	}
	binary.LittleEndian.PutUint64(claim[at:], 1<<60)
	return map[string][]byte{
		"os.system":         call("os", "system", "touch /tmp/kvdock-pwned"),
		"posix.system":      call("posix", "system", "touch /tmp/kvdock-pwned"),
		"builtins.eval":     call("builtins", "eval", "__import__('os').system('touch /tmp/kvdock-pwned')"),
		"200k marks":        marks,
		"100k memo puts":    memo,
		"2^60 shared tuple": append(doubling, stop),
		"self list":         {proto, 4, emptyList, memoize, mark, binget, 0, binget, 0, appends, stop},
		"BINBYTES8 2^60":    binary.LittleEndian.AppendUint64([]byte{proto, 4, binbytes8}, 1<<60),
		"BINUNICODE8 2^63":  binary.LittleEndian.AppendUint64([]byte{proto, 4, binunicode8}, 1<<63),
		"FRAME 2^62":        binary.LittleEndian.AppendUint64([]byte{proto, 4, frame}, 1<<62),
		"2^60 elements":     claim,
	}
}

// TestMaliciousPicklesBoundedRSS sends every hostile pickle 20 times as a
// COMMIT_STORE payload to the real binary (SHM off): each is refused and
// counted as a COMMIT_STORE error (a handler error) or dropped, nothing is
// stored, the server keeps answering, and its peak RSS stays bounded.
func TestMaliciousPicklesBoundedRSS(t *testing.T) {
	srv := harness.Start(t, "--chunk-size", "16", "--shm-name", "")
	c := srv.Dial(t, srv.Protocol)
	w := harness.NewWorker(t, c, 1, "evil", true)
	ctx := context.Background()
	baseHWM := attackkit.ProcKiB(t, srv.PID(), "VmHWM")
	before := srv.Status(t)
	toks := harness.Tokens(1, 1, w.Chunk)
	k := w.Key(toks, 1, "evil")
	// Seed profiles answer a refused request with nothing: short timeouts.
	fast, err := client.Dial(srv.Endpoint, harness.Profile(t, srv.Protocol), client.Options{Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close()
	sent := 0
	pickles := hostilePickles(t)
	for name, data := range pickles {
		for range 2 {
			if _, err := c.Call(ctx, protocol.PrepareStore, k, w.ID); err != nil {
				t.Fatalf("%s: prepare: %v", name, err)
			}
			r, err := fast.Call(ctx, protocol.CommitStore, k, w.ID, data)
			sent++
			var ok bool
			if err == nil && r.Present && r.Decode(&ok) == nil && ok {
				t.Fatalf("%s: accepted", name)
			}
		}
		if r, err := c.Call(ctx, protocol.Noop); err != nil || !r.Present {
			t.Fatalf("server stopped answering after %s: %v", name, err)
		}
	}
	// Then a flood: every payload 20 times at once.
	flood, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, data := range pickles {
		for range 20 {
			wg.Add(1)
			sent++
			go func() {
				defer wg.Done()
				_, _ = fast.Call(flood, protocol.CommitStore, k, w.ID, data)
			}()
		}
	}
	wg.Wait()
	if r, err := c.Call(ctx, protocol.Noop); err != nil || !r.Present {
		t.Fatalf("server stopped answering after the flood: %v", err)
	}
	if n, err := harness.Lookup(ctx, c, "evil", toks, "l"); err != nil || n != 0 {
		t.Fatalf("a hostile store left a chunk: %d %v", n, err)
	}
	hwm := attackkit.ProcKiB(t, srv.PID(), "VmHWM")
	t.Logf("%d hostile pickles sent; peak RSS %d KiB before, %d KiB after", sent, baseHWM, hwm)
	if hwm-baseHWM > 96<<10 {
		t.Fatalf("peak RSS grew by %d KiB on hostile pickles", hwm-baseHWM)
	}
	st := srv.Status(t)
	cs, cs0 := st.Requests.ByType[protocol.CommitStore], before.Requests.ByType[protocol.CommitStore]
	t.Logf("COMMIT_STORE outcomes: %+v", cs)
	if cs.Error+cs.Dropped-cs0.Error-cs0.Dropped != int64(sent) || cs.OK != cs0.OK {
		t.Fatalf("%d hostile commits sent: %d counted as errors or dropped, %d as ok", sent, cs.Error+cs.Dropped-cs0.Error-cs0.Dropped, cs.OK-cs0.OK)
	}
	if d := st.Requests.BadInput[protocol.KindHandlerErr] - before.Requests.BadInput[protocol.KindHandlerErr]; d != cs.Error-cs0.Error {
		t.Fatalf("bad_input %s grew by %d for %d COMMIT_STORE errors", protocol.KindHandlerErr, d, cs.Error-cs0.Error)
	}
	if st.Pool.Objects != before.Pool.Objects || st.Pool.LiveBytes != before.Pool.LiveBytes {
		t.Fatalf("hostile commits stored something: objects %d → %d, live bytes %d → %d",
			before.Pool.Objects, st.Pool.Objects, before.Pool.LiveBytes, st.Pool.LiveBytes)
	}
}

// TestOversizedFramesRejected: with --max-message-bytes 1048576 (the
// smallest accepted) a 4 MiB frame gets no answer, is not held, and the
// server keeps serving.
func TestOversizedFramesRejected(t *testing.T) {
	srv := harness.Start(t, "--chunk-size", "16", "--shm-name", "", "--max-message-bytes", "1048576")
	c := srv.Dial(t, srv.Protocol)
	w := harness.NewWorker(t, c, 1, "big", true)
	baseHWM := attackkit.ProcKiB(t, srv.PID(), "VmHWM")
	big := make([]byte, 4<<20)
	for i := range 10 {
		fast, err := client.Dial(srv.Endpoint, harness.Profile(t, srv.Protocol), client.Options{Timeout: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		_, err = fast.Call(context.Background(), protocol.CommitStore, w.Key(harness.Tokens(i, 1, w.Chunk), 1, "big"), w.ID, big)
		_ = fast.Close()
		if err == nil {
			t.Fatalf("a 4 MiB frame over a 1 MiB limit was answered")
		}
	}
	if r, err := c.Call(context.Background(), protocol.Noop); err != nil || !r.Present {
		t.Fatalf("NOOP after oversized frames: %v", err)
	}
	// A normal-sized store still works.
	data := [][]byte{harness.ChunkData(1, 0, w.ChunkBytes)}
	if r, err := w.Store(context.Background(), harness.Tokens(1, 1, w.Chunk), data, "ok"); err != nil || r != "true" {
		t.Fatalf("store under the limit: %q %v", r, err)
	}
	hwm := attackkit.ProcKiB(t, srv.PID(), "VmHWM")
	t.Logf("10 oversized frames of 4 MiB; peak RSS %d KiB before, %d KiB after", baseHWM, hwm)
	if hwm-baseHWM > 32<<10 {
		t.Fatalf("peak RSS grew by %d KiB on rejected frames", hwm-baseHWM)
	}
}

// rawHTTP writes req to the HTTP port and returns the status code.
func rawHTTP(t *testing.T, port int, req []byte) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write(req); err != nil {
		t.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no HTTP answer to %.60q: %v", req, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestMalformedHTTPAnswered4xx speaks raw TCP to the real binary's HTTP
// port: every malformed request gets a 4xx, and the cache is untouched.
func TestMalformedHTTPAnswered4xx(t *testing.T) {
	srv := harness.Start(t, "--chunk-size", "16")
	c := srv.Dial(t, srv.Protocol)
	w := harness.NewWorker(t, c, 1, "http", false)
	toks := harness.Tokens(1, 1, w.Chunk)
	if r, err := w.Store(context.Background(), toks, [][]byte{harness.ChunkData(1, 0, w.ChunkBytes)}, "s"); err != nil || r != "true" {
		t.Fatalf("store: %q %v", r, err)
	}
	huge := "GET /status HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 256<<10) + "\r\n\r\n"
	cases := []struct {
		name string
		req  string
		want int
	}{
		{"garbage request line", "\x00\x01garbage\r\n\r\n", 400},
		{"no version", "GET /status\r\n\r\n", 400},
		{"huge header", huge, 431},
		{"wrong method", "DELETE /status HTTP/1.1\r\nHost: x\r\n\r\n", 405},
		{"GET on clear-cache", "GET /clear-cache HTTP/1.1\r\nHost: x\r\n\r\n", 405},
		{"unknown path", "GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n", 404},
		{"bad JSON body", "POST /clear-cache HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{\"a\": [1,", 400},
		{"body too large", "POST /clear-cache HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n", 413},
		{"bad content length", "POST /clear-cache HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400},
	}
	for _, tc := range cases {
		if got := rawHTTP(t, srv.HTTPPort, []byte(tc.req)); got != tc.want {
			t.Errorf("%s: HTTP %d, want %d", tc.name, got, tc.want)
		}
	}
	if st := srv.Status(t); st.Pool.Objects != 1 {
		t.Fatalf("malformed requests changed the cache: %d objects", st.Pool.Objects)
	}
}
