// Package kvevents keeps what kvdock announces to cache-aware routers
// (llm-d's indexer, Dynamo's KV router, vLLM's subscriber) in vLLM's KV event
// stream: the announced set of the L1 medium, the batches that change it and
// the bounded replay buffer of published batches; and, fed by the same
// announced set, the bounded log LMCache's vLLM connector polls
// (POLL_KV_EVENTS, log.go).
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
package kvevents

import (
	"encoding/binary"
	"sync"
	"time"

	"kvdock/core/keys"
)

// Medium names of vLLM's events.
const (
	MediumCPU = "CPU"
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
	Hashes    []uint64
	Parent    uint64
	HasParent bool
	Tokens    []uint32
}

// Stats are the tracker's counters.
type Stats struct {
	Announced     int    // chunks announced now
	Held          int    // chunks whole but held back for a missing parent
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

// Tracker keeps the announced set and the batches to publish. Its methods
// are safe for concurrent use and never block on the publisher.
type Tracker struct {
	opt Options

	mu     sync.Mutex
	nodes  map[ekey]*node
	kids   map[ekey][]keys.Hash // children whose parent is the key, resident or not
	wire   map[wkey]int         // announced chunks per wire hash (salts share one)
	queue  map[string][]Event   // events waiting, per model
	order  []string             // models of queue in first-event order
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
	t := &Tracker{
		opt: opt, nodes: map[ekey]*node{}, kids: map[ekey][]keys.Hash{}, wire: map[wkey]int{},
		queue: map[string][]Event{}, wake: make(chan struct{}, 1),
	}
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
	ek := keyOf(k)
	n := t.nodes[ek]
	if n == nil {
		n = &node{}
		t.nodes[ek] = n
	}
	for i := range n.objs {
		if n.objs[i].rank == k.KVRank && n.objs[i].group == k.Group {
			// The pool reports every object lost before it stores its key
			// again; should it not, the old object is taken as lost.
			t.lostLocked(ek, n, k)
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
	if n := t.nodes[ek]; n != nil {
		t.lostLocked(ek, n, k)
	}
}

func (t *Tracker) lostLocked(ek ekey, n *node, k *keys.ObjectKey) {
	was := n.whole()
	for i := range n.objs {
		if n.objs[i].rank == k.KVRank && n.objs[i].group == k.Group {
			n.objs = append(n.objs[:i], n.objs[i+1:]...)
			break
		}
	}
	if was && !n.whole() {
		if n.announced {
			t.unannounce(ek)
		}
		t.st.Held-- // unannounce counted it held: it is not whole
	}
	if len(n.objs) == 0 {
		t.drop(ek, n)
	}
}

// Cleared notes a Clear: every object went, so every announced chunk is
// removed (as BlockRemoved events, never AllBlocksCleared, which llm-d
// takes as a wipe of every medium of the pod).
func (t *Tracker) Cleared() {
	t.mu.Lock()
	defer t.mu.Unlock()
	// Parents first, so that every removal precedes none of its own: the
	// order within one batch does not matter to a router, the set does.
	for ek, n := range t.nodes {
		if n.announced {
			n.announced = false
			t.logWithdrawn(ek)
			t.unwire(ek)
		}
	}
	t.nodes = map[ekey]*node{}
	t.kids = map[ekey][]keys.Hash{}
	t.st.Announced, t.st.Held = 0, 0
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
	touched := make([]bool, len(c.Hashes))
	for ki := range c.Keys {
		k := &c.Keys[ki]
		i, ok := idx[k.Chunk]
		if !ok || (i+1)*bs > len(c.Tokens) {
			continue
		}
		ek := keyOf(k)
		n := t.nodes[ek]
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
			n.want = c.Objects
			if i > 0 {
				n.parent, n.hasParent = c.Hashes[i-1], true
			} else {
				n.parent, n.hasParent = c.Parent, c.HasParent
			}
			n.tokens = append([]uint32(nil), c.Tokens[i*bs:(i+1)*bs]...)
			if n.hasParent {
				pk := ekey{model: c.Model, salt: c.Salt, h: n.parent}
				t.kids[pk] = append(t.kids[pk], k.Chunk)
			}
		}
		if !was && n.whole() {
			t.st.Held++ // until tryAnnounce announces it
		}
		touched[i] = true
	}
	// In prompt order, so that a batch announces parents before children.
	for i, ok := range touched {
		if ok {
			t.tryAnnounce(ekey{model: c.Model, salt: c.Salt, h: c.Hashes[i]})
		}
	}
}

// usable: whole, and its parent announced (or none).
func (t *Tracker) usable(ek ekey, n *node) bool {
	if !n.whole() {
		return false
	}
	if !n.hasParent {
		return true
	}
	p := t.nodes[ekey{model: ek.model, salt: ek.salt, h: n.parent}]
	return p != nil && p.announced
}

// tryAnnounce announces ek if it became usable, then every held-back
// descendant that became usable with it, parents before children.
func (t *Tracker) tryAnnounce(ek ekey) {
	stack := []ekey{ek}
	for len(stack) > 0 {
		e := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		n := t.nodes[e]
		if n == nil || n.announced || !t.usable(e, n) {
			continue
		}
		n.announced = true
		t.st.Announced++
		t.st.Held--
		t.logAnnounced(e, n)
		t.wireUp(e, n)
		for _, c := range t.kids[e] {
			stack = append(stack, ekey{model: e.model, salt: e.salt, h: c})
		}
	}
}

// unannounce removes ek and its announced descendants.
func (t *Tracker) unannounce(ek ekey) {
	stack := []ekey{ek}
	for len(stack) > 0 {
		e := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		n := t.nodes[e]
		if n == nil || !n.announced {
			continue
		}
		n.announced = false
		t.st.Announced--
		t.st.Held++ // whole still; lostLocked corrects the chunk that was not
		t.logWithdrawn(e)
		t.unwire(e)
		for _, c := range t.kids[e] {
			stack = append(stack, ekey{model: e.model, salt: e.salt, h: c})
		}
	}
}

// blocks are the announced blocks of chunk e, and the block before its
// first (hasParent false for a prompt's first): the chunk itself, or its
// split blocks chained after the parent chunk's last block.
func (t *Tracker) blocks(e ekey, n *node) (bs []keys.Hash, parent keys.Hash, hasParent bool) {
	var pn *node
	if n.hasParent {
		pn = t.nodes[ekey{model: e.model, salt: e.salt, h: n.parent}]
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

// wireUp counts e's blocks announced and emits the ones new to the router:
// a suffix of the chunk's blocks, since a block shared with another
// announced chunk has its leading blocks shared too.
func (t *Tracker) wireUp(e ekey, n *node) {
	if t.opt.NoStream {
		return
	}
	bs, parent, hasParent := t.blocks(e, n)
	first := len(bs)
	for i, b := range bs {
		w := wkey{model: e.model, h: WireHash(b)}
		t.wire[w]++
		if t.wire[w] == 1 && first == len(bs) {
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
	t.emitStored(e.model, hs, WireHash(parent), hasParent, n.tokens[first*per:])
}

// unwire drops one announcement of each of e's blocks and emits the
// removal of those no announced chunk holds any more.
func (t *Tracker) unwire(e ekey) {
	if t.opt.NoStream {
		return
	}
	n := t.nodes[e]
	bs := []keys.Hash{e.h}
	if t.split != nil && n != nil {
		bs = n.subs
		n.subs = nil // recomputed at the next announcement: the parent may change
	}
	for _, b := range bs {
		w := wkey{model: e.model, h: WireHash(b)}
		t.wire[w]--
		if t.wire[w] > 0 {
			continue
		}
		delete(t.wire, w)
		t.emitRemoved(e.model, w.h)
	}
}

// drop forgets a node none of whose objects is resident; its children stay
// listed under it, waiting for it to return.
func (t *Tracker) drop(ek ekey, n *node) {
	delete(t.nodes, ek)
	if n.want == 0 || !n.hasParent {
		return
	}
	pk := ekey{model: ek.model, salt: ek.salt, h: n.parent}
	ks := t.kids[pk]
	for i, c := range ks {
		if c == ek.h {
			ks = append(ks[:i], ks[i+1:]...)
			break
		}
	}
	if len(ks) == 0 {
		delete(t.kids, pk)
	} else {
		t.kids[pk] = ks
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

// emitStored queues a BlockStored of hs (tokens, EventBlockSize each),
// extending the model's last event when it is a BlockStored ending with
// this one's parent (one event per run of a prompt, as vLLM sends them).
func (t *Tracker) emitStored(model string, hs []uint64, parent uint64, hasParent bool, tokens []uint32) {
	t.st.StoredEvents += uint64(len(hs))
	evs := t.queue[model]
	if l := len(evs); l > 0 && evs[l-1].Stored && hasParent && evs[l-1].Hashes[len(evs[l-1].Hashes)-1] == parent {
		evs[l-1].Hashes = append(evs[l-1].Hashes, hs...)
		evs[l-1].Tokens = append(evs[l-1].Tokens, tokens...)
		return
	}
	if !t.room(model) {
		return
	}
	t.queued++
	t.queue[model] = append(evs, Event{Stored: true, Hashes: hs, Parent: parent,
		HasParent: hasParent, Tokens: append([]uint32(nil), tokens...)})
}

// emitRemoved queues a BlockRemoved, extending the model's last event when
// it is one.
func (t *Tracker) emitRemoved(model string, h uint64) {
	t.st.RemovedEvents++
	evs := t.queue[model]
	if l := len(evs); l > 0 && !evs[l-1].Stored {
		evs[l-1].Hashes = append(evs[l-1].Hashes, h)
		return
	}
	if !t.room(model) {
		return
	}
	t.queued++
	t.queue[model] = append(evs, Event{Hashes: []uint64{h}})
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
			Payload: encodeBatch(ts, evs, t.opt.EventBlockSize, t.opt.Medium, t.opt.Array, t.opt.DataParallelRank)})
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
	return s
}
