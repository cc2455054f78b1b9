// Package keys turns the token ids a worker sends into the names of stored KV
// chunks. It owns three things: the chained BLAKE3 chunk hash (Hasher), the
// per-request sessions that cache those hashes while a prompt grows
// (Sessions), and the expansion of chunk hashes into per-rank ObjectKeys
// (KeySet, walked a batch at a time so that a long prompt over many ranks is
// never materialised whole). Everything a request makes it hold is bounded:
// tokens per request, id and name lengths, sessions in number and bytes.
//
// Hashes never leave the server (the wire carries token ids and counts only),
// so the scheme only has to be internally consistent; it follows LMCache's
// token_hasher.py so that the numbers line up with a Python server that runs
// without vLLM installed.
package keys

import (
	"encoding/binary"
	"fmt"

	"github.com/zeebo/blake3"
)

// AlgorithmBLAKE3 is the only supported --hash-algorithm.
const AlgorithmBLAKE3 = "blake3"

// NoneHash is the chain's initial prefix: BLAKE3 of 8 zero bytes followed by
// 4 zero bytes (12 zero bytes). It is what Python LMCache computes as the hash
// of (0, (0,), None) when vLLM is not importable: the integer prefix 0 packed
// as an 8-byte big-endian value, then the single token 0 as a big-endian
// uint32. (With vLLM present Python uses vLLM's none hash, which may be random
// per process; kvdock fixes this value so hashes are stable across restarts.)
func NoneHash() Hash {
	var zero [12]byte
	return blake3.Sum256(zero[:])
}

// Hasher computes chained chunk hashes for one chunk size.
// It is stateless and safe for concurrent use.
type Hasher struct {
	chunkSize int
	none      Hash
}

// NewHasher returns a Hasher for chunkSize tokens per chunk. Only the
// "blake3" algorithm is supported; vLLM's "builtin" and "sha256_cbor" are not.
func NewHasher(chunkSize int, algorithm string) (*Hasher, error) {
	if chunkSize <= 0 {
		return nil, fmt.Errorf("keys: chunk size %d: must be positive", chunkSize)
	}
	if algorithm != AlgorithmBLAKE3 {
		return nil, fmt.Errorf("keys: hash algorithm %q: only %q is supported", algorithm, AlgorithmBLAKE3)
	}
	return &Hasher{chunkSize: chunkSize, none: NoneHash()}, nil
}

// ChunkSize returns the number of tokens per chunk.
func (h *Hasher) ChunkSize() int { return h.chunkSize }

// FullChunks returns how many complete chunks n tokens make.
func (h *Hasher) FullChunks(n int) int { return n / h.chunkSize }

// Hashes returns one digest per complete chunk of tokens; trailing tokens that
// do not fill a chunk are ignored. Chunk i's digest is
// BLAKE3(digest(i-1) || tokens[i*cs:(i+1)*cs] as big-endian uint32), with
// NoneHash standing in for digest(-1).
func (h *Hasher) Hashes(tokens []uint32) []Hash {
	return h.extend(nil, tokens)
}

// extend appends the digests of the chunks of tokens not yet covered by
// prev, which must hold the digests of the leading len(prev) chunks.
func (h *Hasher) extend(prev []Hash, tokens []uint32) []Hash {
	cs := h.chunkSize
	n := len(tokens) / cs
	if n <= len(prev) {
		return prev
	}
	out := prev
	if cap(out) < n {
		out = make([]Hash, len(prev), n)
		copy(out, prev)
	}
	last := h.none
	if len(prev) > 0 {
		last = prev[len(prev)-1]
	}
	buf := make([]byte, len(last)+4*cs)
	for i := len(prev); i < n; i++ {
		copy(buf, last[:])
		putBE32(buf[len(last):], tokens[i*cs:(i+1)*cs])
		last = blake3.Sum256(buf)
		out = append(out, last)
	}
	return out
}

// HashesAfter returns the digests of the complete chunks of tokens chained
// after prev, the digest of the chunk before them (NoneHash for a prompt's
// first): what Hashes gives for those chunks within the whole prompt.
func (h *Hasher) HashesAfter(prev Hash, tokens []uint32) []Hash {
	cs := h.chunkSize
	out := make([]Hash, 0, len(tokens)/cs)
	buf := make([]byte, len(prev)+4*cs)
	for i := range len(tokens) / cs {
		copy(buf, prev[:])
		putBE32(buf[len(prev):], tokens[i*cs:(i+1)*cs])
		prev = blake3.Sum256(buf)
		out = append(out, prev)
	}
	return out
}

// putBE32 packs src into dst as big-endian uint32s, two tokens per 64-bit
// store (the packing is a visible share of a chunk's cost otherwise).
func putBE32(dst []byte, src []uint32) {
	dst = dst[:4*len(src)]
	for len(src) >= 2 && len(dst) >= 8 {
		binary.BigEndian.PutUint64(dst, uint64(src[0])<<32|uint64(src[1]))
		src, dst = src[2:], dst[8:]
	}
	if len(src) == 1 && len(dst) >= 4 {
		binary.BigEndian.PutUint32(dst, src[0])
	}
}
