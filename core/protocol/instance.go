package protocol

import (
	"bytes"

	"github.com/vmihailenco/msgpack/v5"
)

// InstanceArg is the index of the payload argument that names a registered
// instance in a request of s (the transfers, UNREGISTER and an engine-era
// PING), -1 when the request names none.
func (s *Spec) InstanceArg() int {
	i := -1
	switch s.Handler {
	case PrepareStore, CommitStore, CommitStoreGroup, PrepareRetrieve, CommitRetrieve:
		i = 1
	case UnregisterKVCache, UnregisterKVCacheNonGPUContext, Ping:
		i = 0
	}
	if i < 0 || i >= len(s.Payload) || (s.Payload[i] != TypeInt && s.Payload[i] != TypeOptInt) {
		return -1
	}
	return i
}

// InstanceOf is the instance a decoded request of s names (args as
// DecodePayload returns them), and whether it names one.
func (s *Spec) InstanceOf(args []any) (int64, bool) {
	i := s.InstanceArg()
	if i < 0 || i >= len(args) {
		return 0, false
	}
	id, ok := args[i].(int64)
	return id, ok
}

// NamedInstance is the instance a request of spec names, read from its
// payload frames without decoding the rest (a key of many tokens stays
// undecoded): under frames framing the one frame of the id, under message
// framing the id's field of the request struct, every other field skipped.
// ok is false when the request names no instance or the id does not decode.
func (p *Profile) NamedInstance(spec *Spec, payload [][]byte) (id int64, ok bool) {
	i := spec.InstanceArg()
	if i < 0 {
		return 0, false
	}
	if !p.Message() {
		if i >= len(payload) {
			return 0, false
		}
		v, err := DecodeValue(TypeInt, payload[i])
		if err != nil {
			return 0, false
		}
		return v.(int64), true
	}
	if len(payload) != 1 || i >= len(spec.Fields) {
		return 0, false
	}
	frame := payload[0]
	r := bytes.NewReader(frame)
	x := &dec{d: msgpack.NewDecoder(r), r: r, frame: frame, lim: DefaultLimits().withDefaults()}
	err := mapFields(x, func(name string) (bool, error) {
		if name != spec.Fields[i] || ok {
			return false, nil
		}
		n, err := decodeLooseInt(x.d)
		if err != nil {
			return false, err
		}
		id, ok = n, true
		return true, nil
	})
	return id, ok && err == nil
}
