package tier

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"kvdock/core/layout"
)

// The value header, all integers little-endian:
//
//	magic "KVT1" | version u16 | key length u32 | key | dims u8 | dims × i64 |
//	dtype length u8 | dtype | payload length u64 | CRC-32C u32 | payload
//
// The checksum covers everything before it and the payload, so a flipped
// byte anywhere is caught.
const (
	magic = "KVT1"
	// Version is the header format version written and accepted.
	Version = 1

	maxKeyLen  = 64 << 10
	maxDims    = 16
	maxDtype   = 32
	fixedBytes = 4 + 2 + 4 + 1 + 1 + 8 + 4
)

// ErrCorrupt is wrapped by Verify for every value that must not be served:
// bad magic, version, key, layout, length or checksum.
var ErrCorrupt = errors.New("tier: value rejected")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// headerLen is the size of the header of key and lay.
func headerLen(key string, lay layout.Layout) int {
	return fixedBytes + len(key) + 8*len(lay.Shape) + len(lay.Dtype)
}

// newValue returns a value buffer for n payload bytes with the header of
// key and lay written, and the payload part of it; seal finishes it once the
// payload is in place.
func newValue(key string, lay layout.Layout, n int) (v, payload []byte, err error) {
	if len(key) > maxKeyLen || len(lay.Shape) > maxDims || len(lay.Dtype) > maxDtype {
		return nil, nil, fmt.Errorf("tier: header of key %d bytes, %d dims, dtype %d bytes: too large", len(key), len(lay.Shape), len(lay.Dtype))
	}
	h := headerLen(key, lay)
	v = make([]byte, h+n)
	b := append(v[:0], magic...)
	b = binary.LittleEndian.AppendUint16(b, Version)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(key)))
	b = append(b, key...)
	b = append(b, byte(len(lay.Shape)))
	for _, d := range lay.Shape {
		b = binary.LittleEndian.AppendUint64(b, uint64(int64(d)))
	}
	b = append(b, byte(len(lay.Dtype)))
	b = append(b, lay.Dtype...)
	b = binary.LittleEndian.AppendUint64(b, uint64(n))
	_ = b // the checksum slot [h-4, h) is filled by seal
	return v, v[h:], nil
}

// seal writes the checksum of a value built by newValue.
func seal(v []byte, h int) {
	c := crc32.Update(crc32.Checksum(v[:h-4], castagnoli), castagnoli, v[h:])
	binary.LittleEndian.PutUint32(v[h-4:h], c)
}

// Encode returns the tier value of payload stored under key with layout lay.
func Encode(key string, lay layout.Layout, payload []byte) ([]byte, error) {
	v, dst, err := newValue(key, lay, len(payload))
	if err != nil {
		return nil, err
	}
	copy(dst, payload)
	seal(v, len(v)-len(payload))
	return v, nil
}

// Verify checks that v is a value of this format and version stored under
// key with layout lay, with a payload of lay.Bytes bytes and a good
// checksum, and returns the payload (a part of v). Any mismatch is an error
// wrapping ErrCorrupt: the value is a miss, never served.
func Verify(v []byte, key string, lay layout.Layout) ([]byte, error) {
	h := headerLen(key, lay)
	if len(v) < len(magic)+2 || string(v[:4]) != magic {
		return nil, fmt.Errorf("%w: not a kvdock tier value", ErrCorrupt)
	}
	if ver := binary.LittleEndian.Uint16(v[4:6]); ver != Version {
		return nil, fmt.Errorf("%w: format version %d, want %d", ErrCorrupt, ver, Version)
	}
	if len(v) < h {
		return nil, fmt.Errorf("%w: %d bytes, shorter than the header", ErrCorrupt, len(v))
	}
	b := v[6:]
	if n := binary.LittleEndian.Uint32(b); int64(n) != int64(len(key)) || string(b[4:4+len(key)]) != key {
		return nil, fmt.Errorf("%w: stored under another key", ErrCorrupt)
	}
	b = b[4+len(key):]
	if int(b[0]) != len(lay.Shape) {
		return nil, fmt.Errorf("%w: layout has %d dims, want %s", ErrCorrupt, b[0], lay)
	}
	b = b[1:]
	for i, d := range lay.Shape {
		if int64(binary.LittleEndian.Uint64(b[8*i:])) != int64(d) {
			return nil, fmt.Errorf("%w: layout shape differs from %s", ErrCorrupt, lay)
		}
	}
	b = b[8*len(lay.Shape):]
	if int(b[0]) != len(lay.Dtype) || string(b[1:1+len(lay.Dtype)]) != lay.Dtype {
		return nil, fmt.Errorf("%w: dtype differs from %s", ErrCorrupt, lay.Dtype)
	}
	b = b[1+len(lay.Dtype):]
	n := binary.LittleEndian.Uint64(b)
	if n != uint64(lay.Bytes) || uint64(len(v)-h) != n {
		return nil, fmt.Errorf("%w: payload of %d bytes (%d present), layout needs %d", ErrCorrupt, n, len(v)-h, lay.Bytes)
	}
	want := binary.LittleEndian.Uint32(v[h-4 : h])
	if got := crc32.Update(crc32.Checksum(v[:h-4], castagnoli), castagnoli, v[h:]); got != want {
		return nil, fmt.Errorf("%w: checksum %08x, header says %08x", ErrCorrupt, got, want)
	}
	return v[h:], nil
}
