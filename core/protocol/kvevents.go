package protocol

import "github.com/vmihailenco/msgpack/v5"

// KVEventPollResult is upstream's KVEventPollResult, the answer to
// POLL_KV_EVENTS (custom_types.py @ 593e6c13, docs/PROTOCOLS.md).
type KVEventPollResult struct {
	Enabled     bool
	Incarnation int64
	NextCursor  int64
	Lost        bool
	Events      []KVEventRecord
}

// KVEventRecord is upstream's KVEventRecord: one record of the server's
// cache-event log.
type KVEventRecord struct {
	Seq    int64
	Kind   string // "stored" or "removed"
	Medium string
	Model  string
	Hashes [][32]byte
	// Parent is the previous chunk's hash of a stored record; nil for a
	// prompt's first chunk and for removals.
	Parent    *[32]byte
	TokenIDs  []uint32
	BlockSize int64
}

// EncodeMsgpack writes the result as msgspec writes the dataclass: a map
// of every field in declaration order.
func (r KVEventPollResult) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(5); err != nil {
		return err
	}
	w := fieldWriter{e: e}
	w.key("enabled")
	w.err1(e.EncodeBool(r.Enabled))
	w.int("incarnation", r.Incarnation)
	w.int("next_cursor", r.NextCursor)
	w.key("lost")
	w.err1(e.EncodeBool(r.Lost))
	w.key("events")
	w.err1(e.EncodeArrayLen(len(r.Events)))
	for i := range r.Events {
		w.err1(r.Events[i].EncodeMsgpack(e))
	}
	return w.err
}

// EncodeMsgpack writes the record as a map of every field in declaration
// order; hashes are bin (upstream's bytes).
func (r KVEventRecord) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(8); err != nil {
		return err
	}
	w := fieldWriter{e: e}
	w.int("seq", r.Seq)
	w.str("kind", r.Kind)
	w.str("medium", r.Medium)
	w.str("model_name", r.Model)
	w.key("block_hashes")
	w.err1(e.EncodeArrayLen(len(r.Hashes)))
	for i := range r.Hashes {
		w.err1(e.EncodeBytes(r.Hashes[i][:]))
	}
	w.key("parent_block_hash")
	if r.Parent == nil {
		w.err1(e.EncodeNil())
	} else {
		w.err1(e.EncodeBytes(r.Parent[:]))
	}
	w.key("token_ids")
	w.err1(e.EncodeArrayLen(len(r.TokenIDs)))
	for _, t := range r.TokenIDs {
		w.err1(e.EncodeUint(uint64(t)))
	}
	w.int("block_size", r.BlockSize)
	return w.err
}
