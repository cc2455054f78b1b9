package protocol

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

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

// DecodeKVEventPollResult reads a POLL_KV_EVENTS reply under lim: every
// field of the result and of each record is required (msgspec's dataclass
// has no defaults), hashes must be 32-byte bins, and no count may promise
// more than the frame holds. Hashes and tokens are copies.
func DecodeKVEventPollResult(frame []byte, lim Limits) (KVEventPollResult, error) {
	x := newDec(frame, lim)
	var r KVEventPollResult
	req := required{"enabled": false, "incarnation": false, "next_cursor": false, "lost": false, "events": false}
	err := mapFields(x, func(name string) (bool, error) {
		var err error
		if _, ok := req[name]; ok {
			req[name] = true
		}
		switch name {
		case "enabled":
			r.Enabled, err = decodeLooseBool(x.d)
		case "incarnation":
			r.Incarnation, err = decodeInt(x.d)
		case "next_cursor":
			r.NextCursor, err = decodeInt(x.d)
		case "lost":
			r.Lost, err = decodeLooseBool(x.d)
		case "events":
			r.Events, err = decodeKVEventRecords(x)
		default:
			return false, nil
		}
		return true, err
	})
	if err == nil {
		err = req.check("kv event poll result")
	}
	if err := x.finish("kv event poll result", err); err != nil {
		return KVEventPollResult{}, err
	}
	return r, nil
}

// minKVEventRecordBytes is the smallest encoding of a record: a map header,
// its eight keys (79 bytes as fixstrs) and eight one-byte values; so a
// lying count cannot allocate records the frame could never fill.
const minKVEventRecordBytes = 1 + 79 + 8

func decodeKVEventRecords(x *dec) ([]KVEventRecord, error) {
	n, err := decodeArrayLen(x.d)
	if err != nil {
		return nil, err
	}
	if n > remaining(x.d)/minKVEventRecordBytes {
		return nil, fmt.Errorf("%d records exceed the frame", n)
	}
	out := make([]KVEventRecord, n)
	for i := range out {
		if err := decodeKVEventRecord(x, &out[i]); err != nil {
			return nil, fmt.Errorf("record %d: %w", i, err)
		}
	}
	return out, nil
}

func decodeKVEventRecord(x *dec, r *KVEventRecord) error {
	req := required{"seq": false, "kind": false, "medium": false, "model_name": false, "block_hashes": false,
		"parent_block_hash": false, "token_ids": false, "block_size": false}
	err := mapFields(x, func(name string) (bool, error) {
		var err error
		if _, ok := req[name]; ok {
			req[name] = true
		}
		switch name {
		case "seq":
			r.Seq, err = decodeInt(x.d)
		case "kind":
			r.Kind, err = x.str()
		case "medium":
			r.Medium, err = x.str()
		case "model_name":
			r.Model, err = x.str()
		case "block_hashes":
			var n int
			if n, err = decodeArrayLen(x.d); err != nil {
				return true, err
			}
			if n > remaining(x.d)/34 { // a 32-byte bin takes 34 bytes
				return true, fmt.Errorf("%d hashes exceed the frame", n)
			}
			r.Hashes = make([][32]byte, n)
			for i := range r.Hashes {
				if err = x.hash32(&r.Hashes[i]); err != nil {
					return true, fmt.Errorf("hash %d: %w", i, err)
				}
			}
		case "parent_block_hash":
			var isNil bool
			if isNil, err = peekNil(x.d); err != nil || isNil {
				return true, err
			}
			r.Parent = new([32]byte)
			err = x.hash32(r.Parent)
		case "token_ids":
			r.TokenIDs, err = decodeTokens(x)
		case "block_size":
			r.BlockSize, err = decodeInt(x.d)
		default:
			return false, nil
		}
		return true, err
	})
	if err == nil {
		err = req.check("kv event record")
	}
	return err
}

// hash32 reads a 32-byte bin into h.
func (x *dec) hash32(h *[32]byte) error {
	b, err := x.bin()
	if err != nil {
		return err
	}
	if len(b) != len(h) {
		return fmt.Errorf("%d bytes, want %d", len(b), len(h))
	}
	copy(h[:], b)
	return nil
}
