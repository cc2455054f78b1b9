package keys

import "fmt"

// Hash is one chunk's chained BLAKE3 digest.
type Hash [32]byte

// ObjectKey names one stored object: one chunk of one model for one KV rank
// and one KV group, optionally isolated by a cache salt. Group is upstream's
// object_group_id: a hybrid-attention model stores one object per chunk per
// group, each of its group's layout, and two groups never share a key. Group
// 0 is the only group of every other model. Layout is the ID of the
// layouts the chunk is stored with (layout.ID), so workers of one model
// with other layouts never share a key; 0 is a key built without one.
type ObjectKey struct {
	Chunk  Hash
	Model  string
	KVRank uint32
	Group  uint32
	Salt   string
	Layout uint64
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
// group (when not 0), layout ID (when not 0) and salt.
func (k ObjectKey) String() string {
	s := fmt.Sprintf("%x@%s@%08x", k.Chunk[:8], k.Model, k.KVRank)
	if k.Group != 0 {
		s += fmt.Sprintf("/g%d", k.Group)
	}
	if k.Layout != 0 {
		s += fmt.Sprintf("/l%016x", k.Layout)
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
	layout    uint64
	// layouts and layoutGroups, when set, replace layout and groups: the
	// keys of every registered layout of the model (WithLayouts).
	layouts      []uint64
	layoutGroups []int
}

// WithLayout returns the set with its keys naming layout ID id
// (ObjectKey.Layout).
func (k KeySet) WithLayout(id uint64) KeySet {
	k.layout = id
	return k
}

// WithLayouts returns the set expanded over several layouts of the model,
// ids[i] with groups[i] KV groups (the slices are kept, not copied): each
// chunk has the keys of ids[0] (group-major, rank-minor, as WithGroups),
// then of ids[1], …, so a chunk counts as present only when every layout
// holds it. With no ids the set is unchanged.
func (k KeySet) WithLayouts(ids []uint64, groups []int) KeySet {
	if len(ids) == 0 || len(groups) != len(ids) {
		return k
	}
	k.layouts, k.layoutGroups = ids, groups
	return k
}

// WithGroups returns the set expanded over n KV groups (a hybrid model's
// object groups): each chunk then has its keys of group 0, then group 1, …,
// each rank-minor, so a chunk counts as present only when every group is.
// n < 1 counts as 1.
func (k KeySet) WithGroups(n int) KeySet {
	k.groups = max(n, 1)
	return k
}

// groupCount is the group objects per chunk and rank, over every layout.
func (k KeySet) groupCount() int {
	if len(k.layouts) == 0 {
		return max(k.groups, 1)
	}
	n := 0
	for _, g := range k.layoutGroups {
		n += max(g, 1)
	}
	return n
}

// Groups is the number of objects each chunk's keys cover per rank: its
// KV groups, summed over the layouts of WithLayouts (at least 1).
func (k KeySet) Groups() int { return k.groupCount() }

// Model and WorldSize name whose keys the set holds.
func (k KeySet) Model() string { return k.model }

// WorldSize is the world size the set's ranks are packed with.
func (k KeySet) WorldSize() int { return k.worldSize }

// Chunks is the number of chunks in the set.
func (k KeySet) Chunks() int { return len(k.hashes) }

// PerChunk is the number of keys per chunk: per KV group (and layout), 1
// for one worker's rank, the world size for every rank.
func (k KeySet) PerChunk() int {
	if k.worker >= 0 {
		return k.groupCount()
	}
	return k.worldSize * k.groupCount()
}

// Len is the number of keys in the set, Chunks × PerChunk.
func (k KeySet) Len() int { return len(k.hashes) * k.PerChunk() }

// Append appends the keys of chunks [from, to) to dst, chunk-major, then
// layout, then group, then rank-minor (with one group and layout: as
// ObjectKeys orders them); the range is clamped to the set.
func (k KeySet) Append(dst []ObjectKey, from, to int) []ObjectKey {
	from, to = max(from, 0), min(to, len(k.hashes))
	if from >= to {
		return dst
	}
	var worker *int
	if k.worker >= 0 {
		worker = &k.worker
	}
	if len(k.layouts) == 0 && max(k.groups, 1) == 1 {
		n := len(dst)
		dst = AppendObjectKeys(dst, k.hashes[from:to], k.model, k.worldSize, worker, k.salt)
		setLayout(dst[n:], k.layout)
		return dst
	}
	ids, groups := k.layouts, k.layoutGroups
	if len(ids) == 0 {
		ids, groups = []uint64{k.layout}, []int{k.groups}
	}
	for i := from; i < to; i++ {
		for l, id := range ids {
			for grp := range max(groups[l], 1) {
				n := len(dst)
				dst = AppendObjectKeys(dst, k.hashes[i:i+1], k.model, k.worldSize, worker, k.salt)
				for j := n; j < len(dst); j++ {
					dst[j].Group, dst[j].Layout = uint32(grp), id
				}
			}
		}
	}
	return dst
}

func setLayout(ks []ObjectKey, id uint64) {
	if id == 0 {
		return
	}
	for j := range ks {
		ks[j].Layout = id
	}
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
