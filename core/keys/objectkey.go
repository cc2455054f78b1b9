package keys

import "fmt"

// Hash is one chunk's chained BLAKE3 digest.
type Hash [32]byte

// ObjectKey names one stored object: one chunk of one model for one KV rank
// and one KV group, optionally isolated by a cache salt. Group is upstream's
// object_group_id: a hybrid-attention model stores one object per chunk per
// group, each of its group's layout, and two groups never share a key. Group
// 0 is the only group of every other model.
type ObjectKey struct {
	Chunk  Hash
	Model  string
	KVRank uint32
	Group  uint32
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

// String renders the key for logs: a short digest prefix, model, rank,
// group (when not 0) and salt.
func (k ObjectKey) String() string {
	s := fmt.Sprintf("%x@%s@%08x", k.Chunk[:8], k.Model, k.KVRank)
	if k.Group != 0 {
		s += fmt.Sprintf("/g%d", k.Group)
	}
	if k.Salt != "" {
		s += "@" + k.Salt
	}
	return s
}

// InGroup returns a copy of ks with every key moved to group g.
func InGroup(ks []ObjectKey, g uint32) []ObjectKey {
	out := make([]ObjectKey, len(ks))
	for i, k := range ks {
		k.Group = g
		out[i] = k
	}
	return out
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
	groups    int // KV groups per chunk; 0 counts as 1
}

// WithGroups returns the set expanded over n KV groups (a hybrid model's
// object groups): each chunk then has its keys of group 0, then group 1, …,
// each rank-minor, so a chunk counts as present only when every group is.
// n < 1 counts as 1.
func (k KeySet) WithGroups(n int) KeySet {
	k.groups = max(n, 1)
	return k
}

func (k KeySet) groupCount() int { return max(k.groups, 1) }

// Groups is the number of KV groups each chunk's keys cover (at least 1).
func (k KeySet) Groups() int { return k.groupCount() }

// Model and WorldSize name whose keys the set holds.
func (k KeySet) Model() string { return k.model }

// WorldSize is the world size the set's ranks are packed with.
func (k KeySet) WorldSize() int { return k.worldSize }

// Chunks is the number of chunks in the set.
func (k KeySet) Chunks() int { return len(k.hashes) }

// PerChunk is the number of keys per chunk: per KV group, 1 for one
// worker's rank, the world size for every rank.
func (k KeySet) PerChunk() int {
	if k.worker >= 0 {
		return k.groupCount()
	}
	return k.worldSize * k.groupCount()
}

// Len is the number of keys in the set, Chunks × PerChunk.
func (k KeySet) Len() int { return len(k.hashes) * k.PerChunk() }

// Append appends the keys of chunks [from, to) to dst, chunk-major, then
// group, then rank-minor (with one group: as ObjectKeys orders them); the
// range is clamped to the set.
func (k KeySet) Append(dst []ObjectKey, from, to int) []ObjectKey {
	from, to = max(from, 0), min(to, len(k.hashes))
	if from >= to {
		return dst
	}
	var worker *int
	if k.worker >= 0 {
		worker = &k.worker
	}
	g := k.groupCount()
	if g == 1 {
		return AppendObjectKeys(dst, k.hashes[from:to], k.model, k.worldSize, worker, k.salt)
	}
	for i := from; i < to; i++ {
		for grp := range g {
			n := len(dst)
			dst = AppendObjectKeys(dst, k.hashes[i:i+1], k.model, k.worldSize, worker, k.salt)
			for j := n; j < len(dst); j++ {
				dst[j].Group = uint32(grp)
			}
		}
	}
	return dst
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
