package protocol

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Key is LMCache's IPCCacheEngineKey (spec 2.2). On the wire it is a map keyed by
// field name; RequestID is not part of key equality upstream (see Key.Equal).
type Key struct {
	ModelName string
	WorldSize int
	WorkerID  *int // nil on scheduler-side LOOKUP keys
	TokenIDs  []uint32
	Start     int
	End       int
	RequestID string
	CacheSalt string
}

// Equal reports key equality as upstream's dataclass does: every field but RequestID.
func (k Key) Equal(o Key) bool {
	if k.ModelName != o.ModelName || k.WorldSize != o.WorldSize || k.Start != o.Start ||
		k.End != o.End || k.CacheSalt != o.CacheSalt || len(k.TokenIDs) != len(o.TokenIDs) {
		return false
	}
	if (k.WorkerID == nil) != (o.WorkerID == nil) || (k.WorkerID != nil && *k.WorkerID != *o.WorkerID) {
		return false
	}
	for i, t := range k.TokenIDs {
		if o.TokenIDs[i] != t {
			return false
		}
	}
	return true
}

// EncodeMsgpack writes the key as msgspec does: a map with every field, in
// declaration order.
func (k Key) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(8); err != nil {
		return err
	}
	w := fieldWriter{e: e}
	w.str("model_name", k.ModelName)
	w.int("world_size", int64(k.WorldSize))
	w.key("worker_id")
	if k.WorkerID == nil {
		w.err1(e.EncodeNil())
	} else {
		w.err1(e.EncodeInt(int64(*k.WorkerID)))
	}
	w.key("token_ids")
	w.err1(e.EncodeArrayLen(len(k.TokenIDs)))
	for _, t := range k.TokenIDs {
		w.err1(e.EncodeUint(uint64(t)))
	}
	w.int("start", int64(k.Start))
	w.int("end", int64(k.End))
	w.str("request_id", k.RequestID)
	w.str("cache_salt", k.CacheSalt)
	return w.err
}

// RegisterPayload is RegisterNonGpuContextPayload (spec 2.3), also used for the
// engine-driven register request (RegisterEngineDrivenContextPayload), whose
// group_layouts describe a hybrid-attention model's KV groups.
type RegisterPayload struct {
	InstanceID    int64
	ModelName     string
	WorldSize     int
	BlockSize     int
	NumLayers     int
	HiddenDimSize int
	DtypeStr      string
	UseMLA        bool
	// GroupLayouts is empty for a plain model; a hybrid model lists one
	// entry per KV group (the flat fields then repeat group 0's).
	GroupLayouts []GroupLayout
}

// MaxGroupLayouts bounds the group_layouts a register payload may carry
// (the decoder refuses more before allocating them); the transfer module
// applies its own, smaller, limit with a clear error.
const MaxGroupLayouts = 64

// GroupLayout is upstream's GroupLayoutInfo: one KV group of a hybrid model.
type GroupLayout struct {
	BlockSize      int
	NumLayers      int
	HiddenDimSize  int
	DtypeStr       string
	UseMLA         bool
	TokensPerBlock int
}

// EncodeMsgpack writes the group as a map of all fields in declaration order.
func (g GroupLayout) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(6); err != nil {
		return err
	}
	w := fieldWriter{e: e}
	w.int("block_size", int64(g.BlockSize))
	w.int("num_layers", int64(g.NumLayers))
	w.int("hidden_dim_size", int64(g.HiddenDimSize))
	w.str("dtype_str", g.DtypeStr)
	w.key("use_mla")
	w.err1(e.EncodeBool(g.UseMLA))
	w.int("tokens_per_block", int64(g.TokensPerBlock))
	return w.err
}

// EncodeMsgpack writes the payload as a map of all fields in declaration
// order; group_layouts only when there are some (the seed-era payload has
// no such field).
func (p RegisterPayload) EncodeMsgpack(e *msgpack.Encoder) error {
	n := 8
	if len(p.GroupLayouts) > 0 {
		n = 9
	}
	if err := e.EncodeMapLen(n); err != nil {
		return err
	}
	w := fieldWriter{e: e}
	w.int("instance_id", p.InstanceID)
	w.str("model_name", p.ModelName)
	w.int("world_size", int64(p.WorldSize))
	w.int("block_size", int64(p.BlockSize))
	w.int("num_layers", int64(p.NumLayers))
	w.int("hidden_dim_size", int64(p.HiddenDimSize))
	w.str("dtype_str", p.DtypeStr)
	w.key("use_mla")
	w.err1(e.EncodeBool(p.UseMLA))
	if len(p.GroupLayouts) > 0 {
		w.key("group_layouts")
		w.err1(e.EncodeArrayLen(len(p.GroupLayouts)))
		for _, g := range p.GroupLayouts {
			w.err1(g.EncodeMsgpack(e))
		}
	}
	return w.err
}

// RegisterResponse is RegisterNonGpuContextResponse: {shm_name, pool_size}.
type RegisterResponse struct {
	ShmName  string
	PoolSize int64
}

// EncodeMsgpack writes {"shm_name": …, "pool_size": …}.
func (r RegisterResponse) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(2); err != nil {
		return err
	}
	w := fieldWriter{e: e}
	w.str("shm_name", r.ShmName)
	w.int("pool_size", r.PoolSize)
	return w.err
}

// Slot is one SHM slot descriptor inside a context map (spec 2.3).
type Slot struct {
	Offset int64
	Length int64
	Shape  []int
	Dtype  string
}

// EncodeMsgpack writes {"offset", "length", "shape", "dtype"}.
func (s Slot) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(4); err != nil {
		return err
	}
	w := fieldWriter{e: e}
	w.int("offset", s.Offset)
	w.int("length", s.Length)
	w.key("shape")
	w.err1(e.EncodeArrayLen(len(s.Shape)))
	for _, d := range s.Shape {
		w.err1(e.EncodeInt(int64(d)))
	}
	w.str("dtype", s.Dtype)
	return w.err
}

// PrepareStoreResponse is {"context": {...}}: with Shm the context carries
// "slots" and "chunk_indices", otherwise it is empty. For a hybrid model
// (GroupIDs not nil) the slots run group-major, each chunk index counts
// within its group, and "group_ids" names each slot's KV group.
type PrepareStoreResponse struct {
	Shm          bool
	Slots        []Slot
	ChunkIndices []int
	GroupIDs     []int
}

// EncodeMsgpack writes {"context": {"slots": [...], "chunk_indices": [...]}} or
// {"context": {}}.
func (r PrepareStoreResponse) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(1); err != nil {
		return err
	}
	w := fieldWriter{e: e}
	w.key("context")
	if !r.Shm {
		w.err1(e.EncodeMapLen(0))
		return w.err
	}
	if r.GroupIDs != nil {
		w.err1(e.EncodeMapLen(3))
	} else {
		w.err1(e.EncodeMapLen(2))
	}
	w.slots(r.Slots)
	w.key("chunk_indices")
	w.err1(e.EncodeArrayLen(len(r.ChunkIndices)))
	for _, i := range r.ChunkIndices {
		w.err1(e.EncodeInt(int64(i)))
	}
	if r.GroupIDs != nil {
		w.groupIDs(r.GroupIDs)
	}
	return w.err
}

func (w *fieldWriter) groupIDs(ids []int) {
	w.key("group_ids")
	w.err1(w.e.EncodeArrayLen(len(ids)))
	for _, g := range ids {
		w.err1(w.e.EncodeInt(int64(g)))
	}
}

// PrepareRetrieveResponse is {"success", "data", "context"}; Slots nil gives an
// empty context, otherwise {"slots": [...]}, and for a hybrid model (GroupIDs
// not nil) {"slots", "group_ids"}, the slots group-major.
type PrepareRetrieveResponse struct {
	Success  bool
	Data     []byte
	Slots    []Slot
	GroupIDs []int
}

// AppendContext appends the encoding of the reply's context (its slots and
// group ids; the empty map without slots), as EncodeMsgpack writes it.
func (r PrepareRetrieveResponse) AppendContext(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	w := fieldWriter{e: e}
	r.encodeContext(&w)
	if w.err != nil {
		return nil, w.err
	}
	return append(b, buf.Bytes()...), nil
}

// EncodeMsgpack writes the three fields in declaration order; Data is always bin.
func (r PrepareRetrieveResponse) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(3); err != nil {
		return err
	}
	w := fieldWriter{e: e}
	w.key("success")
	w.err1(e.EncodeBool(r.Success))
	w.key("data")
	// EncodeBytes(nil) would write nil; msgspec always writes bin.
	data := r.Data
	if data == nil {
		data = []byte{}
	}
	w.err1(e.EncodeBytes(data))
	w.key("context")
	r.encodeContext(&w)
	return w.err
}

// encodeContext writes the context map: {} without slots, else the slots
// (and the group ids of a hybrid model's).
func (r PrepareRetrieveResponse) encodeContext(w *fieldWriter) {
	switch {
	case r.Slots == nil:
		w.err1(w.e.EncodeMapLen(0))
	case r.GroupIDs != nil:
		w.err1(w.e.EncodeMapLen(2))
		w.slots(r.Slots)
		w.groupIDs(r.GroupIDs)
	default:
		w.err1(w.e.EncodeMapLen(1))
		w.slots(r.Slots)
	}
}

// BlockAllocationRecord is one REPORT_BLOCK_ALLOCATION record (spec 2.3).
type BlockAllocationRecord struct {
	ReqID       string
	NewBlockIDs []int64
	NewTokenIDs []int64
}

// EncodeMsgpack writes {"req_id", "new_block_ids", "new_token_ids"}.
func (r BlockAllocationRecord) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(3); err != nil {
		return err
	}
	w := fieldWriter{e: e}
	w.str("req_id", r.ReqID)
	w.ints("new_block_ids", r.NewBlockIDs)
	w.ints("new_token_ids", r.NewTokenIDs)
	return w.err
}

// fieldWriter keeps the first encoding error so encoders read straight.
type fieldWriter struct {
	e   *msgpack.Encoder
	err error
}

func (w *fieldWriter) err1(err error) {
	if w.err == nil && err != nil {
		w.err = fmt.Errorf("encode: %w", err)
	}
}

func (w *fieldWriter) key(k string) { w.err1(w.e.EncodeString(k)) }

func (w *fieldWriter) str(k, v string) {
	w.key(k)
	w.err1(w.e.EncodeString(v))
}

func (w *fieldWriter) int(k string, v int64) {
	w.key(k)
	w.err1(w.e.EncodeInt(v))
}

func (w *fieldWriter) ints(k string, vs []int64) {
	w.key(k)
	w.err1(w.e.EncodeArrayLen(len(vs)))
	for _, v := range vs {
		w.err1(w.e.EncodeInt(v))
	}
}

func (w *fieldWriter) slots(ss []Slot) {
	w.key("slots")
	w.err1(w.e.EncodeArrayLen(len(ss)))
	for _, s := range ss {
		w.err1(s.EncodeMsgpack(w.e))
	}
}
