package tier

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"runtime"

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

// ErrForeign is wrapped, beside ErrCorrupt, by Verify for an intact value
// (this format and version, good checksum) whose header names another key
// or layout than the one asked for: someone else's value, not a broken one.
var ErrForeign = errors.New("foreign")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// headerLen is the size of the header of key and lay.
func headerLen(key string, lay layout.Layout) int {
	return fixedBytes + len(key) + 8*len(lay.Shape) + len(lay.Dtype)
}

// newValue returns a value buffer for n payload bytes with the header of
// key and lay written, and the payload part of it; seal finishes it once the
// payload is in place. The buffer is spare when spare can hold it (every
// byte of it is then the caller's to overwrite: the header is written here,
// the payload and the checksum by the caller), else a new one.
func newValue(key string, lay layout.Layout, n int, spare []byte) (v, payload []byte, err error) {
	if err := headerFits(key, lay); err != nil {
		return nil, nil, err
	}
	h := headerLen(key, lay)
	if cap(spare) >= h+n {
		v = spare[:h+n]
	} else {
		v = make([]byte, h+n)
	}
	appendHeader(v[:0], key, lay, n)
	return v, v[h:], nil
}

// newHeader returns the header of the value of key and lay whose payload is
// payload, checksum included, for a backend that writes the two parts from
// where they lie (PartsPutter). The checksum pass yields between slices,
// and calls pace (when not nil) before each.
func newHeader(key string, lay layout.Layout, payload []byte, pace func()) ([]byte, error) {
	if err := headerFits(key, lay); err != nil {
		return nil, err
	}
	h := headerLen(key, lay)
	b := appendHeader(make([]byte, 0, h), key, lay, len(payload))[:h]
	c := crc32.Checksum(b[:h-4], castagnoli)
	for off := 0; off < len(payload); off += yieldSlice {
		if pace != nil {
			pace()
		}
		c = crc32.Update(c, castagnoli, payload[off:min(off+yieldSlice, len(payload))])
		runtime.Gosched()
	}
	binary.LittleEndian.PutUint32(b[h-4:], c)
	return b, nil
}

func headerFits(key string, lay layout.Layout) error {
	if len(key) > maxKeyLen || len(lay.Shape) > maxDims || len(lay.Dtype) > maxDtype {
		return fmt.Errorf("tier: header of key %d bytes, %d dims, dtype %d bytes: too large", len(key), len(lay.Shape), len(lay.Dtype))
	}
	return nil
}

// appendHeader appends the header of key and lay for n payload bytes, up to
// the checksum slot (which it leaves out: len grows by headerLen-4).
func appendHeader(b []byte, key string, lay layout.Layout, n int) []byte {
	b = append(b, magic...)
	b = binary.LittleEndian.AppendUint16(b, Version)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(key)))
	b = append(b, key...)
	b = appendLayout(b, lay)
	return binary.LittleEndian.AppendUint64(b, uint64(n))
}

// appendLayout appends the header's encoding of lay: dims u8, dims × i64,
// dtype length u8, dtype. Fingerprint hashes them after the format version.
func appendLayout(b []byte, lay layout.Layout) []byte {
	b = append(b, byte(len(lay.Shape)))
	for _, d := range lay.Shape {
		b = binary.LittleEndian.AppendUint64(b, uint64(int64(d)))
	}
	b = append(b, byte(len(lay.Dtype)))
	return append(b, lay.Dtype...)
}

// seal writes the checksum of a value built by newValue whose header is h
// bytes long (Encode's; the writers take theirs while copying, sealSum).
func seal(v []byte, h int) {
	sealSum(v, h, PayloadSum(HeadSum(v[:h]), v[h:]))
}

// sealSum writes sum, the checksum of v's header (up to the checksum's
// place) and payload taken with HeadSum and PayloadSum, into v, a value
// built by newValue whose header is h bytes long.
func sealSum(v []byte, h int, sum uint32) {
	binary.LittleEndian.PutUint32(v[h-4:h], sum)
}

// Encode returns the tier value of payload stored under key with layout lay.
func Encode(key string, lay layout.Layout, payload []byte) ([]byte, error) {
	v, dst, err := newValue(key, lay, len(payload), nil)
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
//
// An intact value whose header names another key or layout also wraps
// ErrForeign: it was written on purpose by a host whose layout fingerprint
// collides with ours (or forged), so it is not ours to delete. Everything
// else rejected (not a kvdock value, another format version, cut short, too
// long, checksum failed) is damage under our key: the key carries the
// format version and our layout's fingerprint, so no other host writes there.
func Verify(v []byte, key string, lay layout.Layout) ([]byte, error) {
	h, err := checkHeader(v)
	if err != nil {
		return nil, err
	}
	if err := VerifyParts(v[:h.end], v[h.end:], key, lay); err != nil {
		return nil, err
	}
	return v[h.end:], nil
}

// VerifyParts is Verify of a value held in two parts: head, exactly its
// header, and payload, the rest (a backend that read the payload straight
// into its place, see ReaderInto). The checks and their errors are Verify's.
func VerifyParts(head, payload []byte, key string, lay layout.Layout) error {
	if len(head) < 4 {
		return fmt.Errorf("%w: header of %d bytes", ErrCorrupt, len(head))
	}
	return VerifySummed(head, int64(len(payload)), crc32.Update(HeadSum(head), castagnoli, payload), key, lay)
}

// HeadSum starts the checksum of a value whose header is head (of the
// length headerLen gives): the payload's bytes are added to it with
// crc32.Update and the Castagnoli table (PayloadSum), piece by piece as
// they arrive, for VerifySummed.
func HeadSum(head []byte) uint32 {
	if len(head) < 4 {
		return 0
	}
	return crc32.Checksum(head[:len(head)-4], castagnoli)
}

// PayloadSum adds piece, the next bytes of a payload, to sum (HeadSum's).
func PayloadSum(sum uint32, piece []byte) uint32 { return crc32.Update(sum, castagnoli, piece) }

// VerifySummed is VerifyParts for a payload of n bytes whose checksum was
// taken while it was read (HeadSum, then PayloadSum over every byte in
// order): the payload is not read again. The checks and errors are
// VerifyParts'.
func VerifySummed(head []byte, n int64, sum uint32, key string, lay layout.Layout) error {
	h, err := checkHeader(head)
	if err != nil {
		return err
	}
	if h.end != len(head) {
		return fmt.Errorf("%w: header of %d bytes, %d given", ErrCorrupt, h.end, len(head))
	}
	if want := binary.LittleEndian.Uint64(head[h.end-12:]); uint64(n) != want {
		return fmt.Errorf("%w: payload of %d bytes, header says %d", ErrCorrupt, n, want)
	}
	want := binary.LittleEndian.Uint32(head[h.end-4 : h.end])
	if sum != want {
		return fmt.Errorf("%w: checksum %08x, header says %08x", ErrCorrupt, sum, want)
	}
	// Intact: now whose is it?
	if string(h.key) != key {
		return fmt.Errorf("%w: %w: stored under another key", ErrCorrupt, ErrForeign)
	}
	if len(h.shape) != 8*len(lay.Shape) {
		return fmt.Errorf("%w: %w: layout has %d dims, want %s", ErrCorrupt, ErrForeign, len(h.shape)/8, lay)
	}
	for i, d := range lay.Shape {
		if int64(binary.LittleEndian.Uint64(h.shape[8*i:])) != int64(d) {
			return fmt.Errorf("%w: %w: layout shape differs from %s", ErrCorrupt, ErrForeign, lay)
		}
	}
	if string(h.dtype) != lay.Dtype {
		return fmt.Errorf("%w: %w: dtype differs from %s", ErrCorrupt, ErrForeign, lay.Dtype)
	}
	if n != lay.Bytes {
		return fmt.Errorf("%w: %w: payload of %d bytes, layout needs %d", ErrCorrupt, ErrForeign, n, lay.Bytes)
	}
	return nil
}

// checkHeader checks magic and version and parses the header of v.
func checkHeader(v []byte) (header, error) {
	if len(v) < len(magic)+2 || string(v[:len(magic)]) != magic {
		return header{}, fmt.Errorf("%w: not a kvdock tier value", ErrCorrupt)
	}
	if ver := binary.LittleEndian.Uint16(v[4:6]); ver != Version {
		return header{}, fmt.Errorf("%w: format version %d, want %d", ErrCorrupt, ver, Version)
	}
	h, err := parseHeader(v)
	if err != nil {
		return h, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return h, nil
}

// HeaderLen is the length of the header of a value stored under key with
// layout lay: a ReaderInto reads that many bytes before the payload.
func HeaderLen(key string, lay layout.Layout) int { return headerLen(key, lay) }

// header is a parsed value header; its slices are parts of the value.
type header struct {
	key   []byte
	shape []byte // dims × i64
	dtype []byte
	end   int // offset of the payload: the header's length
}

// errShort is a damaged value's error when its header runs past its end.
type errShort int

func (n errShort) Error() string { return fmt.Sprintf("%d bytes, shorter than its header", int(n)) }

// parseHeader reads the header of v, whose magic and version are checked,
// within the same bounds newValue writes.
func parseHeader(v []byte) (header, error) {
	var h header
	short := errShort(len(v))
	p := len(magic) + 2
	if len(v) < p+4 {
		return h, short
	}
	kl := binary.LittleEndian.Uint32(v[p:])
	p += 4
	if kl > maxKeyLen {
		return h, fmt.Errorf("key of %d bytes, at most %d", kl, maxKeyLen)
	}
	if len(v) < p+int(kl)+1 {
		return h, short
	}
	h.key = v[p : p+int(kl)]
	p += int(kl)
	dims := int(v[p])
	p++
	if dims > maxDims {
		return h, fmt.Errorf("%d dims, at most %d", dims, maxDims)
	}
	if len(v) < p+8*dims+1 {
		return h, short
	}
	h.shape = v[p : p+8*dims]
	p += 8 * dims
	dl := int(v[p])
	p++
	if dl > maxDtype {
		return h, fmt.Errorf("dtype of %d bytes, at most %d", dl, maxDtype)
	}
	if len(v) < p+dl+8+4 {
		return h, short
	}
	h.dtype = v[p : p+dl]
	h.end = p + dl + 8 + 4
	return h, nil
}
