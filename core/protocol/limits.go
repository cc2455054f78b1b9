package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Limits bound what one decoded payload may make the server keep: a peer
// controls every length on the wire, so each one is checked before anything
// of that size is allocated.
type Limits struct {
	// MaxTokens caps the token ids of one key and the ints of one block
	// allocation report (each becomes 4 or 8 bytes from as little as 1 byte
	// on the wire).
	MaxTokens int
	// MaxString caps every string a peer sends (model_name, request_id,
	// cache_salt, dtype_str, session and request ids), in bytes.
	MaxString int
}

// Defaults for Limits: 2 Mi tokens is beyond any model's context window; 256
// bytes holds any model path and request id upstream produces.
const (
	DefaultMaxTokens = 2 << 20
	DefaultMaxString = 256
)

// DefaultLimits are the limits DecodeValue and DecodePayload apply.
func DefaultLimits() Limits {
	return Limits{MaxTokens: DefaultMaxTokens, MaxString: DefaultMaxString}
}

func (l Limits) withDefaults() Limits {
	l.MaxTokens = positiveOr(l.MaxTokens, DefaultMaxTokens)
	l.MaxString = positiveOr(l.MaxString, DefaultMaxString)
	return l
}

// MaxSkipDepth bounds the nesting of a value the decoder skips (an unknown
// map key's value): real payloads nest two or three levels.
const MaxSkipDepth = 32

// skipValue returns the offset just past the msgpack value at b[pos:],
// without recursion: a stack of remaining item counts, at most MaxSkipDepth
// deep. Every item takes at least one byte and a container may not announce
// more items than bytes remain, so the work is linear in len(b).
func skipValue(b []byte, pos int) (int, error) {
	stack := make([]int, 1, 8)
	stack[0] = 1
	for len(stack) > 0 {
		top := len(stack) - 1
		if stack[top] == 0 {
			stack = stack[:top]
			continue
		}
		stack[top]--
		if pos >= len(b) {
			return 0, errors.New("skip: truncated value")
		}
		c := b[pos]
		pos++
		var body, items int // bytes after the header; container items
		var lenBytes int    // size of an explicit length field
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		case c >= 0x80 && c <= 0x8f:
			items = 2 * int(c&0x0f)
		case c >= 0x90 && c <= 0x9f:
			items = int(c & 0x0f)
		case c >= 0xa0 && c <= 0xbf:
			body = int(c & 0x1f)
		case c == 0xc4 || c == 0xd9:
			lenBytes = 1
		case c == 0xc5 || c == 0xda:
			lenBytes = 2
		case c == 0xc6 || c == 0xdb:
			lenBytes = 4
		case c == 0xc7:
			lenBytes, body = 1, 1
		case c == 0xc8:
			lenBytes, body = 2, 1
		case c == 0xc9:
			lenBytes, body = 4, 1
		case c == 0xca:
			body = 4
		case c == 0xcb:
			body = 8
		case c >= 0xcc && c <= 0xcf:
			body = 1 << (c - 0xcc)
		case c >= 0xd0 && c <= 0xd3:
			body = 1 << (c - 0xd0)
		case c >= 0xd4 && c <= 0xd8:
			body = 1 + 1<<(c-0xd4)
		case c == 0xdc || c == 0xde:
			lenBytes = 2
		case c == 0xdd || c == 0xdf:
			lenBytes = 4
		default:
			return 0, fmt.Errorf("skip: invalid code 0x%02x", c)
		}
		if lenBytes > 0 {
			if len(b)-pos < lenBytes {
				return 0, errors.New("skip: truncated length")
			}
			var n uint64
			switch lenBytes {
			case 1:
				n = uint64(b[pos])
			case 2:
				n = uint64(binary.BigEndian.Uint16(b[pos:]))
			default:
				n = uint64(binary.BigEndian.Uint32(b[pos:]))
			}
			pos += lenBytes
			if n > uint64(len(b)) {
				return 0, fmt.Errorf("skip: length %d exceeds frame", n)
			}
			switch c {
			case 0xdc, 0xdd:
				items = int(n)
			case 0xde, 0xdf:
				items = 2 * int(n)
			default:
				body += int(n)
			}
		}
		if body > len(b)-pos {
			return 0, errors.New("skip: truncated value")
		}
		pos += body
		if items > 0 {
			if items > len(b)-pos {
				return 0, fmt.Errorf("skip: %d items exceed frame", items)
			}
			if len(stack) > MaxSkipDepth {
				return 0, fmt.Errorf("skip: nesting deeper than %d", MaxSkipDepth)
			}
			stack = append(stack, items)
		}
	}
	return pos, nil
}

// positiveOr is v, or def where v is not positive: an option left unset
// takes its default. Each core leaf keeps its own, so none imports settings.
func positiveOr[T ~int | ~int64 | ~float64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}
