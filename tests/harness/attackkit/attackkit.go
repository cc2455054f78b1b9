// Package attackkit is the kit the hostile-local-peer tests share: a server
// started with a memory cap, liveness and memory probes, raw DEALER sockets
// that send without reading, the hostile payload builders, and the worker
// steps (prepare, write, commit) two interleaved workers take.
package attackkit

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"golang.org/x/sys/unix"

	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/tests/harness"
)

// AttackFull selects the full attack sizes (KVDOCK_ATTACK_FULL=1); CI runs
// scaled-down sizes whose bounds still tell a bounded server from an
// unbounded one.
func AttackFull() bool { return os.Getenv("KVDOCK_ATTACK_FULL") == "1" }

// serverMemCap bounds a server under attack (RLIMIT_AS): an unbounded one
// dies of it instead of eating the shared machine.
const serverMemCap = 3 << 30

// AttackChunk is the chunk size of the attacked servers: 256 tokens of 2
// layers × 16 float32 gives 64 KiB chunks, 1,024 of them in the 64 MiB pool.
const AttackChunk = 256

// StartAttacked starts the real binary with --chunk-size 256 and extra
// flags, capped at serverMemCap of address space and 1,024 open files.
// --max-message-bytes 128 MiB (above every attack's largest message) makes
// the attacks reach the decoders and queues whatever default cap a fix
// chooses: the bounds under test are those behind the message cap.
func StartAttacked(t *testing.T, extra ...string) *harness.Server {
	t.Helper()
	args := []string{"--chunk-size", fmt.Sprint(AttackChunk), "--max-message-bytes", fmt.Sprint(128 << 20)}
	srv := harness.Start(t, append(args, extra...)...)
	CapProcess(t, srv.PID())
	return srv
}

func CapProcess(t testing.TB, pid int) {
	t.Helper()
	if err := unix.Prlimit(pid, unix.RLIMIT_AS, &unix.Rlimit{Cur: serverMemCap, Max: serverMemCap}, nil); err != nil {
		t.Fatalf("prlimit AS: %v", err)
	}
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 1024, Max: 1024}, nil); err != nil {
		t.Fatalf("prlimit NOFILE: %v", err)
	}
}

// Alive fails the test unless a fresh client gets NOOP answered within d.
func Alive(t testing.TB, srv *harness.Server, d time.Duration, after string) {
	t.Helper()
	c, err := client.Dial(srv.Endpoint, harness.Profile(t, srv.Protocol), client.Options{Timeout: d})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	r, err := c.Call(context.Background(), protocol.Noop)
	if err != nil || !r.Present {
		out := srv.Output()
		if f := FatalIn(out); f != "" {
			out = f
		} else if len(out) > 2000 {
			out = out[len(out)-2000:]
		}
		t.Fatalf("NOOP not answered within %v after %s (%v, waited %v); server output tail:\n%s", d, after, err, time.Since(start), out)
	}
}

// resetPeak makes VmHWM start again from the current RSS (clear_refs 5).
func resetPeak(t testing.TB, pid int) {
	t.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		t.Fatalf("reset peak RSS: %v", err)
	}
}

// PeakGrowth measures fn: the server's peak RSS above its RSS before, KiB.
func PeakGrowth(t testing.TB, pid int, fn func()) (base, peak int64) {
	t.Helper()
	resetPeak(t, pid)
	base = ProcKiB(t, pid, "VmRSS")
	fn()
	return base, ProcKiB(t, pid, "VmHWM")
}

const KiB = 1 << 10

func MiB(kb int64) string { return fmt.Sprintf("%.1f MiB", float64(kb)/1024) }

// CheckBound fails unless the growth (KiB) is within limit (KiB); volume
// is the attack's size in bytes (sent, or replies asked for).
func CheckBound(t testing.TB, what string, base, peak, limit int64, volume int64) {
	t.Helper()
	t.Logf("%s: RSS %s → peak %s (growth %s) for %s of attack; bound %s", what, MiB(base), MiB(peak), MiB(peak-base),
		MiB(volume/KiB), MiB(limit))
	if peak-base > limit {
		t.Errorf("%s: peak RSS grew by %s, bound %s (%s of attack)", what, MiB(peak-base), MiB(limit), MiB(volume/KiB))
	}
}

// StatusBytes is GET /status's body length.
func StatusBytes(t testing.TB, srv *harness.Server, timeout time.Duration) int {
	t.Helper()
	hc := &http.Client{Timeout: timeout}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/status", srv.HTTPPort))
	if err != nil {
		t.Fatalf("GET /status: %v", err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		t.Fatalf("read /status: %v", err)
	}
	return int(n)
}

// Handled is how many requests of a canonical type the server has finished.
func Handled(t testing.TB, srv *harness.Server, typ string) int64 {
	t.Helper()
	c := srv.Status(t).Requests.ByType[typ]
	return c.OK + c.Error + c.Dropped
}

// InFlight is the server's count of requests being handled.
func InFlight(t testing.TB, srv *harness.Server) int64 {
	t.Helper()
	return srv.Status(t).Requests.InFlight
}

// PostClear runs POST /clear-cache.
func PostClear(t testing.TB, srv *harness.Server) {
	t.Helper()
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/clear-cache", srv.HTTPPort), "application/json", nil)
	if err != nil {
		t.Fatalf("POST /clear-cache: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /clear-cache: %s", resp.Status)
	}
}

// RawPeer is a DEALER that sends requests and does not read replies unless
// asked: a slow or hostile peer. With tinyRecv its receive side holds one
// message and a 4 KiB kernel buffer, so replies pile up on the server.
type RawPeer struct {
	zctx *zmq.Context
	Sock *zmq.Socket
	prof *protocol.Profile
	uid  int64
}

func DialRaw(t testing.TB, srv *harness.Server, tinyRecv bool) *RawPeer {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	sock, err := zctx.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	_ = sock.SetLinger(0)
	_ = sock.SetSndhwm(0)
	if tinyRecv {
		_ = sock.SetRcvhwm(1)
		_ = sock.SetRcvbuf(4096)
	}
	if err := sock.Connect(srv.Endpoint); err != nil {
		t.Fatal(err)
	}
	p := &RawPeer{zctx: zctx, Sock: sock, prof: harness.Profile(t, srv.Protocol)}
	t.Cleanup(p.Close)
	return p
}

func (p *RawPeer) Close() {
	if p.Sock != nil {
		_ = p.Sock.Close()
		_ = p.zctx.Term()
		p.Sock = nil
	}
}

// Send queues one request of canonical name with pre-encoded frames.
func (p *RawPeer) Send(t testing.TB, name string, frames ...[]byte) {
	t.Helper()
	spec, ok := p.prof.ByName(name)
	if !ok {
		t.Fatalf("%s not in profile", name)
	}
	uid, _ := protocol.Encode(p.uid)
	p.uid++
	typ, _ := protocol.Encode(spec.Number)
	msg := append([][]byte{uid, typ}, frames...)
	for i, f := range msg {
		flag := zmq.SNDMORE
		if i == len(msg)-1 {
			flag = 0
		}
		if _, err := p.Sock.SendBytes(f, flag); err != nil {
			t.Fatalf("raw send: %v", err)
		}
	}
}

func Enc(t testing.TB, v any) []byte {
	t.Helper()
	b, err := protocol.Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// SmallTokens is n token ids below 128 (one msgpack byte each), distinct
// per seed in their first chunk.
func SmallTokens(n, seed int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32((i*7 + seed*13 + i/AttackChunk) % 127)
	}
	return out
}

// WaitBusy waits until the server has a request in flight or done is
// closed (the attack may be refused before it is seen).
func WaitBusy(t testing.TB, srv *harness.Server, done <-chan struct{}, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return
		default:
		}
		if InFlight(t, srv) > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("the attack request was neither in flight nor handled within %v", limit)
}

// WaitHandled waits until the server has finished n requests of typ and
// reports whether it did within limit; a server that stops answering
// /status fails the test with its output. A message that libzmq drops for
// its size is never counted: callers whose requests may be refused that
// way only log a shortfall.
func WaitHandled(t testing.TB, srv *harness.Server, typ string, n int64, limit time.Duration, after string) bool {
	t.Helper()
	hc := &http.Client{Timeout: limit}
	deadline := time.Now().Add(limit)
	for {
		var st struct {
			Requests struct {
				ByType map[string]struct{ OK, Error, Dropped int64 } `json:"by_type"`
			} `json:"requests"`
		}
		if err := GetJSON(hc, srv, &st); err != nil {
			Alive(t, srv, time.Second, after)
			t.Fatalf("GET /status after %s: %v", after, err)
		}
		c := st.Requests.ByType[typ]
		if c.OK+c.Error+c.Dropped >= n {
			return true
		}
		if time.Now().After(deadline) {
			t.Logf("%s: %d handled, want %d within %v of %s (dropped unseen?)", typ, c.OK+c.Error+c.Dropped, n, limit, after)
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// --- hostile payloads ---

// NestedMap is v (a key or a register payload: a map of 8 fields) with one
// extra unknown field holding depth nested one-element arrays: what
// msgpack's recursive Skip walks.
func NestedMap(t testing.TB, v any, depth int) []byte {
	t.Helper()
	b := Enc(t, v)
	if b[0] != 0x88 { // fixmap of 8
		t.Fatalf("%T encodes as 0x%02x, want a fixmap of 8", v, b[0])
	}
	out := make([]byte, 0, len(b)+3+depth+1)
	out = append(out, 0x89)
	out = append(out, b[1:]...)
	out = append(out, 0xa2, 'z', 'z')
	out = append(out, bytes.Repeat([]byte{0x91}, depth)...)
	return append(out, 0xc0)
}

// Pickle opcodes the builders use.
const (
	pPROTO, pSTOP, pMARK, pPOP, pDUP             = 0x80, '.', '(', '0', '2'
	pBININT1, pBININT2, pLONG1, pNONE, pBINPERS  = 'K', 'M', 0x8a, 'N', 'Q'
	pREDUCE, pBINUNI, pSHORTUNI, pGLOBAL, pSTACK = 'R', 'X', 0x8c, 'c', 0x93
	pAPPEND, pAPPENDS, pBINGET, pEMPTYLIST       = 'a', 'e', 'h', ']'
	pBINPUT, pTUPLE, pTUPLE1, pBINBYTES, pMEMO   = 'q', 't', 0x85, 'B', 0x94
)

// MemoryBombPickle is about size bytes of MARK, DUP ×4095, APPENDS blocks:
// every byte adds one item to one list.
func MemoryBombPickle(size int) []byte {
	p := []byte{pPROTO, 4, pEMPTYLIST}
	// The list and 4,095 items fill the decoder's 4,096-deep stack.
	block := append([]byte{pMARK, pBININT1, 7}, bytes.Repeat([]byte{pDUP}, 4094)...)
	block = append(block, pAPPENDS)
	for len(p)+len(block)+3 < size {
		p = append(p, block...)
	}
	// A list of ints is not a list of tensors: refused once fully decoded.
	return append(p, pSTOP)
}

// CPUBombPickle is a memoised legacy storage container of ~64 KiB whose
// saved-object pickle announces ~2,700 distinct storages (each persistent id
// scanned against all before it), loaded `loads` times through
// torch.storage._load_from_bytes: ~90 KiB that decode in O(loads × refs²).
func CPUBombPickle(loads int) []byte {
	const sysInfo = "\x80\x02}q\x00(X\x10\x00\x00\x00protocol_versionq\x01M\xe9\x03" +
		"X\r\x00\x00\x00little_endianq\x02\x88X\n\x00\x00\x00type_sizesq\x03}q\x04(" +
		"X\x05\x00\x00\x00shortq\x05K\x02X\x03\x00\x00\x00intq\x06K\x04X\x04\x00\x00\x00longq\x07K\x04uu."
	uni := func(p []byte, s string) []byte {
		p = binary.LittleEndian.AppendUint32(append(p, pBINUNI), uint32(len(s)))
		return append(p, s...)
	}
	c := []byte{pPROTO, 2, pLONG1, 10, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, pSTOP}
	c = append(c, pPROTO, 2, pBININT2, 0xe9, 0x03, pSTOP)
	c = append(c, sysInfo...)
	// Saved object: the root storage "r", then many more announced and popped.
	c = append(c, pPROTO, 2, pMARK)
	c = append(uni(c, "storage"), pBINPUT, 0, pGLOBAL)
	c = append(c, "torch\nFloatStorage\n"...)
	c = append(c, pBINPUT, 1)
	c = append(uni(c, "r"), pBINPUT, 2)
	c = append(uni(c, "cpu"), pBINPUT, 3, pBININT1, 0, pNONE, pTUPLE, pBINPERS)
	tail := []byte{pSTOP, pPROTO, 2, pEMPTYLIST}
	tail = append(uni(tail, "r"), pAPPEND, pSTOP, 0, 0, 0, 0, 0, 0, 0, 0)
	for i := 0; ; i++ {
		item := []byte{pMARK, pBINGET, 0, pBINGET, 1}
		item = uni(item, fmt.Sprintf("%04x", i))
		item = append(item, pBINGET, 3, pBININT1, 0, pNONE, pTUPLE, pBINPERS, pPOP)
		if len(c)+len(item)+len(tail) > 64<<10 {
			break
		}
		c = append(c, item...)
	}
	c = append(c, tail...)

	p := []byte{pPROTO, 4, pSHORTUNI, 13}
	p = append(p, "torch.storage"...)
	p = append(p, pSHORTUNI, 16)
	p = append(p, "_load_from_bytes"...)
	p = append(p, pSTACK, pMEMO, pPOP, pBINBYTES)
	p = binary.LittleEndian.AppendUint32(p, uint32(len(c)))
	p = append(p, c...)
	p = append(p, pMEMO, pPOP)
	for range loads {
		p = append(p, pBINGET, 0, pBINGET, 1, pTUPLE1, pREDUCE, pPOP)
	}
	// Not a list of tensors: refused at the end, after all the work.
	return append(p, pBININT1, 0, pSTOP)
}

// IdleHTTP opens n keep-alive connections that each send one request, read
// the answer and then stay idle; close closes them all.
func IdleHTTP(t testing.TB, port, n int) (opened int, close func()) {
	t.Helper()
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
		sem   = make(chan struct{}, 64)
	)
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := dialTCP(port)
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			_, _ = c.Write([]byte("GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n"))
			buf := make([]byte, 512)
			_, _ = c.Read(buf)
		}()
	}
	wg.Wait()
	return len(conns), func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
}

// HealthWithin GETs /healthcheck on a new connection and returns how long
// the answer took (or an error after limit).
func HealthWithin(port int, limit time.Duration) (time.Duration, error) {
	hc := &http.Client{Timeout: limit, Transport: &http.Transport{DisableKeepAlives: true}}
	start := time.Now()
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/healthcheck", port))
	if err != nil {
		return time.Since(start), err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return time.Since(start), errors.New(resp.Status)
	}
	return time.Since(start), nil
}

// FileSize is the size of path, 0 when absent.
func FileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// FatalIn reports a Go runtime crash in a server's output.
func FatalIn(out string) string {
	for _, s := range []string{"fatal error", "unexpected fault", "panic:", "SIGSEGV", "SIGBUS", "goroutine 1 ["} {
		if i := strings.Index(out, s); i >= 0 {
			end := min(len(out), i+600)
			return out[i:end]
		}
	}
	return ""
}

func dialTCP(port int) (net.Conn, error) {
	return net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 2*time.Second)
}

// GetJSON decodes GET /status into v.
func GetJSON(hc *http.Client, srv *harness.Server, v any) error {
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/status", srv.HTTPPort))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// CallHandled sends one request on c and waits until it is answered or the
// server has finished handling it (seed profiles answer a refused request
// with nothing), at most limit. It reports the reply when there was one.
func CallHandled(t testing.TB, srv *harness.Server, c *client.Client, limit time.Duration, name string, args ...any) (client.Reply, error, bool) {
	t.Helper()
	before := Handled(t, srv, name)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	type res struct {
		r   client.Reply
		err error
	}
	ch := make(chan res, 1)
	go func() {
		r, err := c.Call(ctx, name, args...)
		ch <- res{r, err}
	}()
	finished := WatchHandled(t, srv, name, before)
	select {
	case r := <-ch:
		return r.r, r.err, true
	case <-finished:
		// Handled without a reply, or the reply is on its way.
		select {
		case r := <-ch:
			return r.r, r.err, true
		case <-time.After(100 * time.Millisecond):
			return client.Reply{}, errors.New("handled, no reply"), true
		}
	case <-ctx.Done():
		return client.Reply{}, ctx.Err(), false
	}
}

// AwaitCall runs fn in a goroutine; the channel yields its error.
func AwaitCall(fn func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- fn() }()
	return ch
}

func PrepareStore(ctx context.Context, w *harness.GoWorker, toks []uint32, n int, req string) (harness.PrepStore, error) {
	var ps harness.PrepStore
	r, err := w.C.Call(ctx, protocol.PrepareStore, w.Key(toks, n, req), w.ID)
	if err != nil {
		return ps, fmt.Errorf("prepare_store: %w", err)
	}
	if err := r.Decode(&ps); err != nil {
		return ps, fmt.Errorf("prepare_store: %w", err)
	}
	return ps, nil
}

func WriteSlots(w *harness.GoWorker, ps harness.PrepStore, data [][]byte) error {
	for n, s := range ps.Context.Slots {
		i := n
		if n < len(ps.Context.ChunkIndices) {
			i = ps.Context.ChunkIndices[n]
		}
		if s.Offset < 0 || s.Offset+s.Length > int64(len(w.Shm)) || i >= len(data) || s.Length != int64(len(data[i])) {
			return fmt.Errorf("slot %+v does not fit a %d-byte mapping", s, len(w.Shm))
		}
		copy(w.Shm[s.Offset:], data[i])
	}
	return nil
}

func CommitStore(ctx context.Context, w *harness.GoWorker, toks []uint32, n int, req string, payload []byte) (bool, error) {
	r, err := w.C.Call(ctx, protocol.CommitStore, w.Key(toks, n, req), w.ID, payload)
	if err != nil {
		return false, fmt.Errorf("commit_store: %w", err)
	}
	var ok bool
	if err := r.Decode(&ok); err != nil {
		return false, fmt.Errorf("commit_store: %w", err)
	}
	return ok, nil
}

func SeqData(seed, n, size int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = harness.ChunkData(seed, i, size)
	}
	return out
}

// ReadBack retrieves n chunks of toks through w and compares them to want.
func ReadBack(t testing.TB, w *harness.GoWorker, toks []uint32, want [][]byte, req string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := w.Retrieve(ctx, toks, len(want), req)
	if err != nil {
		t.Errorf("%s worker %d: retrieve: %v", w.Mode(), w.ID, err)
		return
	}
	if len(got) != len(want) {
		t.Errorf("%s worker %d: retrieve got %d chunks, want %d (miss)", w.Mode(), w.ID, len(got), len(want))
		return
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Errorf("%s worker %d: chunk %d is not what was stored (crc %08x, want %08x)", w.Mode(), w.ID, i, harness.Sum(got[i]), harness.Sum(want[i]))
		}
	}
}

// WatchHandled closes the returned channel once the server has finished
// more requests of typ than before (polled off the caller's goroutine, since
// /status may itself wait on the stalled pool).
func WatchHandled(t testing.TB, srv *harness.Server, typ string, before int64) <-chan struct{} {
	ch := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		defer close(ch)
		hc := &http.Client{Timeout: 2 * time.Minute}
		for ctx.Err() == nil {
			var st struct {
				Requests struct {
					ByType map[string]struct{ OK, Error, Dropped int64 } `json:"by_type"`
				} `json:"requests"`
			}
			if err := GetJSON(hc, srv, &st); err == nil {
				c := st.Requests.ByType[typ]
				if c.OK+c.Error+c.Dropped > before {
					return
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return ch
}

// lockReads runs LOOKUP with tp_size tp (tp read locks per chunk) and
// waits for its job.
// GrepLines is the lines of out that contain s.
func GrepLines(out, s string) string {
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// ProcKiB reads a "Field:   N kB" line of /proc/pid/status.
func ProcKiB(t testing.TB, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
