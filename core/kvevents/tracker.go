// Package kvevents keeps what kvdock announces to cache-aware routers
// (llm-d's indexer, Dynamo's KV router, vLLM's subscriber) in vLLM's KV event
// stream: the announced set of each medium (the L1 pool's, and each L2
// tier's), the batches that change them and the bounded replay buffer of
// published batches; and, fed by the same announced sets, the bounded log
// LMCache's vLLM connector polls (POLL_KV_EVENTS, log.go).
//
// The announced set is the usable set: a chunk is announced once every object
// of it (every rank, every KV group) is committed and its parent chunk is
// announced — exactly when LOOKUP would count it as a hit. A chunk whose
// parent is not announced is held back and announced when the parent returns;
// a chunk that stops being usable is removed with its announced descendants.
// So a router never sees a child before its parent, and a removal names only
// an announced hash, once.
//
// It learns from two sources: the pool's observer (Stored, Lost, Cleared,
// called under the pool's mutex, in the pool's order) and the transfer
// module's commits (Commit), which carry what the pool does not know: the
// tokens of each chunk, its parent and how many objects make it whole. A
// commit only marks objects the observer reported stored and not yet lost, so
// a commit that arrives after an eviction of its objects announces nothing.
// A tier's medium learns from the tier (TierStored, TierLost: a value it
// came to hold or dropped, in the tier's own order) and takes each chunk's
// tokens, parent and object count from the L1 chunk that was written behind.
package kvevents

import (
	"encoding/binary"
	"slices"
	"sync"
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

// DefaultMaxQueued bounds the events waiting for the publisher; past it new
// events are dropped and counted, so a stalled publisher costs bounded memory
// and never blocks the data path.
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
	// MaxQueued bounds the events waiting to be published.
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
	// Objects is how many objects make one chunk whole: world size times
	// KV groups.
	Objects int
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
	Tokens    []uint32
}

// Stats are the tracker's counters.
type Stats struct {
	Announced     int    // chunks announced now, over every medium
	Held          int    // chunks whole but held back for a missing parent, over every medium
	Batches       uint64 // batches published
	StoredEvents  uint64 // hashes announced
	RemovedEvents uint64 // hashes removed
	Dropped       uint64 // events dropped because the queue was full
	Queued        int    // events waiting for the publisher
	Buffered      int    // batches in the replay buffer
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
	committed   bool
	tiers       int // tiers of the medium holding it (a tier's medium only)
}

type node struct {
	objs      []obj
	subs      []keys.Hash // the chunk's blocks, while announced (split only)
	want      int         // objects that make the chunk whole; 0 until a commit
	parent    keys.Hash
	hasParent bool
	tokens    []uint32
	announced bool
}

func (n *node) whole() bool {
	if n.want == 0 {
		return false
	}
	c := 0
	for _, o := range n.objs {
		if o.committed {
			c++
		}
	}
	return c >= n.want
}

// medium is one medium's announced set: the L1 pool's, or one shared by
// the tiers of one medium name.
type medium struct {
	name            string
	nodes           map[ekey]*node
	kids            map[ekey][]keys.Hash // children whose parent is the key, resident or not
	wire            map[wkey]int         // announced chunks per wire hash (salts share one)
	announced, held int
}

func newMedium(name string) *medium {
	return &medium{name: name, nodes: map[ekey]*node{}, kids: map[ekey][]keys.Hash{}, wire: map[wkey]int{}}
}

// Tracker keeps the announced sets and the batches to publish. Its methods
// are safe for concurrent use and never block on the publisher.
type Tracker struct {
	opt Options

	mu     sync.Mutex
	l1     *medium
	tiers  []*medium          // cur's media
	cur    *Tiers             // the tiers behind the pool now
	queue  map[string][]Event // events waiting, per model
	order  []string           // models of queue in first-event order
	queued int
	st     Stats
	split  *keys.Hasher // EventBlockSize's hasher; nil when chunks are announced whole
	buf    []Batch      // the replay ring
	head   int          // index of the oldest batch in buf when full
	wake   chan struct{}
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
	t := &Tracker{opt: opt, l1: newMedium(opt.Medium), queue: map[string][]Event{}, wake: make(chan struct{}, 1)}
	if n := opt.EventBlockSize; n > 0 && n != opt.BlockSize && opt.BlockSize%n == 0 {
		t.split, _ = keys.NewHasher(n, keys.AlgorithmBLAKE3) // n > 0: cannot fail
	} else {
		t.opt.EventBlockSize = opt.BlockSize
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
	t.mu.Lock()
	defer t.mu.Unlock()
	t.storedLocked(k)
}

func (t *Tracker) storedLocked(k *keys.ObjectKey) {
	m, ek := t.l1, keyOf(k)
	n := m.nodes[ek]
	if n == nil {
		n = &node{}
		m.nodes[ek] = n
	}
	for i := range n.objs {
		if n.objs[i].rank == k.KVRank && n.objs[i].group == k.Group {
			// The pool reports every object lost before it stores its key
			// again; should it not, the old object is taken as lost.
			t.lostLocked(m, ek, n, k)
			t.storedLocked(k)
			return
		}
	}
	n.objs = append(n.objs, obj{rank: k.KVRank, group: k.Group})
}

// Lost notes an object that left the pool (or never entered it): its chunk
// stops being usable, and is removed with its announced descendants.
func (t *Tracker) Lost(k *keys.ObjectKey) {
	if keys.IsBenchModel(k.Model) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ek := keyOf(k)
	if n := t.l1.nodes[ek]; n != nil {
		t.lostLocked(t.l1, ek, n, k)
	}
}

func (t *Tracker) lostLocked(m *medium, ek ekey, n *node, k *keys.ObjectKey) {
	was := n.whole()
	for i := range n.objs {
		if n.objs[i].rank == k.KVRank && n.objs[i].group == k.Group {
			n.objs = append(n.objs[:i], n.objs[i+1:]...)
			break
		}
	}
	if was && !n.whole() {
		if n.announced {
			t.unannounce(m, ek)
		}
		m.held-- // unannounce counted it held: it is not whole
	}
	if len(n.objs) == 0 {
		m.drop(ek, n)
	}
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
	if t.cur != nil {
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

// Stored notes that tier i holds k's value now (its write behind landed).
// The object counts for the tier's medium from then on; its chunk's
// tokens, parent and object count come from the L1 chunk written behind,
// so a value whose L1 chunk was never committed (an earlier run's) is not
// announced.
func (v *Tiers) Stored(i int, k *keys.ObjectKey) {
	v.locked(i, k, func(t *Tracker, m *medium, ek ekey) {
		n := m.nodes[ek]
		if n == nil {
			src := t.l1.nodes[ek]
			if src == nil || src.want == 0 {
				return
			}
			n = &node{}
			m.nodes[ek] = n
			m.describe(ek, n, src.want, src.parent, src.hasParent, src.tokens)
		}
		if j := n.find(k); j >= 0 {
			n.objs[j].tiers++ // another tier of this medium holds it too
			return
		}
		was := n.whole()
		n.objs = append(n.objs, obj{rank: k.KVRank, group: k.Group, committed: true, tiers: 1})
		if !was && n.whole() {
			m.held++ // until tryAnnounce announces it
		}
		t.tryAnnounce(m, ek)
	})
}

// Lost notes that tier i no longer holds k's value (evicted, deleted,
// cleared, expired, found gone): when no tier of its medium holds it, its
// chunk is removed there with its announced descendants.
func (v *Tiers) Lost(i int, k *keys.ObjectKey) {
	v.locked(i, k, func(t *Tracker, m *medium, ek ekey) {
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

// locked runs f with the tracker's mutex held on tier i's medium and k's
// chunk, unless the set was replaced, i is no tier of it or k is bench
// traffic.
func (v *Tiers) locked(i int, k *keys.ObjectKey, f func(t *Tracker, m *medium, ek ekey)) {
	if v == nil || keys.IsBenchModel(k.Model) {
		return
	}
	t := v.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if m := v.medium(i); m != nil {
		f(t, m, keyOf(k))
	}
}

// find is the index in n.objs of k's object (its rank and group), -1 if none.
func (n *node) find(k *keys.ObjectKey) int {
	return slices.IndexFunc(n.objs, func(o obj) bool { return o.rank == k.KVRank && o.group == k.Group })
}

// Loaded notes objects a prefetch loaded from a tier and published in L1:
// they are committed there like a store's, with their chunk's tokens,
// parent and object count taken from the tier's medium that held it.
func (t *Tracker) Loaded(ks []keys.ObjectKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.l1
	for i := range ks {
		k := &ks[i]
		ek := keyOf(k)
		n := m.nodes[ek]
		if keys.IsBenchModel(k.Model) || n == nil {
			continue // lost before it was told
		}
		if n.want == 0 {
			for _, tm := range t.tiers {
				if src := tm.nodes[ek]; src != nil && src.want > 0 {
					m.describe(ek, n, src.want, src.parent, src.hasParent, src.tokens)
					break
				}
			}
		}
		was := n.whole()
		if j := n.find(k); j >= 0 {
			n.objs[j].committed = true
		}
		if !was && n.whole() {
			m.held++ // until tryAnnounce announces it
		}
		t.tryAnnounce(m, ek)
	}
}

// Cleared notes a Clear of the pool: every object went, so every chunk
// announced for the L1 medium is removed (as BlockRemoved events, never
// AllBlocksCleared, which llm-d takes as a wipe of every medium of the
// pod). The tiers' media stay as they are.
func (t *Tracker) Cleared() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.removeAll(t.l1)
}

// Commit notes a committed store batch, announcing every chunk it made
// usable and every held-back descendant that was waiting for one of them.
func (t *Tracker) Commit(c Commit) {
	if keys.IsBenchModel(c.Model) || len(c.Keys) == 0 || c.Objects <= 0 {
		return
	}
	bs := t.opt.BlockSize
	idx := make(map[keys.Hash]int, len(c.Hashes))
	for i, h := range c.Hashes {
		idx[h] = i
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.l1
	touched := make([]bool, len(c.Hashes))
	for ki := range c.Keys {
		k := &c.Keys[ki]
		i, ok := idx[k.Chunk]
		if !ok || (i+1)*bs > len(c.Tokens) {
			continue
		}
		ek := keyOf(k)
		n := m.nodes[ek]
		if n == nil {
			continue // lost before its commit was told: nothing to announce
		}
		found, was := false, n.whole()
		for j := range n.objs {
			if n.objs[j].rank == k.KVRank && n.objs[j].group == k.Group {
				n.objs[j].committed, found = true, true
				break
			}
		}
		if !found {
			continue
		}
		if n.want == 0 {
			parent, hasParent := c.Parent, c.HasParent
			if i > 0 {
				parent, hasParent = c.Hashes[i-1], true
			}
			m.describe(ek, n, c.Objects, parent, hasParent, append([]uint32(nil), c.Tokens[i*bs:(i+1)*bs]...))
		}
		if !was && n.whole() {
			m.held++ // until tryAnnounce announces it
		}
		touched[i] = true
	}
	// In prompt order, so that a batch announces parents before children.
	for i, ok := range touched {
		if ok {
			t.tryAnnounce(m, ekey{model: c.Model, salt: c.Salt, h: c.Hashes[i]})
		}
	}
}

// describe gives n, the node of ek, what a commit tells of its chunk: the
// objects that make it whole, its parent and its tokens (never changed
// after: tokens is shared by every medium's node of the chunk).
func (m *medium) describe(ek ekey, n *node, want int, parent keys.Hash, hasParent bool, tokens []uint32) {
	n.want, n.parent, n.hasParent, n.tokens = want, parent, hasParent, tokens
	if hasParent {
		pk := ekey{model: ek.model, salt: ek.salt, h: parent}
		m.kids[pk] = append(m.kids[pk], ek.h)
	}
}

// usable: whole, and its parent announced in m (or none).
func (m *medium) usable(n *node, ek ekey) bool {
	if !n.whole() {
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
		if n == nil || n.announced || !m.usable(n, e) {
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

// blocks are the announced blocks of chunk e in m, and the block before
// its first (hasParent false for a prompt's first): the chunk itself, or
// its split blocks chained after the parent chunk's last block.
func (t *Tracker) blocks(m *medium, e ekey, n *node) (bs []keys.Hash, parent keys.Hash, hasParent bool) {
	var pn *node
	if n.hasParent {
		pn = m.nodes[ekey{model: e.model, salt: e.salt, h: n.parent}]
	}
	if t.split == nil {
		return []keys.Hash{e.h}, n.parent, n.hasParent
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

// wireUp counts e's blocks announced in m and emits the ones new to the
// router: a suffix of the chunk's blocks, since a block shared with
// another announced chunk has its leading blocks shared too.
func (t *Tracker) wireUp(m *medium, e ekey, n *node) {
	if t.opt.NoStream {
		return
	}
	bs, parent, hasParent := t.blocks(m, e, n)
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
	per := t.opt.EventBlockSize
	hs := make([]uint64, 0, len(bs)-first)
	for _, b := range bs[first:] {
		hs = append(hs, WireHash(b))
	}
	t.emitStored(e.model, m.name, hs, WireHash(parent), hasParent, n.tokens[first*per:])
}

// unwire drops one announcement in m of each of e's blocks and emits the
// removal of those no announced chunk holds any more.
func (t *Tracker) unwire(m *medium, e ekey) {
	if t.opt.NoStream {
		return
	}
	n := m.nodes[e]
	bs := []keys.Hash{e.h}
	if t.split != nil && n != nil {
		bs = n.subs
		n.subs = nil // recomputed at the next announcement: the parent may change
	}
	for _, b := range bs {
		w := wkey{model: e.model, h: WireHash(b)}
		m.wire[w]--
		if m.wire[w] > 0 {
			continue
		}
		delete(m.wire, w)
		t.emitRemoved(e.model, m.name, w.h)
	}
}

// drop forgets a node none of whose objects is resident; its children stay
// listed under it, waiting for it to return.
func (m *medium) drop(ek ekey, n *node) {
	delete(m.nodes, ek)
	if n.want == 0 || !n.hasParent {
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

// room reserves one queued event, or counts a drop.
func (t *Tracker) room(model string) bool {
	if t.queued >= t.opt.MaxQueued {
		t.st.Dropped++
		return false
	}
	if _, ok := t.queue[model]; !ok {
		t.order = append(t.order, model)
	}
	if t.queued == 0 {
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// emitStored queues a BlockStored of hs (tokens, EventBlockSize each) for
// medium, extending the model's last event when it is a BlockStored of the
// medium ending with this one's parent (one event per run of a prompt, as
// vLLM sends them).
func (t *Tracker) emitStored(model, medium string, hs []uint64, parent uint64, hasParent bool, tokens []uint32) {
	t.st.StoredEvents += uint64(len(hs))
	evs := t.queue[model]
	if l := len(evs); l > 0 && evs[l-1].Stored && evs[l-1].Medium == medium && hasParent && evs[l-1].Hashes[len(evs[l-1].Hashes)-1] == parent {
		evs[l-1].Hashes = append(evs[l-1].Hashes, hs...)
		evs[l-1].Tokens = append(evs[l-1].Tokens, tokens...)
		return
	}
	if !t.room(model) {
		return
	}
	t.queued++
	t.queue[model] = append(evs, Event{Stored: true, Medium: medium, Hashes: hs, Parent: parent,
		HasParent: hasParent, Tokens: append([]uint32(nil), tokens...)})
}

// emitRemoved queues a BlockRemoved for medium, extending the model's last
// event when it is one of the medium.
func (t *Tracker) emitRemoved(model, medium string, h uint64) {
	t.st.RemovedEvents++
	evs := t.queue[model]
	if l := len(evs); l > 0 && !evs[l-1].Stored && evs[l-1].Medium == medium {
		evs[l-1].Hashes = append(evs[l-1].Hashes, h)
		return
	}
	if !t.room(model) {
		return
	}
	t.queued++
	t.queue[model] = append(evs, Event{Medium: medium, Hashes: []uint64{h}})
}

// Flush turns the waiting events into batches, one per model, numbers them,
// keeps them in the replay buffer and returns them for publishing. Only the
// publisher calls it: the batches are encoded outside the mutex the pool's
// observer takes, and numbered in the order they are kept.
func (t *Tracker) Flush() []Batch {
	t.mu.Lock()
	if t.queued == 0 {
		t.mu.Unlock()
		return nil
	}
	queue, order := t.queue, t.order
	t.queue, t.order, t.queued = map[string][]Event{}, nil, 0
	t.mu.Unlock()

	ts := float64(t.opt.Now().UnixNano()) / 1e9
	out := make([]Batch, 0, len(order))
	for _, m := range order {
		evs := queue[m]
		out = append(out, Batch{Model: m, Events: len(evs),
			Payload: encodeBatch(ts, evs, t.opt.EventBlockSize, t.opt.Array, t.opt.DataParallelRank)})
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range out {
		out[i].Seq = t.st.NextSeq
		t.st.NextSeq++
		t.st.Batches++
		t.keep(out[i])
	}
	return out
}

// keep adds b to the replay ring.
func (t *Tracker) keep(b Batch) {
	if len(t.buf) < t.opt.BufferSteps {
		t.buf = append(t.buf, b)
		return
	}
	t.buf[t.head] = b
	t.head = (t.head + 1) % len(t.buf)
}

// Since returns the buffered batches with seq >= start, oldest first.
func (t *Tracker) Since(start uint64) []Batch {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Batch
	for i := range t.buf {
		b := t.buf[(t.head+i)%len(t.buf)]
		if b.Seq >= start {
			out = append(out, b)
		}
	}
	return out
}

// Stats returns the counters.
func (t *Tracker) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.st
	s.Queued, s.Buffered = t.queued, len(t.buf)
	s.Announced, s.Held = t.l1.announced, t.l1.held
	for i, m := range t.tiers {
		if !slices.Contains(t.tiers[:i], m) { // tiers of one medium share it
			s.Announced += m.announced
			s.Held += m.held
		}
	}
	return s
}
