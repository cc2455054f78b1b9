package tier

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// MaxHeaderLen bounds the header of any value this format accepts: a
// reader that checks a stored value's header never needs more of it.
const MaxHeaderLen = fixedBytes + maxKeyLen + 8*maxDims + maxDtype

// ErrHeadShort is returned by StoredKey when head ends inside the header
// while the value goes on: the caller reads more of it (up to MaxHeaderLen
// bytes) and asks again.
var ErrHeadShort = errors.New("tier: header continues past the bytes given")

// StoredKey checks head, the first bytes of a stored value that is size
// bytes long, without its payload: the magic, version and header bounds,
// and that the header's payload length makes the value exactly size bytes.
// It returns the key the header names (a part of head). The checksum is not
// checked (that needs the payload): a value that passes may still be
// rejected by Verify when it is loaded. Any other mismatch wraps ErrCorrupt.
func StoredKey(head []byte, size int64) ([]byte, error) {
	if int64(len(head)) > size {
		return nil, fmt.Errorf("%w: %d header bytes given for a value of %d", ErrCorrupt, len(head), size)
	}
	h, err := checkHeader(head)
	if err != nil {
		var short errShort
		if errors.As(err, &short) && int64(len(head)) < size && len(head) < MaxHeaderLen {
			return nil, ErrHeadShort
		}
		return nil, err
	}
	n := binary.LittleEndian.Uint64(head[h.end-12:])
	if n > uint64(size) || uint64(h.end)+n != uint64(size) {
		return nil, fmt.Errorf("%w: header of %d bytes and payload of %d in a value of %d", ErrCorrupt, h.end, n, size)
	}
	return h.key, nil
}
