// Package reliability holds kvdock's fault, pressure, soak, bad-input and
// secure-default tests. They drive the real binary through
// tests/harness, or an in-process engine.Engine where the test needs to
// apply settings or read the Go runtime's figures. docs/RELIABILITY.md
// describes each scenario and the figures measured.
package reliability

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
	"kvdock/tests/harness"
	"kvdock/transfer/worker"
	"kvdock/ui/httpapi"
)

// Worker geometry shared by the Go workers: float32, 2 layers, hidden 16
// (16 tokens per chunk gives 4 KiB chunks).
const (
	layers = 2
	hidden = 16
)

// status reads the real binary's /status document.
func status(t testing.TB, srv *harness.Server) httpapi.Status {
	t.Helper()
	var st httpapi.Status
	httpjson.Get(t, fmt.Sprintf("http://127.0.0.1:%d/status", srv.HTTPPort), &st)
	return st
}

// slot is the wire's slot descriptor; the tests read slots as the shared
// worker client decodes them.
type slot = protocol.Slot

// prepStore is a PREPARE_STORE reply as tests read it (ps.Context.Slots);
// it decodes through the bounded protocol decoder, not by reflection.
type prepStore struct {
	Context protocol.PrepareStoreResponse
}

// DecodeMsgpack lets client.Reply.Decode fill a prepStore.
func (ps *prepStore) DecodeMsgpack(d *msgpack.Decoder) error {
	raw, err := d.DecodeRaw()
	if err != nil {
		return err
	}
	ps.Context, err = protocol.DecodePrepareStoreResponse(raw, protocol.Limits{})
	return err
}

// prepRetrieve is a PREPARE_RETRIEVE reply as tests read it (pr.Success,
// pr.Data, pr.Context.Slots), decoded by the bounded protocol decoder.
type prepRetrieve struct {
	Success bool
	Data    []byte
	Context struct{ Slots []slot }
}

// DecodeMsgpack lets client.Reply.Decode fill a prepRetrieve.
func (pr *prepRetrieve) DecodeMsgpack(d *msgpack.Decoder) error {
	raw, err := d.DecodeRaw()
	if err != nil {
		return err
	}
	r, err := protocol.DecodePrepareRetrieveResponse(raw, protocol.Limits{})
	pr.Success, pr.Data, pr.Context.Slots = r.Success, r.Data, r.Slots
	return err
}

// gworker is a test's handle on the shared Go worker (transfer/worker): an
// LMCache non-GPU worker, SHM through its own mmap of the advertised
// segment, or pickled tensors. The fields mirror the registration; c is the
// connection, which a test may replace (a reconnect): calls follow it.
type gworker struct {
	w          *worker.Worker
	c          *client.Client
	id         int64
	model      string
	chunk      int // tokens per chunk
	chunkBytes int
	shm        []byte
	segName    string
	poolSize   int64
}

// newWorker registers instance id of model on c; pickle forces the fallback
// even when a segment is advertised.
func newWorker(t testing.TB, c *client.Client, id int64, model string, pickle bool) *gworker {
	t.Helper()
	w, err := registerWorker(c, id, model, pickle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.unmap)
	return w
}

func registerWorker(c *client.Client, id int64, model string, pickle bool) (*gworker, error) {
	wk, err := worker.Register(context.Background(), c, worker.Config{
		InstanceID: id, Model: model, Layers: layers, Hidden: hidden, Dtype: "float32", Pickle: pickle,
	})
	if err != nil {
		return nil, err
	}
	return &gworker{w: wk, c: c, id: id, model: model, chunk: wk.ChunkTokens(),
		chunkBytes: int(wk.Layout().Bytes), shm: wk.Segment(), segName: wk.ShmName(), poolSize: wk.PoolSize()}, nil
}

// wk is the worker on the test's current connection.
func (w *gworker) wk() *worker.Worker {
	w.w.SetClient(w.c)
	return w.w
}

func (w *gworker) unmap() {
	_ = w.w.Close()
	w.shm = nil
}

func (w *gworker) mode() string { return w.w.Mode() }

func (w *gworker) key(toks []uint32, nchunks int, req string) protocol.Key {
	return w.w.Key(toks, nchunks, req)
}

// tokensFor is a deterministic token sequence of n chunks for seed.
func tokensFor(seed, n, chunk int) []uint32 {
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

// chunkData is the content of chunk i of the sequence seed: a stamp of
// (seed, i) followed by a pattern, so a misplaced chunk is told apart.
func chunkData(seed, i, size int) []byte {
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

func sum(b []byte) uint32 { return crc32.ChecksumIEEE(b) }

// store writes chunks for toks; it returns the COMMIT_STORE result
// (true, false, or "none" when nothing needed storing).
func (w *gworker) store(ctx context.Context, toks []uint32, data [][]byte, req string) (string, error) {
	res, err := w.wk().Store(ctx, w.key(toks, len(data), req), data)
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

// retrieve reads n chunks of toks as LMCache does: LOOKUP (which takes
// the read locks), PREPARE_RETRIEVE, COMMIT_RETRIEVE, END_SESSION. It
// returns nil on a miss.
func (w *gworker) retrieve(ctx context.Context, toks []uint32, n int, req string) ([][]byte, error) {
	hits, err := lookupKeep(ctx, w.c, w.model, toks[:n*w.chunk], req)
	defer func() { _, _ = w.c.Call(ctx, protocol.EndSession, req) }()
	if err != nil {
		return nil, err
	}
	if hits < n {
		return nil, nil
	}
	var out [][]byte
	if _, err := w.wk().Retrieve(ctx, w.key(toks, n, req), func(_ int, chunk []byte) {
		out = append(out, bytes.Clone(chunk))
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// lookup is the scheduler side: LOOKUP then QUERY_PREFETCH_STATUS until it
// answers; returns the number of hit chunks.
func lookup(ctx context.Context, c *client.Client, model string, toks []uint32, req string) (int, error) {
	defer func() { _, _ = c.Call(ctx, protocol.EndSession, req) }()
	return lookupKeep(ctx, c, model, toks, req)
}

// lookupKeep is lookup without END_SESSION: the hits stay read-locked for
// a PREPARE_RETRIEVE of the same request id.
func lookupKeep(ctx context.Context, c *client.Client, model string, toks []uint32, req string) (int, error) {
	k := protocol.Key{ModelName: model, WorldSize: 1, TokenIDs: toks, Start: 0, End: len(toks), RequestID: req}
	return worker.Scheduler{C: c, Poll: 2 * time.Millisecond}.Hits(ctx, k, 1)
}

// segmentExists reports whether /dev/shm/name exists.
func segmentExists(name string) bool {
	_, err := os.Stat(filepath.Join("/dev/shm", name))
	return err == nil
}
