package protocol

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Framing values of a profile.
const (
	// FramingFrames is one msgpack frame per payload argument, and a reply
	// frame only for a non-None result (seed era through engine-driven).
	FramingFrames = "frames"
	// FramingMessage is one request struct (a msgpack map keyed by field
	// name) in a single frame, and always one reply struct (newest LMCache,
	// rpc_messages/*.py): a None result is an empty struct.
	FramingMessage = "message"
)

// Message reports whether the profile uses single-frame request structs.
func (p *Profile) Message() bool { return p.Framing == FramingMessage }

// decodeMessage decodes the single request frame of a message-framing
// profile into the canonical args: Payload[i] read from field Fields[i].
// Unknown fields are skipped without recursion; a repeated known field, a
// missing required field or a present optional field after a missing one is
// an error. Missing trailing optional fields shorten the args (the handler
// then applies upstream's default), so a handler sees the same args as
// under a frames profile.
func decodeMessage(spec *Spec, payload [][]byte, lim Limits) ([]any, error) {
	if len(payload) != 1 {
		return nil, &DecodeError{Kind: KindArity, Spec: spec,
			Err: fmt.Errorf("%d payload frames, want 1 request message", len(payload))}
	}
	frame := payload[0]
	if len(spec.Fields) == 0 && len(spec.Payload) == 1 {
		// The request struct is the payload type itself (registration).
		v, err := DecodeValueLimits(spec.Payload[0], frame, lim)
		if err != nil {
			return nil, &DecodeError{Kind: KindPayload, Spec: spec, Err: fmt.Errorf("request message: %w", err)}
		}
		return []any{v}, nil
	}
	r := bytes.NewReader(frame)
	x := &dec{d: msgpack.NewDecoder(r), r: r, frame: frame, lim: lim.withDefaults()}
	vals := make([]any, len(spec.Fields))
	seen := make([]bool, len(spec.Fields))
	err := mapFields(x, func(name string) (bool, error) {
		i := slices.Index(spec.Fields, name)
		if i < 0 {
			return false, nil
		}
		if seen[i] {
			return false, fmt.Errorf("repeated")
		}
		start := x.pos()
		end, err := skipValue(frame, start)
		if err != nil {
			return false, err
		}
		v, err := DecodeValueLimits(spec.Payload[i], frame[start:end], lim)
		if err != nil {
			return false, err
		}
		if _, err := r.Seek(int64(end-start), io.SeekCurrent); err != nil {
			return false, err
		}
		vals[i], seen[i] = v, true
		return true, nil
	})
	if err == nil && r.Len() != 0 {
		err = fmt.Errorf("%d trailing bytes", r.Len())
	}
	if err != nil {
		return nil, &DecodeError{Kind: KindPayload, Spec: spec, Err: fmt.Errorf("request message: %w", err)}
	}
	required := len(spec.Fields) - spec.Optional
	n := 0
	for n < len(seen) && seen[n] {
		n++
	}
	if n < required {
		return nil, &DecodeError{Kind: KindPayload, Spec: spec,
			Err: fmt.Errorf("request message: missing required field %q", spec.Fields[n])}
	}
	if i := slices.Index(seen[n:], true); i >= 0 {
		return nil, &DecodeError{Kind: KindPayload, Spec: spec,
			Err: fmt.Errorf("request message: field %q present without %q", spec.Fields[n+i], spec.Fields[n])}
	}
	return vals[:n], nil
}

// ReplyFrame is the reply frame for a handler's result res to a request of
// spec, and whether there is one. Under FramingFrames a nil result has no
// frame and anything else is encoded as is. Under FramingMessage there is
// always a frame: a scalar result wrapped in the one-field reply struct
// named by spec.Reply (nil encodes as msgpack nil there: "None"), a nil
// result of a request without reply fields as the empty struct, and struct
// results (registration, prepare replies) as they are.
func (p *Profile) ReplyFrame(spec *Spec, res any) ([]byte, bool, error) {
	if !p.Message() {
		if res == nil {
			return nil, false, nil
		}
		if spec.Result == ResultIntDigits {
			s, err := digits(res)
			if err != nil {
				return nil, false, err
			}
			res = s
		}
		b, err := Encode(res)
		return b, err == nil, err
	}
	if len(spec.Reply) == 0 {
		if res == nil {
			return appendMapLen(nil, 0), true, nil
		}
		b, err := Encode(res)
		return b, err == nil, err
	}
	b := appendStr(appendMapLen(nil, 1), spec.Reply[0])
	if res == nil {
		return append(b, msgpcode.Nil), true, nil
	}
	b, err := AppendEncode(b, res)
	return b, err == nil, err
}

// Wraps reports whether ReplyFrame wraps spec's results (so an already
// encoded Raw result cannot be sent as is).
func (p *Profile) Wraps(spec *Spec) bool { return p.Message() && len(spec.Reply) > 0 }

// decodeFloat reads a msgpack float (32 or 64 bit) or int as float64;
// NaN and the infinities are refused (a timeout must be a number).
func decodeFloat(d *msgpack.Decoder) (float64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	var f float64
	switch {
	case c == msgpcode.Float || c == msgpcode.Double:
		if f, err = d.DecodeFloat64(); err != nil {
			return 0, err
		}
	case isIntCode(c):
		n, err := decodeInt(d)
		if err != nil {
			return 0, err
		}
		f = float64(n)
	default:
		return 0, fmt.Errorf("expected float, got code 0x%02x", c)
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("float %v is not finite", f)
	}
	return f, nil
}

// validateMessageSpec checks the message-framing columns of one request.
func validateMessageSpec(s *Spec, message bool, bad func(string, ...any), where string) {
	if !message {
		if len(s.Fields) > 0 || len(s.Reply) > 0 || s.Optional != 0 {
			bad("%s: fields, reply and optional need framing: message", where)
		}
		return
	}
	if len(s.Alternatives) > 0 {
		bad("%s: alternatives are for framing: frames", where)
	}
	switch {
	case len(s.Fields) == 0 && len(s.Payload) > 1:
		bad("%s: %d payload types without field names", where, len(s.Payload))
	case len(s.Fields) > 0 && len(s.Fields) != len(s.Payload):
		bad("%s: %d fields for %d payload types", where, len(s.Fields), len(s.Payload))
	}
	if s.Optional < 0 || s.Optional > len(s.Fields) {
		bad("%s: optional %d of %d fields", where, s.Optional, len(s.Fields))
	}
	scalar := false
	switch s.Result {
	case ResultInt, ResultOptInt, ResultBool, ResultStr, ResultStrList:
		scalar = true
	}
	switch {
	case scalar && len(s.Reply) != 1:
		bad("%s: result %s needs exactly one reply field", where, s.Result)
	case !scalar && len(s.Reply) != 0:
		bad("%s: result %s is sent as is, reply fields %v make no sense", where, s.Result, s.Reply)
	}
}

// EncodeMessage is the client side of decodeMessage: the request struct of
// spec with args in Payload order (fewer args leave trailing optional fields
// out). Args are encoded as Encode does.
func EncodeMessage(spec *Spec, args ...any) ([]byte, error) {
	if len(spec.Fields) == 0 && len(spec.Payload) == 1 {
		if len(args) != 1 {
			return nil, fmt.Errorf("%s: %d args, want 1", spec.Name, len(args))
		}
		return Encode(args[0])
	}
	if len(args) > len(spec.Fields) || len(args) < len(spec.Fields)-spec.Optional {
		return nil, fmt.Errorf("%s: %d args for fields %v", spec.Name, len(args), spec.Fields)
	}
	b := appendMapLen(nil, len(args))
	for i, a := range args {
		b = appendStr(b, spec.Fields[i])
		var err error
		if b, err = AppendEncode(b, a); err != nil {
			return nil, fmt.Errorf("%s field %s: %w", spec.Name, spec.Fields[i], err)
		}
	}
	return b, nil
}

// UnwrapReply is the client side of ReplyFrame for message profiles: the
// encoded result inside a reply struct, and whether there is one (a None
// field or the empty struct of a None result have none). Struct results are
// returned as they are.
func UnwrapReply(spec *Spec, frame []byte, lim Limits) ([]byte, bool, error) {
	if len(spec.Reply) == 0 {
		if spec.Result == ResultNone {
			return nil, false, nil
		}
		return frame, true, nil
	}
	r := bytes.NewReader(frame)
	x := &dec{d: msgpack.NewDecoder(r), r: r, frame: frame, lim: lim.withDefaults()}
	var val []byte
	err := mapFields(x, func(name string) (bool, error) {
		if name != spec.Reply[0] {
			return false, nil
		}
		start := x.pos()
		end, err := skipValue(frame, start)
		if err != nil {
			return false, err
		}
		val = frame[start:end]
		_, err = r.Seek(int64(end-start), io.SeekCurrent)
		return true, err
	})
	if err == nil && r.Len() != 0 {
		err = fmt.Errorf("%d trailing bytes", r.Len())
	}
	if err != nil {
		return nil, false, fmt.Errorf("%s reply: %w", spec.Name, err)
	}
	if val == nil {
		return nil, false, fmt.Errorf("%s reply: no field %q", spec.Name, spec.Reply[0])
	}
	if len(val) == 1 && val[0] == msgpcode.Nil {
		return nil, false, nil
	}
	return val, true, nil
}
