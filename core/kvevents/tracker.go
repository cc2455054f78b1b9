// Package kvevents keeps what kvdock announces to cache-aware routers
// (llm-d's indexer, Dynamo's KV router, vLLM's subscriber) in vLLM's KV event
// stream: the announced set of each medium (the L1 pool's, and each L2
// tier's), the batches that change them and the bounded replay buffer of
// published batches; and, fed by the same announced sets, the bounded log
// LMCache's vLLM connector polls (POLL_KV_EVENTS, log.go).
//
// The announced set is the usable set: a chunk is announced once every object
// of it (every rank, every KV group, every layout registered for its model)
// is committed, a layout of its model is registered and its parent chunk is
// announced — exactly when LOOKUP would count it as a hit. A chunk whose
// parent is not announced is held back and announced when the parent returns;
// a chunk that stops being usable is removed with its announced descendants.
// So a router never sees a child before its parent, and a removal names only
// an announced hash, once.
//
// It learns from three sources: the pool's observer (Stored, Lost, Cleared,
// called under the pool's mutex, in the pool's order), the transfer
// module's commits (Commit), which carry what the pool does not know: the
// tokens of each chunk, its parent and its prompt's world size, and the
// layout registry LOOKUP answers from (Registered): when the last worker of
// a model unregisters, LOOKUP answers 0 for its prompts while their objects
// stay in the pool, so its chunks are removed; when a worker registers the
// layout again they count again, and are announced again, parents first. A
// commit only marks objects the observer reported stored and not yet lost, so
// a commit that arrives after an eviction of its objects announces nothing.
// A tier's medium learns from the tier (Tiers.Stored, Tiers.Lost: a value
// it came to hold or dropped, in the tier's own order) and takes each
// chunk's tokens, parent and world size from the chunk a commit described
// (the L1 chunk written behind) or a restart carried (restore.go).
//
// The data path only queues what it tells (ops.go): the calls are applied
// in their order after the request that made them was answered, by the
// publisher before each flush or by anything that reads the sets.
package kvevents

import (
	"bytes"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"kvdock/core/keys"
)

// Medium names of vLLM's events.
const (
	MediumCPU     = "CPU"
	MediumStorage = "STORAGE"
)

// DefaultBufferSteps is how many published batches the replay buffer keeps.
const DefaultBufferSteps = 10000

// DefaultMaxQueued bounds the chunk records waiting for the publisher (one
// per chunk announced or block removed, about a hundred bytes each); past it
// new ones are dropped and counted, so a stalled publisher costs bounded
// memory and never blocks the data path.
const DefaultMaxQueued = 1 << 16

// Options configures a Tracker.
type Options struct {
	// Medium is the medium of the pool's announcements ("CPU").
	Medium string
	// BlockSize is the chunk size in tokens.
	BlockSize int
	// EventBlockSize, when it is not 0 or BlockSize (and divides it), has
	// each chunk announced as BlockSize/EventBlockSize chained blocks, each
	// named as a server with that chunk size names it (the same BLAKE3
	// chain over EventBlockSize tokens), for routers whose block size is
	// smaller. A block shared by two announced chunks (same parent, same
	// leading tokens) is removed when the last of them goes.
	EventBlockSize int
	// Array selects the positional encoding of events (older consumers);
	// false is vLLM's tagged map form.
	Array bool
	// BufferSteps is the replay buffer's size in batches.
	BufferSteps int
	// MaxQueued bounds the chunk records waiting to be published.
	MaxQueued int
	// DataParallelRank is the batch's last field.
	DataParallelRank int
	Now              func() time.Time
	// Log, when set, receives every chunk entering or leaving the
	// announced set (LMCache's poll channel, log.go).
	Log *Log
	// NoStream keeps the announced set for Log alone: no event is queued
	// for a publisher (there is none).
	NoStream bool
}

// Commit is one committed batch of a store: the chunks [Start, End) of one
// request's prompt for one rank and group, as the transfer module resolved
// them.
type Commit struct {
	Model, Salt string
	// WorldSize is the world size of the store's keys: each layout
	// registered for (Model, WorldSize) makes a chunk whole with
	// WorldSize objects per KV group.
	WorldSize int
	// Parent is the hash of the chunk before Hashes[0]; HasParent is false
	// for a prompt's first chunk.
	Parent    keys.Hash
	HasParent bool
	// Hashes are the chunk hashes of the store, in prompt order.
	Hashes []keys.Hash
	// Tokens are the store's tokens: chunk i holds
	// Tokens[i*chunk:(i+1)*chunk].
	Tokens []uint32
	// Keys are the objects the commit published (a subset of the store's,
	// each naming one of Hashes).
	Keys []keys.ObjectKey
}

// Event is one event of a batch: a BlockStored (Stored true) or a
// BlockRemoved.
type Event struct {
	Stored    bool
	Medium    string
	Hashes    []uint64
	Parent    uint64
	HasParent bool
	// Tokens are the tokens of Hashes' blocks, run after run: each run is
	// a chunk's (or the new blocks' of one), shared with the tracker's
	// node, so that building an event copies no token.
	Tokens [][]uint32
}

// rec is what the data path queues for the publisher: one chunk's blocks
// new to the wire (stored) or one block leaving it. It holds references
// only (the model and medium names, the node's tokens and split blocks,
// which are never written once set), so queueing one copies nothing and,
// once the queue's two slices have grown, allocates nothing; Flush merges
// the records into events and encodes them on the publisher's goroutine.
type rec struct {
	model, medium     string
	stored, hasParent bool
	parent            uint64
	h                 uint64      // the block, when blocks is nil
	blocks            []keys.Hash // stored and split: the chunk's blocks new to the wire
	tokens            []uint32    // stored: the tokens of those blocks
}

// last is the wire hash of r's last block.
func (r *rec) last() uint64 {
	if len(r.blocks) > 0 {
		return WireHash(r.blocks[len(r.blocks)-1])
	}
	return r.h
}

// Stats are the tracker's counters.
type Stats struct {
	Announced     int    // chunks announced now, over every medium
	Held          int    // chunks whole but held back for a missing parent, over every medium
	Batches       uint64 // batches published
	StoredEvents  uint64 // hashes announced
	RemovedEvents uint64 // hashes removed
	Dropped       uint64 // events dropped because the queue was full
	Queued        int    // chunk records waiting for the publisher or in a flush not yet numbered
	Buffered      int    // batches in the replay buffer
	BufferedBytes int    // their payloads' bytes (at most MaxBufferBytes)
	BufferTrimmed uint64 // batches the buffer let go, oldest first, past its count or bytes
	NextSeq       uint64
}

type ekey struct {
	model, salt string
	h           keys.Hash
}

type wkey struct {
	model string
	h     uint64
}

type obj struct {
	rank, group uint32
	layout      uint64
	committed   bool
	tiers       int // tiers of the medium holding it (a tier's medium only)
}

type node struct {
	objs      []obj
	subs      []keys.Hash // the chunk's blocks, while announced (split only)
	ws        int         // the world size of its prompt's keys; 0 until a commit described it
	parent    keys.Hash
	hasParent bool
	tokens    []uint32
	announced bool
}

// Layouts are the layouts registered for one (model, world size), as
// layout.Registry.Registered lists them: IDs[i] with Groups[i] KV groups.
type Layouts struct {
	IDs    []uint64
	Groups []int
}

func (l Layouts) equal(o Layouts) bool {
	return slices.Equal(l.IDs, o.IDs) && slices.Equal(l.Groups, o.Groups)
}

type regKey struct {
	model string
	ws    int
}

// whole: n is described and, as LOOKUP counts it, some layout of its
// model and world size is registered and every registered layout has
// every rank of every KV group committed (objects are told once each per
// rank, group and layout, so counting them is enough).
func (t *Tracker) whole(model string, n *node) bool {
	if n.ws == 0 {
		return false
	}
	reg, ok := t.layouts(model, n.ws)
	if !ok {
		return false
	}
	for i, id := range reg.IDs {
		groups := uint32(max(reg.Groups[i], 1))
		c := 0
		for _, o := range n.objs {
			if o.committed && o.layout == id && o.group < groups {
				c++
			}
		}
		if c < n.ws*int(groups) {
			return false
		}
	}
	return true
}

// layouts are the layouts registered for (model, ws). The last answer is
// kept: the ops of a flush are mostly of one model, and whole asks it
// several times a chunk. Registered forgets it.
func (t *Tracker) layouts(model string, ws int) (Layouts, bool) {
	if c := &t.lastReg; c.valid && c.ws == ws && c.model == model {
		return c.l, c.ok
	}
	l, ok := t.regs[regKey{model, ws}]
	t.lastReg = lastLayouts{valid: true, model: model, ws: ws, l: l, ok: ok}
	return l, ok
}

// lastLayouts is the last answer of layouts.
type lastLayouts struct {
	valid, ok bool
	model     string
	ws        int
	l         Layouts
}

// medium is one medium's announced set: the L1 pool's, or one shared by
// the tiers of one medium name.
type medium struct {
	name            string
	nodes           map[ekey]*node
	byModel         map[string]map[ekey]*node // nodes, by model (Registered visits one model's)
	kids            map[ekey][]keys.Hash      // children whose parent is the key, resident or not
	wire            map[wkey]int              // announced chunks per wire hash (salts share one)
	announced, held int
}

func newMedium(name string) *medium {
	return &medium{name: name, nodes: map[ekey]*node{}, byModel: map[string]map[ekey]*node{},
		kids: map[ekey][]keys.Hash{}, wire: map[wkey]int{}}
}

// add makes n the node of ek.
func (m *medium) add(ek ekey, n *node) {
	m.nodes[ek] = n
	bm := m.byModel[ek.model]
	if bm == nil {
		bm = map[ekey]*node{}
		m.byModel[ek.model] = bm
	}
	bm[ek] = n
}

// Tracker keeps the announced sets and the batches to publish. Its methods
// are safe for concurrent use and never block on the publisher; the data
// path's calls (Stored, Lost, Cleared, Commit, Loaded, the Tiers') take only a
// queue's mutex, unless the queue is past its bounds.
type Tracker struct {
	opt Options

	// ops are the data path's calls waiting to be applied (ops.go); a
	// Hold keeps those after it waiting while a restart re-announces.
	ops    opQueue
	unheld *sync.Cond // on mu: signalled by Release
	// lastStats is what Stats last answered, for a Stats that finds the
	// tracker held and busy.
	lastStats atomic.Pointer[Stats]

	mu    sync.Mutex
	l1    *medium
	tiers []*medium // cur's media
	cur   *Tiers    // the tiers behind the pool now
	// pend are the records waiting for the publisher, in the order the
	// data path queued them; spare is the slice the last Flush emptied,
	// handed back for the next records.
	pend, spare []rec
	// flushing are the records a Flush took and has not numbered yet:
	// counted as queued, so that Queued 0 means every event is in a
	// numbered batch (a router at NextSeq has them all).
	flushing int
	st       Stats
	split    *keys.Hasher // EventBlockSize's hasher; nil when chunks are announced whole
	buf      fifo[Batch]  // the replay ring: BufferSteps batches, MaxBufferBytes of payloads
	bufBytes int          // the payloads' bytes in buf
	wake     chan struct{}
	// fl is Flush's scratch, reused from flush to flush; flushMu
	// serializes Flush (the publisher's alone) so that it can be.
	flushMu sync.Mutex
	fl      flushScratch
	// regs are the layouts registered per (model, world size), as the
	// layout registry told them (Registered); absent when none is.
	regs    map[regKey]Layouts
	lastReg lastLayouts // layouts' last answer
	// carried are the descriptions a restart carried of the chunks of
	// the tiers' objects (Reannounce), for the tiers' media as the tiers
	// tell they still hold them; dropped with the tier set.
	carried map[ekey]described
}

// Batch is one published batch.
type Batch struct {
	Seq     uint64
	Model   string
	Events  int
	Payload []byte
}

// New returns a Tracker.
func New(opt Options) *Tracker {
	if opt.Medium == "" {
		opt.Medium = MediumCPU
	}
	if opt.BufferSteps <= 0 {
		opt.BufferSteps = DefaultBufferSteps
	}
	if opt.MaxQueued <= 0 {
		opt.MaxQueued = DefaultMaxQueued
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	t := &Tracker{opt: opt, l1: newMedium(opt.Medium), wake: make(chan struct{}, 1), regs: map[regKey]Layouts{},
		fl: flushScratch{byModel: map[string]int{}, last: -1}}
	t.unheld = sync.NewCond(&t.mu)
	if n := opt.EventBlockSize; n > 0 && n != opt.BlockSize && opt.BlockSize%n == 0 {
		t.split, _ = keys.NewHasher(n, keys.AlgorithmBLAKE3) // n > 0: cannot fail
	} else {
		t.opt.EventBlockSize = opt.BlockSize
	}
	if opt.Log != nil {
		opt.Log.mu.Lock()
		opt.Log.sync, opt.Log.peek = t.Sync, t.SyncUnlessHeld
		opt.Log.mu.Unlock()
	}
	return t
}

// Wake is signalled when events wait to be published.
func (t *Tracker) Wake() <-chan struct{} { return t.wake }

// WireHash is the integer a router sees for a chunk hash: its last 8 bytes,
// big-endian (vLLM's and llm-d's rule for byte hashes).
func WireHash(h keys.Hash) uint64 { return binary.BigEndian.Uint64(h[24:]) }

func keyOf(k *keys.ObjectKey) ekey { return ekey{model: k.Model, salt: k.Salt, h: k.Chunk} }

// Stored notes an object the pool took in (write-locked, not yet usable).
func (t *Tracker) Stored(k *keys.ObjectKey) {
	if keys.IsBenchModel(k.Model) {
		return
	}
	t.push(op{kind: opStored, k: *k}, 0)
}

func (t *Tracker) storedLocked(k *keys.ObjectKey) {
	m, ek := t.l1, keyOf(k)
	n := m.nodes[ek]
	if n == nil {
		n = &node{}
		m.add(ek, n)
	}
	if n.find(k) >= 0 {
		// The pool reports every object lost before it stores its key
		// again; should it not, the old object is taken as lost.
		t.lostLocked(m, ek, n, k)
		t.storedLocked(k)
		return
	}
	n.objs = append(n.objs, obj{rank: k.KVRank, group: k.Group, layout: k.Layout})
}

// Lost notes an object that left the pool (or never entered it): its chunk
// stops being usable, and is removed with its announced descendants.
func (t *Tracker) Lost(k *keys.ObjectKey) {
	if keys.IsBenchModel(k.Model) {
		return
	}
	t.push(op{kind: opLost, k: *k}, 0)
}

func (t *Tracker) lostLocked(m *medium, ek ekey, n *node, k *keys.ObjectKey) {
	was := t.whole(ek.model, n)
	if i := n.find(k); i >= 0 {
		n.objs = append(n.objs[:i], n.objs[i+1:]...)
	}
	t.rewhole(m, ek, n, was)
	if len(n.objs) == 0 {
		m.drop(ek, n)
	}
}

// rewhole accounts for a change of n, whole before it (was): a chunk that
// became whole is held until tryAnnounce announces it; one that stopped
// being whole is removed with its announced descendants.
func (t *Tracker) rewhole(m *medium, ek ekey, n *node, was bool) {
	switch now := t.whole(ek.model, n); {
	case was && !now:
		if n.announced {
			t.unannounce(m, ek)
		}
		m.held-- // unannounce counted it held: it is not whole
	case !was && now:
		m.held++ // until tryAnnounce announces it
	}
}

// Registered tells the tracker the layouts registered now for (model,
// worldSize), as the layout registry LOOKUP answers from lists them (none
// when the last worker of it went: unregistered, reaped, removed, its id
// reused). LOOKUP counts a chunk only for registered layouts, so in every
// medium the model's chunks that stop counting are removed with their
// announced descendants, and those that count again are announced again,
// parents first. The call is queued as the data path's are (ops.go):
// applied in order, off the caller's path, which a restart's restore of
// the registrations is on.
func (t *Tracker) Registered(model string, worldSize int, l Layouts) {
	if keys.IsBenchModel(model) || len(l.Groups) != len(l.IDs) {
		return
	}
	r := &registration{model: model, ws: worldSize, l: Layouts{IDs: slices.Clone(l.IDs), Groups: slices.Clone(l.Groups)}}
	t.push(op{kind: opRegistered, r: r}, 0)
}

// registration is a queued Registered.
type registration struct {
	model string
	ws    int
	l     Layouts
}

// registeredLocked applies Registered; t.mu is held.
func (t *Tracker) registeredLocked(r *registration) {
	model, l := r.model, r.l
	rk := regKey{model, r.ws}
	if old, ok := t.regs[rk]; ok == (len(l.IDs) > 0) && old.equal(l) {
		return
	}
	media := t.media()
	was := make([]map[ekey]bool, len(media))
	for i, m := range media {
		was[i] = make(map[ekey]bool, len(m.byModel[model]))
		for ek, n := range m.byModel[model] {
			was[i][ek] = t.whole(model, n)
		}
	}
	t.lastReg = lastLayouts{}
	if len(l.IDs) == 0 {
		delete(t.regs, rk)
	} else {
		t.regs[rk] = l
	}
	for i, m := range media {
		for ek, n := range m.byModel[model] {
			t.rewhole(m, ek, n, was[i][ek])
		}
	}
	for _, m := range media {
		for ek := range m.byModel[model] {
			t.tryAnnounce(m, ek)
		}
	}
}

// media are the L1 medium and each distinct tier medium; t.mu is held.
func (t *Tracker) media() []*medium {
	out := []*medium{t.l1}
	for _, m := range t.tiers {
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// Tiers is the tracker's side of one set of L2 tiers (SetTiers): what
// they tell of their values goes to their media until the set is replaced.
type Tiers struct {
	t       *Tracker
	media   []*medium
	retired bool // replaced: what the old set still tells is ignored
}

// SetTiers gives the tiers now behind the pool their media, in tier order
// ("" is MediumStorage; tiers of one name share one announced set, where a
// chunk is held while any of them holds it). The media of the tiers it
// replaces are removed whole (their chunks are no longer looked up); the new
// tiers' values written before are not announced.
func (t *Tracker) SetTiers(media []string) *Tiers {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.applyLocked()
	if t.cur != nil {
		t.carried = nil // of the objects of the tiers replaced
		t.cur.retired = true
		for i, m := range t.cur.media {
			if !slices.Contains(t.cur.media[:i], m) {
				t.removeAll(m)
			}
		}
	}
	v := &Tiers{t: t}
	byName := map[string]*medium{}
	for _, name := range media {
		if name == "" {
			name = MediumStorage
		}
		if byName[name] == nil {
			byName[name] = newMedium(name)
		}
		v.media = append(v.media, byName[name])
	}
	t.cur, t.tiers = v, v.media
	return v
}

// removeAll removes every chunk announced in m and forgets m's chunks.
func (t *Tracker) removeAll(m *medium) {
	for ek, n := range m.nodes {
		if n.announced {
			n.announced = false
			t.logWithdrawn(m, ek)
			t.unwire(m, ek)
		}
	}
	m.nodes = map[ekey]*node{}
	m.byModel = map[string]map[ekey]*node{}
	m.kids = map[ekey][]keys.Hash{}
	m.announced, m.held = 0, 0
}

// medium is tier i's medium, nil once the set is replaced; t.mu is held.
func (v *Tiers) medium(i int) *medium {
	if v == nil || v.retired || i < 0 || i >= len(v.media) {
		return nil
	}
	return v.media[i]
}

// Stored notes that tier i holds k's value now (its write behind landed,
// or the tier still holds a value a restart carried for it). The object
// counts for the tier's medium from then on; its chunk's tokens, parent
// and world size come from the chunk a commit described (in L1, in
// another medium) or from the description the restart carried, so a value
// of a chunk never described (an earlier run's the restart did not carry)
// is not announced.
func (v *Tiers) Stored(i int, k *keys.ObjectKey) {
	if v == nil || keys.IsBenchModel(k.Model) {
		return
	}
	v.t.push(op{kind: opTierStored, k: *k, v: v, i: i}, 0)
}

// storedLocked applies Stored; t.mu is held.
func (v *Tiers) storedLocked(i int, k *keys.ObjectKey) {
	v.onMedium(i, k, func(t *Tracker, m *medium, ek ekey) {
		n := m.nodes[ek]
		if n == nil {
			d, ok := t.description(ek)
			if !ok {
				return
			}
			n = &node{}
			m.add(ek, n)
			m.describe(ek, n, d.ws, d.parent, d.hasParent, d.tokens)
		}
		if j := n.find(k); j >= 0 {
			n.objs[j].tiers++ // another tier of this medium holds it too
			return
		}
		was := t.whole(ek.model, n)
		n.objs = append(n.objs, obj{rank: k.KVRank, group: k.Group, layout: k.Layout, committed: true, tiers: 1})
		t.rewhole(m, ek, n, was)
		t.tryAnnounce(m, ek)
	})
}

// description is what a commit or the restart told of ek's chunk, from
// the first medium that holds it described, else from what the restart
// carried; t.mu is held.
func (t *Tracker) description(ek ekey) (described, bool) {
	for _, m := range t.media() {
		if n := m.nodes[ek]; n != nil && n.ws > 0 {
			return described{ws: n.ws, parent: n.parent, hasParent: n.hasParent, tokens: n.tokens}, true
		}
	}
	d, ok := t.carried[ek]
	return d, ok
}

// Lost notes that tier i no longer holds k's value (evicted, deleted,
// cleared, expired, found gone): when no tier of its medium holds it, its
// chunk is removed there with its announced descendants.
func (v *Tiers) Lost(i int, k *keys.ObjectKey) {
	if v == nil || keys.IsBenchModel(k.Model) {
		return
	}
	v.t.push(op{kind: opTierLost, k: *k, v: v, i: i}, 0)
}

// lostLocked applies Lost; t.mu is held.
func (v *Tiers) lostLocked(i int, k *keys.ObjectKey) {
	v.onMedium(i, k, func(t *Tracker, m *medium, ek ekey) {
		n := m.nodes[ek]
		if n == nil {
			return
		}
		if j := n.find(k); j >= 0 {
			if n.objs[j].tiers--; n.objs[j].tiers == 0 {
				t.lostLocked(m, ek, n, k)
			}
		}
	})
}

// onMedium runs f on tier i's medium and k's chunk, unless the set was
// replaced (by the time the op is applied, as when it was made: the ops
// before the SetTiers that replaced it were applied before it) or i is no
// tier of it; t.mu is held.
func (v *Tiers) onMedium(i int, k *keys.ObjectKey, f func(t *Tracker, m *medium, ek ekey)) {
	if m := v.medium(i); m != nil {
		f(v.t, m, keyOf(k))
	}
}

// find is the index in n.objs of k's object (its rank, group and layout),
// -1 if none.
func (n *node) find(k *keys.ObjectKey) int {
	return slices.IndexFunc(n.objs, func(o obj) bool {
		return o.rank == k.KVRank && o.group == k.Group && o.layout == k.Layout
	})
}

// Loaded notes objects a prefetch loaded from a tier and published in L1:
// they are committed there like a store's, with their chunk's tokens,
// parent and world size taken from the tier's medium that held it (or
// what a restart carried of it).
func (t *Tracker) Loaded(ks []keys.ObjectKey) {
	if len(ks) > 0 {
		t.push(op{kind: opLoaded, ks: slices.Clone(ks)}, 0)
	}
}

// loadedLocked applies Loaded; t.mu is held.
func (t *Tracker) loadedLocked(ks []keys.ObjectKey) {
	m := t.l1
	for i := range ks {
		k := &ks[i]
		ek := keyOf(k)
		n := m.nodes[ek]
		if keys.IsBenchModel(k.Model) || n == nil {
			continue // lost before it was told
		}
		if n.ws == 0 {
			if d, ok := t.description(ek); ok {
				m.describe(ek, n, d.ws, d.parent, d.hasParent, d.tokens)
			}
		}
		was := t.whole(ek.model, n)
		if j := n.find(k); j >= 0 {
			n.objs[j].committed = true
		}
		t.rewhole(m, ek, n, was)
		t.tryAnnounce(m, ek)
	}
}

// Cleared notes a Clear of the pool: every object went, so every chunk
// announced for the L1 medium is removed (as BlockRemoved events, never
// AllBlocksCleared, which llm-d takes as a wipe of every medium of the
// pod). The tiers' media stay as they are. Queued like the observer's
// other calls, so that it is applied after the stores made before it.
func (t *Tracker) Cleared() { t.push(op{kind: opCleared}, 0) }

// Commit notes a committed store batch, announcing every chunk it made
// usable and every held-back descendant that was waiting for one of them.
//
// The tracker takes c's Hashes and Keys (the caller no longer uses them)
// and copies its Tokens.
func (t *Tracker) Commit(c Commit) {
	if keys.IsBenchModel(c.Model) || len(c.Keys) == 0 || c.WorldSize <= 0 {
		return
	}
	t.pushCommit(c)
}

// commitLocked applies Commit; t.mu is held.
func (t *Tracker) commitLocked(c *Commit) {
	bs := t.opt.BlockSize
	m := t.l1
	touched := make([]bool, len(c.Hashes))
	at := 0 // where the last key's chunk was: the keys follow the prompt's order
	for ki := range c.Keys {
		k := &c.Keys[ki]
		i := indexFrom(c.Hashes, at, k.Chunk)
		if i < 0 || (i+1)*bs > len(c.Tokens) {
			continue
		}
		at = i
		ek := keyOf(k)
		n := m.nodes[ek]
		if n == nil {
			continue // lost before its commit was told: nothing to announce
		}
		j := n.find(k)
		if j < 0 {
			continue
		}
		was := t.whole(ek.model, n)
		n.objs[j].committed = true
		if n.ws == 0 {
			parent, hasParent := c.Parent, c.HasParent
			if i > 0 {
				parent, hasParent = c.Hashes[i-1], true
			}
			// A run of the commit's own copy: never written after.
			m.describe(ek, n, c.WorldSize, parent, hasParent, c.Tokens[i*bs:(i+1)*bs:(i+1)*bs])
		}
		t.rewhole(m, ek, n, was)
		touched[i] = true
	}
	// In prompt order, so that a batch announces parents before children.
	for i, ok := range touched {
		if ok {
			t.tryAnnounce(m, ekey{model: c.Model, salt: c.Salt, h: c.Hashes[i]})
		}
	}
}

// indexFrom is the index of h in hs, looked for from hs[from] on and then
// before it; -1 when hs does not hold it.
func indexFrom(hs []keys.Hash, from int, h keys.Hash) int {
	if i := slices.Index(hs[from:], h); i >= 0 {
		return from + i
	}
	return slices.Index(hs[:from], h)
}

// describe gives n, the node of ek, what a commit tells of its chunk: its
// prompt's world size, its parent and its tokens (never changed after:
// tokens is shared by every medium's node of the chunk).
func (m *medium) describe(ek ekey, n *node, ws int, parent keys.Hash, hasParent bool, tokens []uint32) {
	n.ws, n.parent, n.hasParent, n.tokens = ws, parent, hasParent, tokens
	if hasParent {
		pk := ekey{model: ek.model, salt: ek.salt, h: parent}
		m.kids[pk] = append(m.kids[pk], ek.h)
	}
}

// usable: whole, and its parent announced in m (or none).
func (t *Tracker) usable(m *medium, n *node, ek ekey) bool {
	if !t.whole(ek.model, n) {
		return false
	}
	if !n.hasParent {
		return true
	}
	p := m.nodes[ekey{model: ek.model, salt: ek.salt, h: n.parent}]
	return p != nil && p.announced
}

// tryAnnounce announces ek in m if it became usable, then every held-back
// descendant that became usable with it, parents before children.
func (t *Tracker) tryAnnounce(m *medium, ek ekey) {
	stack := []ekey{ek}
	for len(stack) > 0 {
		e := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		n := m.nodes[e]
		if n == nil || n.announced || !t.usable(m, n, e) {
			continue
		}
		n.announced = true
		m.announced++
		m.held--
		t.logAnnounced(m, e, n)
		t.wireUp(m, e, n)
		for _, c := range m.kids[e] {
			stack = append(stack, ekey{model: e.model, salt: e.salt, h: c})
		}
	}
}

// unannounce removes ek and its announced descendants from m.
func (t *Tracker) unannounce(m *medium, ek ekey) {
	stack := []ekey{ek}
	for len(stack) > 0 {
		e := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		n := m.nodes[e]
		if n == nil || !n.announced {
			continue
		}
		n.announced = false
		m.announced--
		m.held++ // whole still; lostLocked corrects the chunk that was not
		t.logWithdrawn(m, e)
		t.unwire(m, e)
		for _, c := range m.kids[e] {
			stack = append(stack, ekey{model: e.model, salt: e.salt, h: c})
		}
	}
}

// splitBlocks are the announced blocks of chunk e in m (split only), and
// the block before its first (hasParent false for a prompt's first): its
// split blocks chained after the parent chunk's last block.
func (t *Tracker) splitBlocks(m *medium, e ekey, n *node) (bs []keys.Hash, parent keys.Hash, hasParent bool) {
	var pn *node
	if n.hasParent {
		pn = m.nodes[ekey{model: e.model, salt: e.salt, h: n.parent}]
	}
	if n.subs == nil {
		prev := keys.NoneHash()
		if pn != nil && len(pn.subs) > 0 {
			prev = pn.subs[len(pn.subs)-1]
		}
		n.subs = t.split.HashesAfter(prev, n.tokens)
	}
	if pn != nil && len(pn.subs) > 0 {
		return n.subs, pn.subs[len(pn.subs)-1], true
	}
	return n.subs, keys.Hash{}, false
}

// wireUp counts e's blocks announced in m and queues the ones new to the
// router: a suffix of the chunk's blocks, since a block shared with
// another announced chunk has its leading blocks shared too. A chunk
// announced whole (the default) costs two map operations and one append.
func (t *Tracker) wireUp(m *medium, e ekey, n *node) {
	if t.opt.NoStream {
		return
	}
	if t.split == nil {
		w := wkey{model: e.model, h: WireHash(e.h)}
		if m.wire[w]++; m.wire[w] > 1 {
			return
		}
		t.st.StoredEvents++
		t.queue(rec{model: e.model, medium: m.name, stored: true, h: w.h, parent: WireHash(n.parent),
			hasParent: n.hasParent, tokens: n.tokens})
		return
	}
	bs, parent, hasParent := t.splitBlocks(m, e, n)
	first := len(bs)
	for i, b := range bs {
		w := wkey{model: e.model, h: WireHash(b)}
		m.wire[w]++
		if m.wire[w] == 1 && first == len(bs) {
			first = i
		}
	}
	if first == len(bs) {
		return
	}
	if first > 0 {
		parent, hasParent = bs[first-1], true
	}
	t.st.StoredEvents += uint64(len(bs) - first)
	t.queue(rec{model: e.model, medium: m.name, stored: true, blocks: bs[first:], parent: WireHash(parent),
		hasParent: hasParent, tokens: n.tokens[first*t.opt.EventBlockSize:]})
}

// unwire drops one announcement in m of each of e's blocks and queues the
// removal of those no announced chunk holds any more.
func (t *Tracker) unwire(m *medium, e ekey) {
	if t.opt.NoStream {
		return
	}
	if n := m.nodes[e]; t.split != nil && n != nil {
		bs := n.subs
		n.subs = nil // recomputed at the next announcement: the parent may change
		for _, b := range bs {
			t.unwireBlock(m, wkey{model: e.model, h: WireHash(b)})
		}
		return
	}
	t.unwireBlock(m, wkey{model: e.model, h: WireHash(e.h)})
}

// unwireBlock drops one announcement of block w in m, queueing its
// removal when it was the last.
func (t *Tracker) unwireBlock(m *medium, w wkey) {
	if m.wire[w]--; m.wire[w] > 0 {
		return
	}
	delete(m.wire, w)
	t.st.RemovedEvents++
	t.queue(rec{model: w.model, medium: m.name, h: w.h})
}

// drop forgets a node none of whose objects is resident; its children stay
// listed under it, waiting for it to return.
func (m *medium) drop(ek ekey, n *node) {
	delete(m.nodes, ek)
	if bm := m.byModel[ek.model]; bm != nil {
		if delete(bm, ek); len(bm) == 0 {
			delete(m.byModel, ek.model)
		}
	}
	if n.ws == 0 || !n.hasParent {
		return
	}
	pk := ekey{model: ek.model, salt: ek.salt, h: n.parent}
	ks := m.kids[pk]
	for i, c := range ks {
		if c == ek.h {
			ks = append(ks[:i], ks[i+1:]...)
			break
		}
	}
	if len(ks) == 0 {
		delete(m.kids, pk)
	} else {
		m.kids[pk] = ks
	}
}

// queue hands r to the publisher (waking it when the queue was empty), or
// counts a drop when MaxQueued records wait already.
func (t *Tracker) queue(r rec) {
	if len(t.pend) >= t.opt.MaxQueued {
		t.st.Dropped++
		return
	}
	if len(t.pend) == 0 {
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
	t.pend = append(t.pend, r)
}

// maxScratch bounds the encoding scratch Flush keeps for the next flush.
const maxScratch = 1 << 20

// flushScratch is what Flush reuses from one flush to the next: the
// events of each model, in the order of its first record, and the
// encoding's buffer.
type flushScratch struct {
	enc     []byte
	models  []string
	byModel map[string]int // index in models and evs
	evs     [][]Event
	last    int // the model of the record added last, -1 before the first
}

// Flush turns the waiting records into batches, one per model, numbers
// them, keeps them in the replay buffer and returns them for publishing.
// Only the publisher calls it: the records are merged into events and
// encoded on its goroutine, outside the mutex the pool's observer takes,
// and numbered in the order they are kept. The records of one model merge
// as vLLM sends a prompt's: a BlockStored extends the model's last event
// when that is a BlockStored of the medium ending with its parent, a
// BlockRemoved the last when that is a BlockRemoved of the medium.
func (t *Tracker) Flush() []Batch {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	t.mu.Lock()
	t.applyLocked()
	recs := t.pend
	if len(recs) == 0 {
		t.mu.Unlock()
		return nil
	}
	t.pend, t.spare, t.flushing = t.spare[:0], nil, len(recs)
	t.mu.Unlock()

	f := &t.fl
	for i := range recs {
		f.add(&recs[i])
	}
	ts := float64(t.opt.Now().UnixNano()) / 1e9
	out := make([]Batch, 0, len(f.models))
	for i, m := range f.models {
		// Encoded into the scratch, then copied into a payload of its
		// exact size: what the replay buffer holds is what it counts, and
		// the copy skips the zeroing a fresh buffer of the estimated size
		// takes.
		f.enc = encodeBatch(f.enc[:0], ts, f.evs[i], t.opt.EventBlockSize, t.opt.Array, t.opt.DataParallelRank)
		out = append(out, Batch{Model: m, Events: len(f.evs[i]), Payload: bytes.Clone(f.enc)})
	}
	if cap(f.enc) > maxScratch {
		f.enc = nil // a burst's batch is not held for good
	}
	f.reset()
	clear(recs) // the references to nodes' tokens go with the records

	t.mu.Lock()
	defer t.mu.Unlock()
	t.spare, t.flushing = recs[:0], 0
	for i := range out {
		out[i].Seq = t.st.NextSeq
		t.st.NextSeq++
		t.st.Batches++
		t.keep(out[i])
	}
	return out
}

// add merges r into its model's events.
func (f *flushScratch) add(r *rec) {
	mi, ok := f.last, f.last >= 0 && f.models[f.last] == r.model // most records follow one of their model
	if !ok {
		mi, ok = f.byModel[r.model]
	}
	if !ok {
		mi = len(f.models)
		f.byModel[r.model] = mi
		f.models = append(f.models, r.model)
		if mi == len(f.evs) {
			f.evs = append(f.evs, nil)
		}
	}
	f.last = mi
	evs := f.evs[mi]
	if l := len(evs); l > 0 {
		e := &evs[l-1]
		if e.Stored == r.stored && e.Medium == r.medium &&
			(!r.stored || r.hasParent && e.Hashes[len(e.Hashes)-1] == r.parent) {
			e.appendRec(r)
			return
		}
	}
	// A new event, in a slot whose slices an earlier flush grew when
	// there is one.
	if len(evs) < cap(evs) {
		evs = evs[:len(evs)+1]
	} else {
		evs = append(evs, Event{})
	}
	e := &evs[len(evs)-1]
	*e = Event{Stored: r.stored, Medium: r.medium, Parent: r.parent, HasParent: r.stored && r.hasParent,
		Hashes: e.Hashes[:0], Tokens: e.Tokens[:0]}
	e.appendRec(r)
	f.evs[mi] = evs
}

// appendRec appends r's blocks (and tokens) to e.
func (e *Event) appendRec(r *rec) {
	if r.blocks == nil {
		e.Hashes = append(e.Hashes, r.h)
	}
	for _, b := range r.blocks {
		e.Hashes = append(e.Hashes, WireHash(b))
	}
	if r.stored {
		e.Tokens = append(e.Tokens, r.tokens)
	}
}

// reset empties f for the next flush, keeping what it grew; the events'
// token runs are cleared so that no node's tokens stay referenced.
func (f *flushScratch) reset() {
	for i := range f.evs {
		for j := range f.evs[i] {
			clear(f.evs[i][j].Tokens)
		}
		f.evs[i] = f.evs[i][:0]
	}
	f.models, f.last = f.models[:0], -1
	clear(f.byModel)
}

// MaxBufferBytes bounds the payloads the replay buffer keeps, whatever
// BufferSteps: under a steady stream of stores a batch carries tens of
// KiB of token ids, and 10,000 of them would hold hundreds of MiB. The
// oldest batches leave first; a replay from before them starts at the
// oldest kept, and the subscriber sees the gap in the seqs.
const MaxBufferBytes = 64 << 20

// keep adds b to the replay ring, dropping the oldest batches past
// BufferSteps or MaxBufferBytes (b itself is kept).
func (t *Tracker) keep(b Batch) {
	t.buf.push(b)
	t.bufBytes += len(b.Payload)
	for t.buf.len() > 1 && (t.buf.len() > t.opt.BufferSteps || t.bufBytes > MaxBufferBytes) {
		t.bufBytes -= len(t.buf.pop().Payload)
		t.st.BufferTrimmed++
	}
}

// Since returns the buffered batches with seq >= start, oldest first.
func (t *Tracker) Since(start uint64) []Batch {
	t.lockSynced() // a replay after a restart starts with the re-announcement
	defer t.mu.Unlock()
	var out []Batch
	for i := range t.buf.len() {
		if b := t.buf.at(i); b.Seq >= start {
			out = append(out, *b)
		}
	}
	return out
}

// Stats returns the counters.
//
// While a restart's re-announcement holds the tracker (up to about half a
// second for 65,536 chunks) Stats does not wait for it: it answers the
// figures of the last Stats with the stream counted behind, so /status
// answers at once.
func (t *Tracker) Stats() Stats {
	if t.ops.isHeld() {
		if !t.mu.TryLock() {
			var s Stats
			if p := t.lastStats.Load(); p != nil {
				s = *p
			}
			n, _ := t.waiting()
			s.Queued += max(n, 1)
			return s
		}
	} else {
		t.mu.Lock()
	}
	defer t.mu.Unlock()
	t.applyLocked()
	s := t.st
	s.Queued, s.Buffered, s.BufferedBytes = len(t.pend)+t.flushing, t.buf.len(), t.bufBytes
	if t.ops.isHeld() {
		// The re-announcement and the data path's ops behind it are still
		// to come: a router at NextSeq does not have them yet.
		n, _ := t.waiting()
		s.Queued += max(n, 1)
	}
	for _, m := range t.media() {
		s.Announced += m.announced
		s.Held += m.held
	}
	last := s
	if t.ops.isHeld() {
		last.Queued = len(t.pend) + t.flushing // the rest is counted when answered
	}
	t.lastStats.Store(&last)
	return s
}
