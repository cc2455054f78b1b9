// Package layout describes the shape of one KV chunk as a worker registers it
// (dtype, layers, tokens per chunk, hidden size, MLA or not) and keeps the
// ref-counted registry of layouts per (model, world size) and layout ID that
// LOOKUP consults.
package layout

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// dtypeSizes maps the torch dtype names workers send (without "torch.") to
// their element size in bytes.
var dtypeSizes = map[string]int{
	"float16":       2,
	"bfloat16":      2,
	"float32":       4,
	"float64":       8,
	"float8_e4m3fn": 1,
	"float8_e5m2":   1,
	"int8":          1,
	"uint8":         1,
	"int16":         2,
	"int32":         4,
	"int64":         8,
	"bool":          1,
}

// DtypeSize returns the element size of a torch dtype name, and false for a
// name kvdock does not know.
func DtypeSize(name string) (int, bool) {
	n, ok := dtypeSizes[name]
	return n, ok
}

// DtypeNames lists the accepted dtype names, sorted, for error messages.
func DtypeNames() []string {
	names := make([]string, 0, len(dtypeSizes))
	for n := range dtypeSizes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Layout is one chunk's tensor: shape [2, layers, chunk, hidden] or, with MLA,
// [layers, chunk, hidden], of one dtype.
type Layout struct {
	Shape []int
	Dtype string
	// Bytes is prod(Shape) × element size: the exact tensor size.
	Bytes int64
}

// MaxChunkBytes bounds one chunk object. A realistic chunk at the default 256
// tokens is far below it (Llama-3.1-405B in bf16: 126 layers × 2 × 256 × 1024
// × 2 B = 126 MiB; an MHA 70B model in fp16: 640 MiB), it equals the default
// server.max_message_bytes (a larger chunk could not travel by pickle), and a
// single larger object would take a whole default 1 GiB pool.
const MaxChunkBytes = 1 << 30

// maxShown bounds how much of a peer's string an error quotes.
const maxShown = 64

// quoteBounded quotes s, cut to maxShown bytes with its full length noted, so
// an error about a huge value stays small.
func quoteBounded(s string) string {
	if len(s) <= maxShown {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q… (%d bytes)", s[:maxShown], len(s))
}

// New validates a registration's figures and builds the chunk layout. The
// chunk size is computed without overflow and must not exceed MaxChunkBytes.
func New(numLayers, chunkTokens, hidden int, dtype string, mla bool) (Layout, error) {
	var bad []string
	if numLayers <= 0 {
		bad = append(bad, fmt.Sprintf("num_layers = %d: must be > 0", numLayers))
	}
	if chunkTokens <= 0 {
		bad = append(bad, fmt.Sprintf("chunk size = %d: must be > 0", chunkTokens))
	}
	if hidden <= 0 {
		bad = append(bad, fmt.Sprintf("hidden_dim_size = %d: must be > 0", hidden))
	}
	size, ok := dtypeSizes[dtype]
	if !ok {
		bad = append(bad, fmt.Sprintf("dtype_str = %s: must be one of %s", quoteBounded(dtype), strings.Join(DtypeNames(), ", ")))
	}
	if len(bad) > 0 {
		return Layout{}, fmt.Errorf("invalid KV layout: %s", strings.Join(bad, "; "))
	}
	shape := []int{2, numLayers, chunkTokens, hidden}
	if mla {
		shape = shape[1:]
	}
	// Every factor is positive; a product that overflows 64 bits or passes the
	// cap is refused before it can wrap (2^30 layers × 2^24 hidden once gave 0).
	n := uint64(size)
	for _, d := range shape {
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > MaxChunkBytes {
			return Layout{}, fmt.Errorf(
				"invalid KV layout: num_layers = %d, chunk size = %d, hidden_dim_size = %d, dtype_str = %s, use_mla = %v: "+
					"a chunk of shape %v would exceed %d bytes (1 GiB)",
				numLayers, chunkTokens, hidden, dtype, mla, shape, MaxChunkBytes)
		}
		n = lo
	}
	return Layout{Shape: shape, Dtype: dtype, Bytes: int64(n)}, nil
}

// MaxGroups bounds the KV groups one registration may declare. Hybrid
// models have a handful (an attention group and one or two recurrent or
// sliding-window groups); every group costs an object per chunk per rank.
const MaxGroups = 16

// Group describes one KV group of a hybrid-attention model as the worker
// registers it (upstream's GroupLayoutInfo).
type Group struct {
	BlockSize      int
	NumLayers      int
	HiddenDimSize  int
	DtypeStr       string
	UseMLA         bool
	TokensPerBlock int // 0 or less: BlockSize
}

// NewGroup validates one group and builds its chunk layout. Upstream's
// worker and server both size a group's chunk as the whole number of the
// group's blocks that fit in the server chunk: (chunkTokens / tokens per
// block) × tokens per block, which must be at least one block.
func NewGroup(g Group, chunkTokens int) (Layout, error) {
	tpb := g.TokensPerBlock
	if tpb <= 0 {
		tpb = g.BlockSize
	}
	if tpb <= 0 {
		return Layout{}, fmt.Errorf("invalid KV group: block_size = %d and tokens_per_block = %d: one must be > 0", g.BlockSize, g.TokensPerBlock)
	}
	if chunkTokens > 0 && tpb > chunkTokens {
		return Layout{}, fmt.Errorf("invalid KV group: %d tokens per block is more than the %d-token chunk", tpb, chunkTokens)
	}
	tokens := chunkTokens
	if chunkTokens > 0 {
		tokens = chunkTokens / tpb * tpb
	}
	return New(g.NumLayers, tokens, g.HiddenDimSize, g.DtypeStr, g.UseMLA)
}

// GroupsEqual reports whether two group lists describe the same tensors, in order.
func GroupsEqual(a, b []Layout) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

// Equal reports whether two layouts describe the same tensor.
func (l Layout) Equal(o Layout) bool {
	if l.Dtype != o.Dtype || len(l.Shape) != len(o.Shape) {
		return false
	}
	for i := range l.Shape {
		if l.Shape[i] != o.Shape[i] {
			return false
		}
	}
	return true
}

// String renders the layout as "[2 32 256 1024] bfloat16".
func (l Layout) String() string { return fmt.Sprintf("%v %s", l.Shape, l.Dtype) }

type regKey struct {
	model string
	world int
}

type regEntry struct {
	id     uint64
	groups []Layout // one per KV group; a plain model has one
	refs   int
}

// ID names a model's layouts (every KV group's, in order) in its object
// keys (keys.ObjectKey.Layout), so the chunks of two layouts of one model
// never share a key. It is the first 8 bytes of the SHA-256 of the groups'
// shapes and dtypes: stable across processes and hosts (a kept pool and a
// shared tier mean the same layout by it), and a peer cannot pick a layout
// whose ID is another's without a 2^64 search. It is never 0, the ID of
// keys built without a layout.
func ID(groups []Layout) uint64 {
	h := sha256.New()
	var b []byte
	for _, l := range groups {
		b = binary.LittleEndian.AppendUint32(b[:0], uint32(len(l.Shape)))
		for _, d := range l.Shape {
			b = binary.LittleEndian.AppendUint64(b, uint64(d))
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(l.Dtype)))
		b = append(b, l.Dtype...)
		h.Write(b)
	}
	id := binary.LittleEndian.Uint64(h.Sum(nil))
	return max(id, 1)
}

// ErrIDCollision refuses layouts whose ID is another registered layout's
// of the same model (a SHA-256 prefix collision): their keys would meet.
var ErrIDCollision = errors.New("layout id collides with another layout of the model")

// Registry ref-counts layouts per (model, world size): each registered
// layout (one per KV group; a plain model has one group) is its own entry,
// under its ID, so workers of one model with other layouts register side
// by side. LOOKUPs, which name no layout, answer for all of them
// (Registered); First, Get, Groups and GroupCount name the model's first
// registered layout still registered.
type Registry struct {
	mu      sync.RWMutex
	entries map[regKey][]*regEntry // in registration order
	// maxBytes is the largest registered layout's Bytes, kept current on
	// every change so readers (one per wire message) never scan entries.
	maxBytes atomic.Int64
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{entries: make(map[regKey][]*regEntry)}
}

// Add references the layout of (model, worldSize), a one-group model.
func (r *Registry) Add(model string, worldSize int, l Layout) error {
	_, err := r.AddGroups(model, worldSize, []Layout{l})
	return err
}

// AddGroups references the per-group layouts of (model, worldSize) and
// returns their ID; groups must not be empty. Other layouts registered
// for the model are kept; only an ID collision is refused.
func (r *Registry) AddGroups(model string, worldSize int, groups []Layout) (uint64, error) {
	if len(groups) == 0 {
		return 0, errors.New("layout: no groups")
	}
	id := ID(groups)
	r.mu.Lock()
	defer r.mu.Unlock()
	k := regKey{model, worldSize}
	for _, e := range r.entries[k] {
		if e.id == id {
			if !GroupsEqual(e.groups, groups) {
				return 0, fmt.Errorf("%w: %016x", ErrIDCollision, id)
			}
			e.refs++
			return id, nil
		}
	}
	r.entries[k] = append(r.entries[k], &regEntry{id: id, groups: cloneGroups(groups), refs: 1})
	for _, l := range groups {
		if l.Bytes > r.maxBytes.Load() {
			r.maxBytes.Store(l.Bytes)
		}
	}
	return id, nil
}

func cloneGroups(gs []Layout) []Layout {
	out := make([]Layout, len(gs))
	for i, l := range gs {
		out[i] = Layout{Shape: append([]int(nil), l.Shape...), Dtype: l.Dtype, Bytes: l.Bytes}
	}
	return out
}

func (e *regEntry) maxBytes() int64 {
	var m int64
	for _, l := range e.groups {
		m = max(m, l.Bytes)
	}
	return m
}

// Remove drops one reference of layout id of (model, worldSize); the entry
// goes when the last one does.
func (r *Registry) Remove(model string, worldSize int, id uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := regKey{model, worldSize}
	es := r.entries[k]
	i := slices.IndexFunc(es, func(e *regEntry) bool { return e.id == id })
	if i < 0 {
		return
	}
	e := es[i]
	if e.refs--; e.refs > 0 {
		return
	}
	if es = slices.Delete(es, i, i+1); len(es) == 0 {
		delete(r.entries, k)
	} else {
		r.entries[k] = es
	}
	if e.maxBytes() >= r.maxBytes.Load() {
		var m int64
		for _, list := range r.entries {
			for _, o := range list {
				m = max(m, o.maxBytes())
			}
		}
		r.maxBytes.Store(m)
	}
}

// MaxBytes is the largest registered layout's chunk bytes, 0 when none.
func (r *Registry) MaxBytes() int64 { return r.maxBytes.Load() }

// firstLocked is the entry LOOKUPs of (model, worldSize) answer for; r.mu
// is held.
func (r *Registry) firstLocked(model string, worldSize int) *regEntry {
	if es := r.entries[regKey{model, worldSize}]; len(es) > 0 {
		return es[0]
	}
	return nil
}

// First returns the ID and group count of the first registered layout of
// (model, worldSize) still registered; groups is 0 when none is.
func (r *Registry) First(model string, worldSize int) (id uint64, groups int) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if e := r.firstLocked(model, worldSize); e != nil {
		return e.id, len(e.groups)
	}
	return 0, 0
}

// Registered returns the IDs and KV group counts of every layout
// registered for (model, worldSize), in registration order; none when none
// is. A LOOKUP, which names no layout, answers for all of them: a chunk
// hits only when each layout holds it, so every worker of the model can
// retrieve what it was told is there.
func (r *Registry) Registered(model string, worldSize int) (ids []uint64, groups []int) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, e := range r.entries[regKey{model, worldSize}] {
		ids = append(ids, e.id)
		groups = append(groups, len(e.groups))
	}
	return ids, groups
}

// Get returns the first layout of (model, worldSize), of group 0 for a
// hybrid model.
func (r *Registry) Get(model string, worldSize int) (Layout, bool) {
	return r.GroupLayout(model, worldSize, 0)
}

// GroupLayout returns the layout of KV group g of the first layout of
// (model, worldSize).
func (r *Registry) GroupLayout(model string, worldSize int, g uint32) (Layout, bool) {
	id, n := r.First(model, worldSize)
	if n == 0 {
		return Layout{}, false
	}
	return r.LayoutOf(model, worldSize, id, g)
}

// LayoutOf returns the layout of KV group g of the layouts registered as id
// for (model, worldSize): the layout a key naming id was stored with.
func (r *Registry) LayoutOf(model string, worldSize int, id uint64, g uint32) (Layout, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, e := range r.entries[regKey{model, worldSize}] {
		if e.id == id {
			if uint64(g) >= uint64(len(e.groups)) {
				return Layout{}, false
			}
			return e.groups[g], true
		}
	}
	return Layout{}, false
}

// Groups returns the per-group layouts of the first layout of (model,
// worldSize).
func (r *Registry) Groups(model string, worldSize int) ([]Layout, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if e := r.firstLocked(model, worldSize); e != nil {
		return cloneGroups(e.groups), true
	}
	return nil, false
}

// GroupCount returns how many KV groups the first layout of (model,
// worldSize) has, 0 when none is registered.
func (r *Registry) GroupCount(model string, worldSize int) int {
	_, n := r.First(model, worldSize)
	return n
}

// Has reports whether any worker registered (model, worldSize).
func (r *Registry) Has(model string, worldSize int) bool {
	return r.GroupCount(model, worldSize) > 0
}

// Clear forgets every layout (a pool rebuild drops all contexts).
func (r *Registry) Clear() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.entries)
	r.maxBytes.Store(0)
}
