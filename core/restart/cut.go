package restart

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// The body's three large blocks, the object table, the prompt links and
// the eviction order (nine tenths of a 64,000-object record), are read by
// hand (objects.go, links.go, order.go), but encoding/json would still
// scan each twice to find where it ends, once to read the body and once
// to skip the value it hands on, and copy it into its buffer: more than
// the hand parsers take, in the restart's gap. So a body in Encode's form
// has the blocks read where they stand by the hand parsers, and the rest,
// with null in their places, goes to encoding/json. Any deviation (a
// block not in its canonical form, a key given twice, whitespace, a key
// with an escape, a byte past ASCII or another case of a block's name,
// which encoding/json would match to the block's field, or any error of
// the rest) reads the whole body the standard way instead: a body read
// the cut way is one the standard reading gives the same body for.

// parsedBlocks are the links and order blocks as the cut reading parsed
// them, nil where it did not: decodeLinks and decodeOrder do not parse
// them again.
type parsedBlocks struct {
	links []int64
	order *orderBlock
}

// decodeBody reads a record's body.
func decodeBody(js []byte) (body, parsedBlocks, error) {
	if b, parsed, ok := cutBody(js); ok {
		return b, parsed, nil
	}
	b, err := decodeStandard(js)
	return b, parsedBlocks{}, err
}

// decodeStandard reads js with encoding/json, unknown fields refused.
func decodeStandard(js []byte) (body, error) {
	var b body
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return body{}, fmt.Errorf("body: %v", err)
	}
	if dec.More() {
		return body{}, errors.New("body: data after the record")
	}
	return b, nil
}

// decodeCut reads js the cut way; ok is false where it does not apply.
func decodeCut(js []byte) (body, bool) {
	b, _, ok := cutBody(js)
	return b, ok
}

// cutBody is decodeCut with the blocks it parsed.
func cutBody(js []byte) (body, parsedBlocks, bool) {
	var parsed parsedBlocks
	if len(js) < 2 || js[0] != '{' || js[1] == '}' {
		return body{}, parsed, false
	}
	var (
		objects                           objectList
		links, order                      []byte
		parsedLinks                       []int64
		parsedOrder                       orderBlock
		haveObjects, haveLinks, haveOrder bool
		rest                              = make([]byte, 0, 64<<10)
		copied, i                         = 0, 1
	)
	for {
		key, n, ok := plainKey(js[i:])
		if !ok {
			return body{}, parsed, false
		}
		i += n
		if i >= len(js) || js[i] != ':' {
			return body{}, parsed, false
		}
		i++
		cut := true
		switch key {
		case "objects":
			if haveObjects {
				return body{}, parsed, false
			}
			objects, n, ok = parseObjectsAt(js[i:])
			haveObjects = true
		case "links":
			if haveLinks {
				return body{}, parsed, false
			}
			parsedLinks, n, ok = parseLinksAt(js[i:])
			links, haveLinks = js[i:i+n], true
		case "order":
			if haveOrder {
				return body{}, parsed, false
			}
			parsedOrder, n, ok = parseOrderAt(js[i:])
			order, haveOrder = js[i:i+n], true
		default:
			for _, name := range []string{"objects", "links", "order"} {
				if bytes.EqualFold([]byte(key), []byte(name)) {
					return body{}, parsed, false // encoding/json matches it to the block
				}
			}
			n, ok = skipValue(js[i:])
			cut = false
		}
		if !ok {
			return body{}, parsed, false
		}
		if cut {
			rest = append(append(rest, js[copied:i]...), "null"...)
			copied = i + n
		}
		i += n
		if i >= len(js) {
			return body{}, parsed, false
		}
		if js[i] == '}' {
			break
		}
		if js[i] != ',' {
			return body{}, parsed, false
		}
		i++
	}
	if i+1 != len(js) {
		return body{}, parsed, false // after the body: the standard reading says what
	}
	rest = append(rest, js[copied:]...)
	b, err := decodeStandard(rest)
	if err != nil {
		return body{}, parsed, false
	}
	if haveObjects {
		b.Objects = objects
	}
	if haveLinks {
		b.Links, parsed.links = links, parsedLinks
	}
	if haveOrder {
		b.Order, parsed.order = order, &parsedOrder
	}
	return b, parsed, true
}

// plainKey reads the object key at the start of b: a JSON string of
// printable ASCII without escapes. It returns the key and the bytes it
// took.
func plainKey(b []byte) (string, int, bool) {
	if len(b) < 2 || b[0] != '"' {
		return "", 0, false
	}
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return string(b[1:i]), i + 1, true
		case c == '\\' || c < 0x20 || c >= 0x80:
			return "", 0, false
		}
	}
	return "", 0, false
}

// skipValue returns the length of the JSON value at the start of b, which
// encoding/json checks afterwards (it stays in the rest): a string, an
// array or object (nested, strings skipped with their escapes), or a
// literal up to the next separator. Whitespace outside strings is not
// Encode's and ends the cut reading.
func skipValue(b []byte) (int, bool) {
	if len(b) == 0 {
		return 0, false
	}
	depth := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			n, ok := skipString(b[i:])
			if !ok {
				return 0, false
			}
			i += n - 1
			if depth == 0 {
				return i + 1, true
			}
		case '[', '{':
			depth++
		case ']', '}':
			if depth == 0 {
				return i, i > 0 // a literal ends at its container's end
			}
			depth--
			if depth == 0 {
				return i + 1, true
			}
		case ',':
			if depth == 0 {
				return i, i > 0
			}
		case ' ', '\t', '\n', '\r':
			return 0, false
		}
	}
	return 0, false
}

// skipString returns the length of the JSON string at the start of b.
func skipString(b []byte) (int, bool) {
	for i := 1; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1, true
		}
	}
	return 0, false
}
