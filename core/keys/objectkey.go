package keys

import "fmt"

// Hash is one chunk's chained BLAKE3 digest.
type Hash [32]byte

// ObjectKey names one stored object: one chunk of one model for one KV rank,
// optionally isolated by a cache salt.
type ObjectKey struct {
	Chunk  Hash
	Model  string
	KVRank uint32
	Salt   string
}

// KVRank packs a (worldSize, worker) pair as (ws<<24)|(w<<16)|(ws<<8)|w,
// the upstream layout that keeps the tensor-parallel and pipeline halves equal
// for plain TP.
func KVRank(worldSize, worker int) uint32 {
	ws := uint32(worldSize) & 0xff
	w := uint32(worker) & 0xff
	return ws<<24 | w<<16 | ws<<8 | w
}

// String renders the key for logs: a short digest prefix, model, rank and salt.
func (k ObjectKey) String() string {
	if k.Salt == "" {
		return fmt.Sprintf("%x@%s@%08x", k.Chunk[:8], k.Model, k.KVRank)
	}
	return fmt.Sprintf("%x@%s@%08x@%s", k.Chunk[:8], k.Model, k.KVRank, k.Salt)
}

// ObjectKeys expands chunk hashes into ObjectKeys, chunk-major and rank-minor:
// for each hash, one key per rank. A nil worker expands every rank
// 0..worldSize-1 (scheduler-side keys); otherwise only that worker's rank.
func ObjectKeys(hashes []Hash, model string, worldSize int, worker *int, salt string) []ObjectKey {
	return AppendObjectKeys(nil, hashes, model, worldSize, worker, salt)
}

// AppendObjectKeys is ObjectKeys appending to dst, for callers that reuse a slice.
func AppendObjectKeys(dst []ObjectKey, hashes []Hash, model string, worldSize int, worker *int, salt string) []ObjectKey {
	if worker != nil {
		rank := KVRank(worldSize, *worker)
		dst = grow(dst, len(hashes))
		for _, h := range hashes {
			dst = append(dst, ObjectKey{Chunk: h, Model: model, KVRank: rank, Salt: salt})
		}
		return dst
	}
	if worldSize <= 0 {
		return dst
	}
	dst = grow(dst, len(hashes)*worldSize)
	for _, h := range hashes {
		for w := range worldSize {
			dst = append(dst, ObjectKey{Chunk: h, Model: model, KVRank: KVRank(worldSize, w), Salt: salt})
		}
	}
	return dst
}

func grow(dst []ObjectKey, n int) []ObjectKey {
	if cap(dst)-len(dst) < n {
		nd := make([]ObjectKey, len(dst), len(dst)+n)
		copy(nd, dst)
		return nd
	}
	return dst
}
