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

// KeySet names the ObjectKeys of a run of chunks, for one rank or for every
// rank, without materialising them. A scheduler key expands to chunks ×
// world size keys (2 Mi tokens over 255 ranks: two million keys, ~150 MiB),
// so callers walk the set a batch of chunks at a time with Append and stop
// when they have what they need; the set itself holds only the chunk digests.
// The digests are never modified once a KeySet refers to them.
type KeySet struct {
	hashes    []Hash
	model     string
	salt      string
	worldSize int
	worker    int // -1: every rank
}

// Chunks is the number of chunks in the set.
func (k KeySet) Chunks() int { return len(k.hashes) }

// PerChunk is the number of keys per chunk: 1 for one worker's rank, the
// world size for every rank.
func (k KeySet) PerChunk() int {
	if k.worker >= 0 {
		return 1
	}
	return k.worldSize
}

// Len is the number of keys in the set, Chunks × PerChunk.
func (k KeySet) Len() int { return len(k.hashes) * k.PerChunk() }

// Append appends the keys of chunks [from, to) to dst, chunk-major and
// rank-minor, as ObjectKeys orders them; the range is clamped to the set.
func (k KeySet) Append(dst []ObjectKey, from, to int) []ObjectKey {
	from, to = max(from, 0), min(to, len(k.hashes))
	if from >= to {
		return dst
	}
	var worker *int
	if k.worker >= 0 {
		worker = &k.worker
	}
	return AppendObjectKeys(dst, k.hashes[from:to], k.model, k.worldSize, worker, k.salt)
}

// All materialises every key of the set; for sets known to be small.
func (k KeySet) All() []ObjectKey { return k.Append(nil, 0, len(k.hashes)) }

func newKeySet(hashes []Hash, model string, worldSize int, worker *int, salt string) KeySet {
	w := -1
	if worker != nil {
		w = *worker
	}
	return KeySet{hashes: hashes, model: model, salt: salt, worldSize: worldSize, worker: w}
}
