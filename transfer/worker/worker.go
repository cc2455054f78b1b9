// Package worker is kvdock's one Go implementation of the worker side of the
// LMCache MP non-GPU protocol (spec 4.1–4.3, 4.5): a Worker registers an
// instance, stores and retrieves chunks through the advertised shared-memory
// segment or as pickled torch tensors, and a Scheduler runs LOOKUP and the
// prefetch status polls. `kvdock bench` and the Go tests drive the server
// with it.
//
// It lives under transfer/, not core/rpc: pickle mode needs
// transfer/torchpickle, and core packages import no transfer module. It is
// the worker's counterpart of transfer/nongpu.
//
// The server is a peer like any other: every reply is decoded by the bounded
// decoders of core/protocol, and a slot is written or read only after it has
// been checked against the mapping and the chunk layout.
package worker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"kvdock/core/layout"
	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/transfer/torchpickle"
)

// Modes a worker transfers in.
const (
	ModeSHM    = "shm"
	ModePickle = "pickle"
)

// ErrBadReply is returned (wrapped) when the server's reply is well formed
// but cannot be honoured: a slot outside the mapping or of another size, a
// chunk index out of range, more chunks than asked for, a tensor of another
// layout. Nothing was written or delivered from that reply.
var ErrBadReply = errors.New("reply does not fit the request")

// Config describes one worker instance: its registration and how it attaches.
type Config struct {
	InstanceID int64
	Model      string
	WorldSize  int // default 1
	WorkerID   int // the worker_id of its keys
	BlockSize  int // default 16 (stored by the server, not used for the layout)
	Layers     int
	Hidden     int
	Dtype      string // torch dtype name, e.g. "float32"
	MLA        bool
	// Pickle uses the pickle context even when a segment is advertised, as
	// an LMCache worker does that failed to attach.
	Pickle bool
	// ShmDir is where the advertised segment lives (default /dev/shm).
	ShmDir string
	// Populate maps the segment with MAP_POPULATE, as a worker that already
	// touched it: page faults are then not charged to the first copies.
	Populate bool
	// Segment is a mapping of the advertised segment this process already
	// holds (the Segment of another worker): workers of one process share
	// it instead of mapping the segment again. Close leaves it mapped.
	Segment []byte
	// EncodeChunks sizes the reused pickle buffer up front for stores of this
	// many chunks (0: it grows on first use).
	EncodeChunks int
	// Limits bound the decoding of replies (zero fields: protocol defaults).
	Limits protocol.Limits
	// PickleLimits bound the unpickling of retrieved data.
	PickleLimits torchpickle.Limits
}

// Worker is one registered instance. Its methods may be called from several
// goroutines; Close must come after the last of them.
type Worker struct {
	cfg      Config
	c        atomic.Pointer[client.Client]
	chunk    int // tokens per chunk (GET_CHUNK_SIZE)
	lay      layout.Layout
	shmName  string
	poolSize int64
	seg      []byte // this process's mapping of the segment; nil in pickle mode
	ownSeg   bool   // seg was mapped by this worker (Close unmaps it)
	// enc holds the reused pickle buffer between stores (one slot: a
	// concurrent store allocates its own).
	enc    chan []byte
	encCap int64
}

// Register asks the server's chunk size, registers the instance and, when a
// segment is advertised and cfg.Pickle is false, maps it. A segment that
// cannot be mapped is an error (LMCache would fall back to pickle; the bench
// and the tests want to know); the registration is then withdrawn.
func Register(ctx context.Context, c *client.Client, cfg Config) (*Worker, error) {
	if cfg.WorldSize <= 0 {
		cfg.WorldSize = 1
	}
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = 16
	}
	if cfg.ShmDir == "" {
		cfg.ShmDir = "/dev/shm"
	}
	w := &Worker{cfg: cfg, enc: make(chan []byte, 1)}
	w.c.Store(c)
	r, err := c.Call(ctx, protocol.GetChunkSize)
	if err != nil {
		return nil, fmt.Errorf("worker %d: GET_CHUNK_SIZE: %w", cfg.InstanceID, err)
	}
	chunk, err := w.intResult(r, protocol.GetChunkSize)
	if err != nil {
		return nil, fmt.Errorf("worker %d: %w", cfg.InstanceID, err)
	}
	if chunk <= 0 || chunk > math.MaxInt32 {
		return nil, fmt.Errorf("worker %d: GET_CHUNK_SIZE answered %d: %w", cfg.InstanceID, chunk, ErrBadReply)
	}
	w.chunk = int(chunk)
	if w.lay, err = layout.New(cfg.Layers, w.chunk, cfg.Hidden, cfg.Dtype, cfg.MLA); err != nil {
		return nil, fmt.Errorf("worker %d: %w", cfg.InstanceID, err)
	}
	r, err = c.Call(ctx, protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{
		InstanceID: cfg.InstanceID, ModelName: cfg.Model, WorldSize: cfg.WorldSize,
		BlockSize: cfg.BlockSize, NumLayers: cfg.Layers, HiddenDimSize: cfg.Hidden,
		DtypeStr: cfg.Dtype, UseMLA: cfg.MLA,
	})
	if err != nil {
		return nil, fmt.Errorf("worker %d: register: %w", cfg.InstanceID, err)
	}
	if !r.Present {
		return nil, fmt.Errorf("worker %d: register: reply has no result frame", cfg.InstanceID)
	}
	reg, err := protocol.DecodeRegisterResponse(r.Raw, cfg.Limits)
	if err != nil {
		return nil, fmt.Errorf("worker %d: %w", cfg.InstanceID, err)
	}
	w.shmName, w.poolSize = reg.ShmName, reg.PoolSize
	switch {
	case !w.Advertised() || cfg.Pickle:
	case len(cfg.Segment) > 0:
		w.seg = cfg.Segment
	default:
		if w.seg, err = mapSegment(cfg.ShmDir, reg.ShmName, cfg.Populate); err != nil {
			_ = w.Unregister(ctx)
			return nil, fmt.Errorf("worker %d: %w", cfg.InstanceID, err)
		}
		w.ownSeg = true
	}
	if cfg.EncodeChunks > 0 && w.seg == nil {
		ts := make([]torchpickle.Tensor, cfg.EncodeChunks)
		zero := make([]byte, w.lay.Bytes) // only its length matters to the size
		for i := range ts {
			ts[i] = torchpickle.Tensor{Dtype: w.lay.Dtype, Shape: w.lay.Shape, Data: zero}
		}
		n := 5 + max(0, torchpickle.EncodedSize(ts))
		w.enc <- make([]byte, 0, n)
		w.encCap = int64(n)
	}
	return w, nil
}

// mapSegment maps the whole segment (its size from fstat, as Python's
// SharedMemory does), shared and writable.
func mapSegment(dir, name string, populate bool) ([]byte, error) {
	bare := strings.TrimPrefix(name, "/")
	if bare == "" || strings.ContainsAny(bare, "/\x00") || bare == "." || bare == ".." {
		return nil, fmt.Errorf("advertised segment name %q: %w", name, ErrBadReply)
	}
	path := filepath.Join(dir, bare)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("attach advertised segment: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("attach advertised segment: %w", err)
	}
	if fi.Size() <= 0 || int64(int(fi.Size())) != fi.Size() {
		return nil, fmt.Errorf("attach advertised segment %s: size %d", path, fi.Size())
	}
	flags := unix.MAP_SHARED
	if populate {
		flags |= unix.MAP_POPULATE
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	return b, nil
}

// Close unmaps the segment the worker mapped; it does not unregister (see
// Unregister). The worker transfers nothing after Close.
func (w *Worker) Close() error {
	seg, own := w.seg, w.ownSeg
	w.seg, w.ownSeg = nil, false
	if seg == nil || !own {
		return nil
	}
	err := unix.Munmap(seg)
	if err != nil {
		return fmt.Errorf("worker %d: munmap: %w", w.cfg.InstanceID, err)
	}
	return nil
}

// Client is the connection the worker talks over.
func (w *Worker) Client() *client.Client { return w.c.Load() }

// SetClient moves the worker to another connection (the server moved to a
// new endpoint); the registration and the mapping stay.
func (w *Worker) SetClient(c *client.Client) { w.c.Store(c) }

// Mode is ModeSHM when the worker mapped the segment, else ModePickle.
func (w *Worker) Mode() string {
	if w.seg != nil {
		return ModeSHM
	}
	return ModePickle
}

// Advertised reports whether the registration reply named a segment.
func (w *Worker) Advertised() bool { return w.shmName != "" && w.poolSize > 0 }

// InstanceID is the registered instance id.
func (w *Worker) InstanceID() int64 { return w.cfg.InstanceID }

// Model is the registered model name.
func (w *Worker) Model() string { return w.cfg.Model }

// ShmName and PoolSize are the registration reply.
func (w *Worker) ShmName() string { return w.shmName }

// PoolSize is the pool size the registration reply advertised.
func (w *Worker) PoolSize() int64 { return w.poolSize }

// ChunkTokens is the server's chunk size in tokens.
func (w *Worker) ChunkTokens() int { return w.chunk }

// Layout is one chunk's tensor layout.
func (w *Worker) Layout() layout.Layout { return w.lay }

// Segment is the worker's mapping of the segment (nil in pickle mode).
func (w *Worker) Segment() []byte { return w.seg }

// EncodeBufferBytes is the capacity of the pickle buffer sized up front.
func (w *Worker) EncodeBufferBytes() int64 { return w.encCap }

// Key is the worker-side key of the first chunks of tokens: [0, chunks ×
// chunk size), with this worker's id.
func (w *Worker) Key(tokens []uint32, chunks int, requestID string) protocol.Key {
	id := w.cfg.WorkerID
	return protocol.Key{ModelName: w.cfg.Model, WorldSize: w.cfg.WorldSize, WorkerID: &id,
		TokenIDs: tokens, Start: 0, End: chunks * w.chunk, RequestID: requestID}
}

// LookupKey is the scheduler-side key (worker_id nil) of all of tokens.
func (w *Worker) LookupKey(tokens []uint32, requestID string) protocol.Key {
	return protocol.Key{ModelName: w.cfg.Model, WorldSize: w.cfg.WorldSize, TokenIDs: tokens,
		Start: 0, End: len(tokens), RequestID: requestID}
}

// chunks is how many chunks key covers.
func (w *Worker) chunks(key protocol.Key) int {
	if key.End <= key.Start {
		return 0
	}
	return (key.End - key.Start) / w.chunk
}

// Unregister sends UNREGISTER_KV_CACHE for the instance.
func (w *Worker) Unregister(ctx context.Context) error {
	if _, err := w.Client().Call(ctx, protocol.UnregisterKVCache, w.cfg.InstanceID); err != nil {
		return fmt.Errorf("worker %d: %s: %w", w.cfg.InstanceID, protocol.UnregisterKVCache, err)
	}
	return nil
}

// call sends a request and wraps its error with the request name.
func (w *Worker) call(ctx context.Context, name string, args ...any) (client.Reply, error) {
	r, err := w.Client().Call(ctx, name, args...)
	if err != nil {
		return r, fmt.Errorf("%s: %w", name, err)
	}
	return r, nil
}

// intResult decodes an int reply.
func (w *Worker) intResult(r client.Reply, name string) (int64, error) {
	if !r.Present {
		return 0, fmt.Errorf("%s: reply has no result frame", name)
	}
	v, err := protocol.DecodeResult(protocol.ResultInt, r.Raw, w.cfg.Limits)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return v.(int64), nil
}

// boolResult decodes a bool reply.
func (w *Worker) boolResult(r client.Reply, name string) (bool, error) {
	if !r.Present {
		return false, fmt.Errorf("%s: reply has no result frame", name)
	}
	v, err := protocol.DecodeResult(protocol.ResultBool, r.Raw, w.cfg.Limits)
	if err != nil {
		return false, fmt.Errorf("%s: %w", name, err)
	}
	return v.(bool), nil
}

// PrepareStore sends PREPARE_STORE and decodes the reply.
func (w *Worker) PrepareStore(ctx context.Context, key protocol.Key) (protocol.PrepareStoreResponse, error) {
	r, err := w.call(ctx, protocol.PrepareStore, key, w.cfg.InstanceID)
	if err != nil {
		return protocol.PrepareStoreResponse{}, err
	}
	if !r.Present {
		return protocol.PrepareStoreResponse{}, fmt.Errorf("%s: reply has no result frame", protocol.PrepareStore)
	}
	return protocol.DecodePrepareStoreResponse(r.Raw, w.cfg.Limits)
}

// CommitStore sends COMMIT_STORE with data (empty for SHM, a pickle
// otherwise) and returns the server's answer.
func (w *Worker) CommitStore(ctx context.Context, key protocol.Key, data []byte) (bool, error) {
	if data == nil {
		data = []byte{}
	}
	r, err := w.call(ctx, protocol.CommitStore, key, w.cfg.InstanceID, data)
	if err != nil {
		return false, err
	}
	return w.boolResult(r, protocol.CommitStore)
}

// checkSlot refuses a slot outside the mapping or not one chunk long.
func (w *Worker) checkSlot(s protocol.Slot) error {
	if w.seg == nil {
		return fmt.Errorf("slot {offset %d, length %d} for a worker without a mapping: %w", s.Offset, s.Length, ErrBadReply)
	}
	if s.Length != w.lay.Bytes || s.Offset < 0 || s.Offset > int64(len(w.seg))-s.Length {
		return fmt.Errorf("slot {offset %d, length %d} does not hold a %d-byte chunk in the %d-byte segment: %w",
			s.Offset, s.Length, w.lay.Bytes, len(w.seg), ErrBadReply)
	}
	return nil
}

// SlotView is the mapping's bytes of slot s (no copy), after checking it.
func (w *Worker) SlotView(s protocol.Slot) ([]byte, error) {
	if err := w.checkSlot(s); err != nil {
		return nil, err
	}
	return w.seg[s.Offset : s.Offset+s.Length : s.Offset+s.Length], nil
}

// WriteSlot copies data (one chunk) into slot s.
func (w *Worker) WriteSlot(s protocol.Slot, data []byte) error {
	v, err := w.SlotView(s)
	if err != nil {
		return err
	}
	if len(data) != len(v) {
		return fmt.Errorf("chunk of %d bytes for a %d-byte slot", len(data), len(v))
	}
	copy(v, data)
	return nil
}

// StoreResult is what a Store did.
type StoreResult struct {
	// Chunks were written into slots (SHM) or sent pickled.
	Chunks int
	// Skipped: PREPARE_STORE reserved nothing (everything cached, or no
	// room), so, as LMCache's worker, nothing was written or committed.
	Skipped bool
	// Committed is COMMIT_STORE's answer.
	Committed bool
	// Copy is how long the copies into the slots took (SHM; 0 for
	// pickle): the rest of a store's time is its two round trips.
	Copy time.Duration
}

// Store stores chunks (one per chunk of key, in order) the way an LMCache
// worker does: PREPARE_STORE, then the copies into the slots it names (SHM)
// or a pickle of the chunk tensors, then COMMIT_STORE. Every slot is
// checked before any is written.
func (w *Worker) Store(ctx context.Context, key protocol.Key, chunks [][]byte) (StoreResult, error) {
	if n := w.chunks(key); n != len(chunks) {
		return StoreResult{}, fmt.Errorf("store: key covers %d chunks, %d given", n, len(chunks))
	}
	for i, c := range chunks {
		if int64(len(c)) != w.lay.Bytes {
			return StoreResult{}, fmt.Errorf("store: chunk %d has %d bytes, the layout %d", i, len(c), w.lay.Bytes)
		}
	}
	ps, err := w.PrepareStore(ctx, key)
	if err != nil {
		return StoreResult{}, err
	}
	if w.seg == nil {
		// The pickle context ignores the PREPARE_STORE reply (spec 4.3).
		ok, err := w.commitPickle(ctx, key, chunks)
		return StoreResult{Chunks: len(chunks), Committed: ok}, err
	}
	if len(ps.Slots) == 0 {
		return StoreResult{Skipped: true}, nil
	}
	if len(ps.Slots) > len(chunks) || (ps.ChunkIndices != nil && len(ps.ChunkIndices) != len(ps.Slots)) {
		return StoreResult{}, fmt.Errorf("%s: %d slots, %d chunk indices for %d chunks: %w",
			protocol.PrepareStore, len(ps.Slots), len(ps.ChunkIndices), len(chunks), ErrBadReply)
	}
	idx := func(n int) int {
		if ps.ChunkIndices == nil {
			return n
		}
		return ps.ChunkIndices[n]
	}
	for n, s := range ps.Slots {
		if i := idx(n); i >= len(chunks) {
			return StoreResult{}, fmt.Errorf("%s: chunk index %d of %d chunks: %w", protocol.PrepareStore, i, len(chunks), ErrBadReply)
		}
		if err := w.checkSlot(s); err != nil {
			return StoreResult{}, fmt.Errorf("%s: %w", protocol.PrepareStore, err)
		}
	}
	start := time.Now()
	for n, s := range ps.Slots {
		copy(w.seg[s.Offset:s.Offset+s.Length], chunks[idx(n)])
	}
	copied := time.Since(start)
	ok, err := w.CommitStore(ctx, key, nil)
	return StoreResult{Chunks: len(ps.Slots), Committed: ok, Copy: copied}, err
}

// commitPickle sends COMMIT_STORE with the chunks pickled as torch tensors,
// written straight after a bin32 header in the reused buffer: the frame is
// built without another copy.
func (w *Worker) commitPickle(ctx context.Context, key protocol.Key, chunks [][]byte) (bool, error) {
	spec, ok := w.Client().Profile().ByName(protocol.CommitStore)
	if !ok {
		return false, fmt.Errorf("profile %s has no %s", w.Client().Profile().Name, protocol.CommitStore)
	}
	ts := make([]torchpickle.Tensor, len(chunks))
	for i, c := range chunks {
		ts[i] = torchpickle.Tensor{Dtype: w.lay.Dtype, Shape: w.lay.Shape, Data: c}
	}
	var buf []byte
	select {
	case buf = <-w.enc:
	default:
	}
	enc, err := torchpickle.AppendEncode(append(buf[:0], 0xc6, 0, 0, 0, 0), ts)
	if err != nil {
		return false, fmt.Errorf("%s: pickle chunks: %w", protocol.CommitStore, err)
	}
	if len(enc)-5 > 0xffffffff {
		return false, fmt.Errorf("%s: pickle of %d bytes exceeds bin32", protocol.CommitStore, len(enc)-5)
	}
	binary.BigEndian.PutUint32(enc[1:5], uint32(len(enc)-5))
	defer func() {
		select {
		case w.enc <- enc:
		default:
		}
	}()
	kf, err := protocol.Encode(key)
	if err != nil {
		return false, err
	}
	idf, err := protocol.Encode(w.cfg.InstanceID)
	if err != nil {
		return false, err
	}
	r, err := w.Client().CallRaw(ctx, spec.Number, kf, idf, enc)
	if err != nil {
		return false, fmt.Errorf("%s: %w", protocol.CommitStore, err)
	}
	return w.boolResult(r, protocol.CommitStore)
}

// PrepareRetrieve sends PREPARE_RETRIEVE and decodes the reply; its Data is
// a slice of the reply frame.
func (w *Worker) PrepareRetrieve(ctx context.Context, key protocol.Key) (protocol.PrepareRetrieveResponse, error) {
	r, err := w.call(ctx, protocol.PrepareRetrieve, key, w.cfg.InstanceID)
	if err != nil {
		return protocol.PrepareRetrieveResponse{}, err
	}
	if !r.Present {
		return protocol.PrepareRetrieveResponse{}, fmt.Errorf("%s: reply has no result frame", protocol.PrepareRetrieve)
	}
	return protocol.DecodePrepareRetrieveResponse(r.Raw, w.cfg.Limits)
}

// CommitRetrieve sends COMMIT_RETRIEVE and returns the server's answer.
func (w *Worker) CommitRetrieve(ctx context.Context, key protocol.Key) (bool, error) {
	r, err := w.call(ctx, protocol.CommitRetrieve, key, w.cfg.InstanceID)
	if err != nil {
		return false, err
	}
	return w.boolResult(r, protocol.CommitRetrieve)
}

// Retrieve reads the chunks of key the way an LMCache worker does:
// PREPARE_RETRIEVE (LOOKUP must have read-locked them), then each chunk is
// handed to fn in order (a view of the segment or of the reply: fn copies
// what it keeps), then COMMIT_RETRIEVE, always, also after a miss or an
// error. It returns how many chunks fn received: 0 on a miss. A reply that
// does not fit the request (ErrBadReply) delivers nothing.
func (w *Worker) Retrieve(ctx context.Context, key protocol.Key, fn func(i int, chunk []byte)) (int, error) {
	got, err := w.retrieve(ctx, key, fn)
	ok, cerr := w.CommitRetrieve(ctx, key)
	if err != nil {
		return got, err
	}
	if cerr != nil {
		return got, cerr
	}
	if !ok {
		return got, fmt.Errorf("%s answered false", protocol.CommitRetrieve)
	}
	return got, nil
}

func (w *Worker) retrieve(ctx context.Context, key protocol.Key, fn func(int, []byte)) (int, error) {
	want := w.chunks(key)
	pr, err := w.PrepareRetrieve(ctx, key)
	if err != nil || !pr.Success {
		return 0, err
	}
	if w.seg != nil {
		if len(pr.Slots) > want {
			return 0, fmt.Errorf("%s: %d slots for %d chunks: %w", protocol.PrepareRetrieve, len(pr.Slots), want, ErrBadReply)
		}
		views := make([][]byte, len(pr.Slots))
		for i, s := range pr.Slots {
			if views[i], err = w.SlotView(s); err != nil {
				return 0, fmt.Errorf("%s: %w", protocol.PrepareRetrieve, err)
			}
		}
		for i, v := range views {
			fn(i, v)
		}
		return len(views), nil
	}
	if len(pr.Data) == 0 {
		return 0, nil // an SHM reply to a pickle worker: a miss (spec 4.10)
	}
	ts, err := torchpickle.Decode(pr.Data, w.cfg.PickleLimits)
	if err != nil {
		return 0, fmt.Errorf("%s: unpickle data: %w", protocol.PrepareRetrieve, err)
	}
	if len(ts) > want {
		return 0, fmt.Errorf("%s: %d tensors for %d chunks: %w", protocol.PrepareRetrieve, len(ts), want, ErrBadReply)
	}
	for i, t := range ts {
		if t.Dtype != w.lay.Dtype || int64(len(t.Data)) != w.lay.Bytes {
			return 0, fmt.Errorf("%s: tensor %d is %s of %d bytes, the layout %s of %d: %w",
				protocol.PrepareRetrieve, i, t.Dtype, len(t.Data), w.lay.Dtype, w.lay.Bytes, ErrBadReply)
		}
	}
	for i, t := range ts {
		fn(i, t.Data)
	}
	return len(ts), nil
}
