package harness

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/core/testkit/httpjson"
	"kvdock/transfer/worker"
	"kvdock/ui/httpapi"
)

// The geometry of the Go test workers: float32, 2 layers, hidden 16 (16
// tokens per chunk gives 4 KiB chunks).
const (
	WorkerLayers = 2
	WorkerHidden = 16
)

// Status reads the server's /status document.
func (s *Server) Status(t testing.TB) httpapi.Status {
	t.Helper()
	var st httpapi.Status
	httpjson.Get(t, s.StatusURL(), &st)
	return st
}

// PrepStore is a PREPARE_STORE reply as tests read it (ps.Context.Slots);
// it decodes through the bounded protocol decoder, not by reflection.
type PrepStore struct {
	Context protocol.PrepareStoreResponse
}

// DecodeMsgpack lets client.Reply.Decode fill a PrepStore.
func (ps *PrepStore) DecodeMsgpack(d *msgpack.Decoder) error {
	raw, err := d.DecodeRaw()
	if err != nil {
		return err
	}
	ps.Context, err = protocol.DecodePrepareStoreResponse(raw, protocol.Limits{})
	return err
}

// PrepRetrieve is a PREPARE_RETRIEVE reply as tests read it (pr.Success,
// pr.Data, pr.Context.Slots), decoded by the bounded protocol decoder.
type PrepRetrieve struct {
	Success bool
	Data    []byte
	Context struct{ Slots []protocol.Slot }
}

// DecodeMsgpack lets client.Reply.Decode fill a PrepRetrieve.
func (pr *PrepRetrieve) DecodeMsgpack(d *msgpack.Decoder) error {
	raw, err := d.DecodeRaw()
	if err != nil {
		return err
	}
	r, err := protocol.DecodePrepareRetrieveResponse(raw, protocol.Limits{})
	pr.Success, pr.Data, pr.Context.Slots = r.Success, r.Data, r.Slots
	return err
}

// GoWorker is a test's handle on the shared Go worker (transfer/worker): an
// LMCache non-GPU worker, SHM through its own mmap of the advertised
// segment, or pickled tensors. The fields mirror the registration; C is the
// connection, which a test may replace (a reconnect): calls follow it.
type GoWorker struct {
	W          *worker.Worker
	C          *client.Client
	ID         int64
	Model      string
	Chunk      int // tokens per chunk
	ChunkBytes int
	Shm        []byte
	SegName    string
	PoolSize   int64
}

// NewWorker registers instance id of model on c; pickle forces the fallback
// even when a segment is advertised.
func NewWorker(t testing.TB, c *client.Client, id int64, model string, pickle bool) *GoWorker {
	t.Helper()
	w, err := RegisterWorker(c, id, model, pickle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return w
}

// RegisterWorker is NewWorker returning the error, for tests that expect
// a registration to be refused.
func RegisterWorker(c *client.Client, id int64, model string, pickle bool) (*GoWorker, error) {
	wk, err := worker.Register(context.Background(), c, worker.Config{
		InstanceID: id, Model: model, Layers: WorkerLayers, Hidden: WorkerHidden, Dtype: "float32", Pickle: pickle,
	})
	if err != nil {
		return nil, err
	}
	return &GoWorker{W: wk, C: c, ID: id, Model: model, Chunk: wk.ChunkTokens(),
		ChunkBytes: int(wk.Layout().Bytes), Shm: wk.Segment(), SegName: wk.ShmName(), PoolSize: wk.PoolSize()}, nil
}

// Worker is the worker on the test's current connection.
func (w *GoWorker) Worker() *worker.Worker {
	w.W.SetClient(w.C)
	return w.W
}

// Close unmaps the worker's view of the segment.
func (w *GoWorker) Close() {
	_ = w.W.Close()
	w.Shm = nil
}

// Mode is "shm" or "pickle", as the server decided at registration.
func (w *GoWorker) Mode() string { return w.W.Mode() }

// Key is the worker's key for the first nchunks chunks of toks under req.
func (w *GoWorker) Key(toks []uint32, nchunks int, req string) protocol.Key {
	return w.W.Key(toks, nchunks, req)
}

// Tokens is a deterministic token sequence of n chunks for seed.
func Tokens(seed, n, chunk int) []uint32 {
	out := make([]uint32, n*chunk)
	for i := range out {
		// splitmix64 of (seed, i): distinct sequences never share a chunk.
		z := uint64(seed)<<32 ^ uint64(i) + 0x9e3779b97f4a7c15
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		out[i] = uint32(z^z>>31) % 100000
	}
	return out
}

// ChunkData is the content of chunk i of the sequence seed: a stamp of
// (seed, i) followed by a pattern, so a misplaced chunk is told apart.
func ChunkData(seed, i, size int) []byte {
	b := make([]byte, size)
	binary.LittleEndian.PutUint32(b[0:], uint32(seed))
	binary.LittleEndian.PutUint32(b[4:], uint32(i))
	x := uint32(seed*2654435761 + i*40503 + 1)
	for j := 8; j < size; j += 4 {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		binary.LittleEndian.PutUint32(b[j:], x)
	}
	return b
}

// Sum is a chunk's checksum, for comparing what came back.
func Sum(b []byte) uint32 { return crc32.ChecksumIEEE(b) }

// Store writes chunks for toks; it returns the COMMIT_STORE result
// (true, false, or "none" when nothing needed storing).
func (w *GoWorker) Store(ctx context.Context, toks []uint32, data [][]byte, req string) (string, error) {
	res, err := w.Worker().Store(ctx, w.Key(toks, len(data), req), data)
	switch {
	case err != nil:
		return "", err
	case res.Skipped:
		// Nothing reserved (all cached, or no room): like the Python
		// worker, nothing to write and nothing to commit.
		return "none", nil
	}
	return fmt.Sprint(res.Committed), nil
}

// Retrieve reads n chunks of toks as LMCache does: LOOKUP (which takes
// the read locks), PREPARE_RETRIEVE, COMMIT_RETRIEVE, END_SESSION. It
// returns nil on a miss.
func (w *GoWorker) Retrieve(ctx context.Context, toks []uint32, n int, req string) ([][]byte, error) {
	hits, err := LookupKeep(ctx, w.C, w.Model, toks[:n*w.Chunk], req)
	defer func() { _, _ = w.C.Call(ctx, protocol.EndSession, req) }()
	if err != nil {
		return nil, err
	}
	if hits < n {
		return nil, nil
	}
	var out [][]byte
	if _, err := w.Worker().Retrieve(ctx, w.Key(toks, n, req), func(_ int, chunk []byte) {
		out = append(out, bytes.Clone(chunk))
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// Lookup is the scheduler side: LOOKUP then QUERY_PREFETCH_STATUS until it
// answers; returns the number of hit chunks.
func Lookup(ctx context.Context, c *client.Client, model string, toks []uint32, req string) (int, error) {
	defer func() { _, _ = c.Call(ctx, protocol.EndSession, req) }()
	return LookupKeep(ctx, c, model, toks, req)
}

// LookupKeep is Lookup without END_SESSION: the hits stay read-locked for
// a PREPARE_RETRIEVE of the same request id.
func LookupKeep(ctx context.Context, c *client.Client, model string, toks []uint32, req string) (int, error) {
	k := protocol.Key{ModelName: model, WorldSize: 1, TokenIDs: toks, Start: 0, End: len(toks), RequestID: req}
	return scheduler(c).Hits(ctx, k, 1)
}

// Scheduler is a scheduler on a connection of its own to s (nongpu-v1):
// LOOKUP, then QUERY_PREFETCH_STATUS every 2 ms until it answers.
func (s *Server) Scheduler(t testing.TB) worker.Scheduler {
	t.Helper()
	return scheduler(s.Dial(t, "nongpu-v1"))
}

func scheduler(c *client.Client) worker.Scheduler {
	return worker.Scheduler{C: c, Poll: 2 * time.Millisecond}
}

// SegmentExists reports whether /dev/shm/name exists.
func SegmentExists(name string) bool {
	_, err := os.Stat(filepath.Join("/dev/shm", name))
	return err == nil
}

// ContextStatus is instance id's context in st.
func ContextStatus(st httpapi.Status, id int64) (httpapi.ContextStatus, bool) {
	for _, c := range st.Contexts {
		if c.InstanceID == id {
			return c, true
		}
	}
	return httpapi.ContextStatus{}, false
}

// StatusURL is the server's /status address.
func (s *Server) StatusURL() string {
	return fmt.Sprintf("http://127.0.0.1:%d/status", s.HTTPPort)
}
