// Package chunks makes the tests' chunk fixtures: object keys numbered by
// an index, deterministic payload bytes and a checked layout, so the
// packages that store chunks build them one way.
package chunks

import (
	"encoding/binary"
	"testing"

	"kvdock/core/keys"
	"kvdock/core/layout"
)

// Key is chunk i of model "m", rank 0 of 1: its hash holds i little-endian.
func Key(i int) keys.ObjectKey {
	var h keys.Hash
	binary.LittleEndian.PutUint64(h[:], uint64(i))
	return keys.ObjectKey{Chunk: h, Model: "m", KVRank: keys.KVRank(1, 0)}
}

// Keys returns Key(i) for i in [from, to).
func Keys(from, to int) []keys.ObjectKey {
	var ks []keys.ObjectKey
	for i := from; i < to; i++ {
		ks = append(ks, Key(i))
	}
	return ks
}

// Tagged is chunk i of model, rank 0 of 1: its hash holds i in the first
// two bytes and tag in the last, so keys of different tests never collide.
func Tagged(i int, model string, tag byte) keys.ObjectKey {
	var h keys.Hash
	h[0], h[1], h[31] = byte(i), byte(i>>8), tag
	return keys.ObjectKey{Chunk: h, Model: model, KVRank: keys.KVRank(1, 0)}
}

// Payload returns n bytes that differ with seed: byte i is i*mul + seed*step + add.
func Payload(n, seed, mul, step, add int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*mul + seed*step + add)
	}
	return b
}

// Layout returns layout.New's layout for the arguments and fails t when
// they are refused.
func Layout(t testing.TB, layers, chunkTokens, hidden int, dtype string) layout.Layout {
	t.Helper()
	l, err := layout.New(layers, chunkTokens, hidden, dtype, false)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
