package protocol_test

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"testing"

	"kvdock/core/protocol"
)

// TestTokensMixedEncodings: token arrays of every length up to a few
// hundred, each element in a random encoding (positive fixint, uint8/16/32,
// and now and then a signed or 64-bit int that only the general path
// takes), decode to the same values; any truncation of them is refused
// without a panic (the fast path against the general one).
func TestTokensMixedEncodings(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	codes := []byte{0, 0xcc, 0xcd, 0xce}
	for trial := range 400 {
		n := r.IntN(300)
		want := make([]uint32, n)
		var raw bytes.Buffer
		switch {
		case n < 16:
			raw.WriteByte(0x90 | byte(n))
		default:
			raw.Write([]byte{0xdc, byte(n >> 8), byte(n)})
		}
		for i := range want {
			code := codes[r.IntN(len(codes))]
			if trial%7 == 0 && r.IntN(50) == 0 {
				code = []byte{0xd2, 0xcf, 0xd3}[r.IntN(3)] // signed / 64-bit: general path
			}
			var v uint32
			switch code {
			case 0:
				v = uint32(r.IntN(128))
			case 0xcc:
				v = uint32(r.IntN(256))
			case 0xcd:
				v = uint32(r.IntN(1 << 16))
			case 0xd2:
				v = uint32(r.IntN(1 << 31))
			default:
				v = r.Uint32()
			}
			want[i] = v
			if code == 0xcf || code == 0xd3 {
				b := make([]byte, 9)
				b[0] = code
				for j := range 8 {
					b[8-j] = byte(uint64(v) >> (8 * j))
				}
				raw.Write(b)
				continue
			}
			raw.Write(encodeIntAs(code, int64(v)))
		}
		frame := keyWithTokens(raw.Bytes())
		v, err := protocol.DecodeValue(protocol.TypeKey, frame)
		if err != nil {
			t.Fatalf("trial %d (%d tokens): %v", trial, n, err)
		}
		if got := v.(protocol.Key).TokenIDs; !reflect.DeepEqual(got, want) && !(n == 0 && len(got) == 0) {
			t.Fatalf("trial %d (%d tokens): decoded differently", trial, n)
		}
		// Cut the frame inside the token array: refused, never a panic.
		start := bytes.Index(frame, raw.Bytes())
		if n > 0 {
			cut := start + 1 + r.IntN(raw.Len()-1)
			if _, err := protocol.DecodeValue(protocol.TypeKey, frame[:cut]); err == nil {
				t.Fatalf("trial %d: frame cut at %d of %d accepted", trial, cut, len(frame))
			}
		}
	}
}
