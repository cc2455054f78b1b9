// Package reliability holds kvdock's fault, pressure, soak, bad-input and
// secure-default tests (issue 9). They drive the real binary through
// tests/harness, or an in-process engine.Engine where the test needs to
// apply settings or read the Go runtime's figures. docs/RELIABILITY.md
// describes each scenario and the figures measured.
package reliability

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/tests/harness"
	"kvdock/transfer/torchpickle"
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
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/status", srv.HTTPPort))
	if err != nil {
		t.Fatalf("GET /status: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /status: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("decode /status: %v", err)
	}
	return st
}

type slot struct {
	Offset int64  `msgpack:"offset"`
	Length int64  `msgpack:"length"`
	Shape  []int  `msgpack:"shape"`
	Dtype  string `msgpack:"dtype"`
}

type prepStore struct {
	Context struct {
		Slots        []slot `msgpack:"slots"`
		ChunkIndices []int  `msgpack:"chunk_indices"`
	} `msgpack:"context"`
}

type prepRetrieve struct {
	Success bool   `msgpack:"success"`
	Data    []byte `msgpack:"data"`
	Context struct {
		Slots []slot `msgpack:"slots"`
	} `msgpack:"context"`
}

// gworker is a Go emulation of an LMCache non-GPU worker: SHM through its
// own mmap of the advertised segment, or pickled tensors.
type gworker struct {
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
	ctx := context.Background()
	r, err := c.Call(ctx, protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{
		InstanceID: id, ModelName: model, WorldSize: 1, BlockSize: 16, NumLayers: layers,
		HiddenDimSize: hidden, DtypeStr: "float32",
	})
	if err != nil {
		return nil, fmt.Errorf("register %d: %w", id, err)
	}
	var reg struct {
		ShmName  string `msgpack:"shm_name"`
		PoolSize int64  `msgpack:"pool_size"`
	}
	if err := r.Decode(&reg); err != nil {
		return nil, fmt.Errorf("register reply: %w", err)
	}
	r, err = c.Call(ctx, protocol.GetChunkSize)
	if err != nil {
		return nil, fmt.Errorf("chunk size: %w", err)
	}
	w := &gworker{c: c, id: id, model: model, segName: reg.ShmName, poolSize: reg.PoolSize}
	if err := r.Decode(&w.chunk); err != nil {
		return nil, err
	}
	w.chunkBytes = 2 * layers * w.chunk * hidden * 4
	if reg.ShmName != "" && reg.PoolSize > 0 && !pickle {
		fd, err := unix.Open(filepath.Join("/dev/shm", reg.ShmName), unix.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("open segment: %w", err)
		}
		defer unix.Close(fd)
		w.shm, err = unix.Mmap(fd, 0, int(reg.PoolSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return nil, fmt.Errorf("mmap segment: %w", err)
		}
	}
	return w, nil
}

func (w *gworker) unmap() {
	if w.shm != nil {
		_ = unix.Munmap(w.shm)
		w.shm = nil
	}
}

func (w *gworker) mode() string {
	if w.shm != nil {
		return "shm"
	}
	return "pickle"
}

func (w *gworker) key(toks []uint32, nchunks int, req string) protocol.Key {
	wid := 0
	return protocol.Key{ModelName: w.model, WorldSize: 1, WorkerID: &wid, TokenIDs: toks,
		Start: 0, End: nchunks * w.chunk, RequestID: req}
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
	k := w.key(toks, len(data), req)
	r, err := w.c.Call(ctx, protocol.PrepareStore, k, w.id)
	if err != nil {
		return "", fmt.Errorf("prepare_store: %w", err)
	}
	var ps prepStore
	if err := r.Decode(&ps); err != nil {
		return "", fmt.Errorf("prepare_store: %w", err)
	}
	var payload []byte
	if w.shm != nil {
		if len(ps.Context.Slots) == 0 {
			// Nothing reserved (all cached, or no room): like the Python
			// worker, nothing to write and nothing to commit.
			return "none", nil
		}
		for n, s := range ps.Context.Slots {
			i := n
			if n < len(ps.Context.ChunkIndices) {
				i = ps.Context.ChunkIndices[n]
			}
			if s.Length != int64(len(data[i])) || s.Offset < 0 || s.Offset+s.Length > int64(len(w.shm)) {
				return "", fmt.Errorf("slot %+v out of range for a %d-byte chunk in a %d-byte mapping", s, len(data[i]), len(w.shm))
			}
			copy(w.shm[s.Offset:s.Offset+s.Length], data[i])
		}
		payload = []byte{}
	} else {
		ts := make([]torchpickle.Tensor, len(data))
		for i, d := range data {
			ts[i] = torchpickle.Tensor{Dtype: "float32", Shape: []int{2, layers, w.chunk, hidden}, Data: d}
		}
		payload, err = torchpickle.AppendEncode(nil, ts)
		if err != nil {
			return "", err
		}
	}
	r, err = w.c.Call(ctx, protocol.CommitStore, k, w.id, payload)
	if err != nil {
		return "", fmt.Errorf("commit_store: %w", err)
	}
	var ok bool
	if err := r.Decode(&ok); err != nil {
		return "", fmt.Errorf("commit_store: %w", err)
	}
	return fmt.Sprint(ok), nil
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
	k := w.key(toks, n, req)
	r, err := w.c.Call(ctx, protocol.PrepareRetrieve, k, w.id)
	if err != nil {
		return nil, fmt.Errorf("prepare_retrieve: %w", err)
	}
	var pr prepRetrieve
	if err := r.Decode(&pr); err != nil {
		return nil, fmt.Errorf("prepare_retrieve: %w", err)
	}
	var out [][]byte
	if pr.Success {
		if w.shm != nil {
			for _, s := range pr.Context.Slots {
				if s.Offset < 0 || s.Offset+s.Length > int64(len(w.shm)) {
					return nil, fmt.Errorf("retrieve slot %+v outside the %d-byte mapping", s, len(w.shm))
				}
				out = append(out, bytes.Clone(w.shm[s.Offset:s.Offset+s.Length]))
			}
		} else if len(pr.Data) > 0 {
			ts, err := torchpickle.Decode(pr.Data, torchpickle.DefaultLimits())
			if err != nil {
				return nil, fmt.Errorf("retrieve pickle: %w", err)
			}
			for _, t := range ts {
				out = append(out, t.Data)
			}
		}
	}
	r, err = w.c.Call(ctx, protocol.CommitRetrieve, k, w.id)
	if err != nil {
		return nil, fmt.Errorf("commit_retrieve: %w", err)
	}
	var done bool
	if err := r.Decode(&done); err != nil || !done {
		return nil, fmt.Errorf("commit_retrieve answered %v (%v)", done, err)
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
	if _, err := c.Call(ctx, protocol.Lookup, k, 1); err != nil {
		return 0, fmt.Errorf("lookup: %w", err)
	}
	for range 500 {
		r, err := c.Call(ctx, protocol.QueryPrefetchStatus, req)
		if err != nil {
			return 0, fmt.Errorf("query prefetch status: %w", err)
		}
		if r.Present {
			var n int
			if err := r.Decode(&n); err != nil {
				return 0, err
			}
			return n, nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return 0, errors.New("prefetch never finished")
}

// segmentExists reports whether /dev/shm/name exists.
func segmentExists(name string) bool {
	_, err := os.Stat(filepath.Join("/dev/shm", name))
	return err == nil
}

// waitFor polls cond every 50 ms until it holds or limit passes.
func waitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
