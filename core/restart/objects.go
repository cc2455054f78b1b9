package restart

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// objectList is the record's object table. At 65,536 objects encoding/json
// spends most of a restart's record time on it, by reflection field by
// field, so it is written and read by hand in the one form Encode writes:
// each object's fields in struct order, the omitempty ones only when set,
// no whitespace. Reading takes that form in one pass; anything else (other
// whitespace, field order, escapes, an unknown or repeated field, a number
// out of range) goes to encoding/json with unknown fields refused, as the
// whole body is read, so the fast path accepts a subset of what the
// standard path accepts and decodes it to the same values.
type objectList []object

// MarshalJSON writes l as encoding/json writes []object.
func (l objectList) MarshalJSON() ([]byte, error) {
	out := make([]byte, 0, 2+len(l)*112)
	out = append(out, '[')
	for i := range l {
		o := &l[i]
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"c":`...)
		if allHex(o.Chunk) {
			// Encode's chunks are hex digits: nothing to escape.
			out = append(append(append(out, '"'), o.Chunk...), '"')
		} else {
			js, _ := json.Marshal(o.Chunk) // a string always marshals
			out = append(out, js...)
		}
		out = append(out, `,"n":`...)
		out = strconv.AppendInt(out, int64(o.Name), 10)
		out = append(out, `,"r":`...)
		out = strconv.AppendUint(out, uint64(o.Rank), 10)
		out = append(out, `,"g":`...)
		out = strconv.AppendUint(out, uint64(o.Group), 10)
		out = append(out, `,"o":`...)
		out = strconv.AppendInt(out, o.Off, 10)
		out = append(out, `,"l":`...)
		out = strconv.AppendInt(out, o.Len, 10)
		if o.Held {
			out = append(out, `,"h":true`...)
		}
		if o.Write {
			out = append(out, `,"w":true`...)
		}
		if o.Readers != 0 {
			out = append(out, `,"rd":`...)
			out = strconv.AppendUint(out, uint64(o.Readers), 10)
		}
		if o.Holds != 0 {
			out = append(out, `,"hd":`...)
			out = strconv.AppendUint(out, uint64(o.Holds), 10)
		}
		if o.Deadline != 0 {
			out = append(out, `,"d":`...)
			out = strconv.AppendInt(out, o.Deadline, 10)
		}
		if o.Live {
			out = append(out, `,"lv":true`...)
		}
		out = append(out, '}')
	}
	return append(out, ']'), nil
}

// UnmarshalJSON reads what MarshalJSON writes in one pass, and anything
// else through encoding/json, unknown fields refused.
func (l *objectList) UnmarshalJSON(b []byte) error {
	if objs, ok := parseObjects(b); ok {
		*l = objs
		return nil
	}
	var objs []object
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&objs); err != nil {
		return fmt.Errorf("objects: %w", err)
	}
	*l = objs
	return nil
}

// objectParser reads the canonical form; any deviation sets bad.
type objectParser struct {
	b   []byte
	i   int
	bad bool
}

// lit consumes s.
func (p *objectParser) lit(s string) {
	if p.bad || !bytes.HasPrefix(p.b[p.i:], []byte(s)) {
		p.bad = true
		return
	}
	p.i += len(s)
}

// opt consumes s when it comes next.
func (p *objectParser) opt(s string) bool {
	if p.bad || !bytes.HasPrefix(p.b[p.i:], []byte(s)) {
		return false
	}
	p.i += len(s)
	return true
}

// number returns the JSON integer that comes next, -?(0|[1-9][0-9]*),
// parsed as a signed or unsigned integer of bits bits.
func (p *objectParser) number(signed bool, bits int) (int64, uint64) {
	if p.bad {
		return 0, 0
	}
	start, i := p.i, p.i
	if signed && i < len(p.b) && p.b[i] == '-' {
		i++
	}
	digits := i
	for i < len(p.b) && p.b[i] >= '0' && p.b[i] <= '9' {
		i++
	}
	if i == digits || (p.b[digits] == '0' && i > digits+1) {
		p.bad = true
		return 0, 0
	}
	p.i = i
	s := string(p.b[start:i])
	if signed {
		v, err := strconv.ParseInt(s, 10, bits)
		p.bad = err != nil
		return v, 0
	}
	v, err := strconv.ParseUint(s, 10, bits)
	p.bad = err != nil
	return 0, v
}

func (p *objectParser) signed(bits int) int64 { v, _ := p.number(true, bits); return v }

func (p *objectParser) unsigned(bits int) uint64 { _, v := p.number(false, bits); return v }

// chunk returns a JSON string of hex digits alone (no escapes).
func (p *objectParser) chunk() string {
	if p.bad || p.i >= len(p.b) || p.b[p.i] != '"' {
		p.bad = true
		return ""
	}
	start := p.i + 1
	i := start
	for i < len(p.b) && isHex(p.b[i]) {
		i++
	}
	if i >= len(p.b) || p.b[i] != '"' {
		p.bad = true
		return ""
	}
	p.i = i + 1
	return string(p.b[start:i])
}

func allHex(s string) bool {
	for i := range len(s) {
		if !isHex(s[i]) {
			return false
		}
	}
	return true
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

// marshalBody renders b as encoding/json does, its object table written
// apart: encoding/json would check and compact the table's bytes again
// after MarshalJSON. The body is marshaled with an empty table and the
// table put in its place: every field before it holds numbers or base64
// text (exact), so the first `"objects":[]` is the table's.
func marshalBody(b body) ([]byte, error) {
	objs := b.Objects
	b.Objects = objectList{}
	js, err := json.Marshal(b)
	if err != nil {
		return nil, err
	}
	const empty = `"objects":[]`
	at := bytes.Index(js, []byte(empty))
	if at < 0 {
		return nil, fmt.Errorf("object table not found in the body")
	}
	table, _ := objs.MarshalJSON()
	out := make([]byte, 0, len(js)+len(table))
	out = append(out, js[:at+len(`"objects":`)]...)
	out = append(out, table...)
	return append(out, js[at+len(empty):]...), nil
}

// parseObjects reads b in the canonical form; ok is false when b is not
// in it (it may still be valid JSON for encoding/json to judge).
func parseObjects(b []byte) ([]object, bool) {
	out, n, ok := parseObjectsAt(b)
	return out, ok && n == len(b)
}

// parseObjectsAt reads a table in the canonical form at the start of b and
// returns how many bytes it took.
func parseObjectsAt(b []byte) ([]object, int, bool) {
	p := objectParser{b: b}
	p.lit("[")
	out := make([]object, 0, min(bytes.Count(b, []byte(`{"c":`)), MaxObjects+1))
	for !p.bad && !p.opt("]") {
		if len(out) > 0 {
			p.lit(",")
		}
		var o object
		p.lit(`{"c":`)
		o.Chunk = p.chunk()
		p.lit(`,"n":`)
		o.Name = int(p.signed(strconv.IntSize))
		p.lit(`,"r":`)
		o.Rank = uint32(p.unsigned(32))
		p.lit(`,"g":`)
		o.Group = uint32(p.unsigned(32))
		p.lit(`,"o":`)
		o.Off = p.signed(64)
		p.lit(`,"l":`)
		o.Len = p.signed(64)
		o.Held = p.opt(`,"h":true`)
		o.Write = p.opt(`,"w":true`)
		if p.opt(`,"rd":`) {
			o.Readers = uint32(p.unsigned(32))
		}
		if p.opt(`,"hd":`) {
			o.Holds = uint32(p.unsigned(32))
		}
		if p.opt(`,"d":`) {
			o.Deadline = p.signed(64)
		}
		o.Live = p.opt(`,"lv":true`)
		p.lit("}")
		out = append(out, o)
	}
	return out, p.i, !p.bad
}
