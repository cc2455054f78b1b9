// Package nongpu is the non-GPU transfer module: it registers workers whose KV
// caches live outside CUDA (CPU, XPU, NPU, …), decides per worker whether KV
// chunks travel through the shared L1 segment (SHM: the worker reads and
// writes slots of the pool directly) or inside the requests as pickled torch
// tensors (PICKLE), and serves the prepare/commit store and retrieve requests
// of both strategies (spec 4.4–4.8).
//
// It also owns the --shm-name decision of the seed: PlanSegment makes it
// once, l1.Open carries it out, and the module advertises the pool's final
// Decision (PoolInfo), so the segment advertised at registration is always
// the one that exists.
//
// Compared with upstream the wire answers are the same, but clean-up is
// stricter: pending SHM writes are never published half-written on
// unregister, reaping, id reuse, expiry, a repeated prepare or a pickle
// commit, and neither they nor pending reads give their bytes back before
// the pool's TTL, since the worker may still be copying (l1.Pool.Abandon). A peer's input changes an instance only once it is
// validated in full: a pickle commit switches an SHM instance to PICKLE only
// when it decoded to one tensor of the instance's layout per chunk, and an
// SHM commit switches a PICKLE instance back. Registrations are bounded in
// number (server.max_instances) and in the strings they keep.
//
// It also tracks each instance's liveness (liveness.go): when and from which
// ZMQ peer it was last heard of, its requests in flight, the reaper that
// drops silent ones under profiles whose PING names the instance, operator
// removal, and an id registered again from another peer taken as a new
// worker.
package nongpu

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"kvdock/core/keys"
	"kvdock/core/kvevents"
	"kvdock/core/l1"
	"kvdock/core/layout"
	"kvdock/core/protocol"
	"kvdock/core/workers"
	"kvdock/settings"
)

// Pool is the part of the L1 pool (core/l1) the module uses.
type Pool interface {
	Decision() l1.Decision
	// ReserveWrite, FinishWrite and AbortWrite work on reservations, so a
	// late commit or abort never touches a lock it does not hold. AbortWrite
	// frees at once: only for reservations whose slots no worker was given.
	ReserveWrite(owner l1.Owner, ks []keys.ObjectKey, size int64) ([]l1.Reservation, error)
	// ReserveWriteAfter is ReserveWrite for a store that starts mid-prompt:
	// prev are the keys of the chunk before ks's first (its parent).
	ReserveWriteAfter(owner l1.Owner, prev, ks []keys.ObjectKey, size int64) ([]l1.Reservation, error)
	FinishWrite(rs []l1.Reservation) bool
	AbortWrite(rs []l1.Reservation)
	// Abandon ends the holds of a worker that went away or whose transfer
	// was given up; the bytes stay until the holds' TTL, since the worker
	// may still be copying. ExpireWrite is Abandon for a store given up
	// because its worker did not commit in time (noted for the miss reasons).
	Abandon(rs []l1.Reservation, refs []l1.ReadRef)
	ExpireWrite(rs []l1.Reservation)
	// HoldRead takes one of the read locks LOOKUP left for the workers;
	// ReleaseRead ends the hold (COMMIT_RETRIEVE, or holds never handed out).
	HoldRead(k keys.ObjectKey) (l1.ReadRef, bool)
	ReleaseRead(refs []l1.ReadRef)
	// FinishRead gives back count of LOOKUP's read locks on each key: a
	// prepare that joins a pending read consumes its lookup's lock so.
	FinishRead(ks []keys.ObjectKey, count int)
	// Rehold takes holds of its own on the objects refs hold (all or
	// none), for a copy out of them that outlasts the holds refs stand for.
	Rehold(refs []l1.ReadRef) ([]l1.ReadRef, bool)
	// HeldAll reports whether every ref's hold is still in force.
	HeldAll(refs []l1.ReadRef) bool
	// View pins a range of the pool for a copy; Close waits for it.
	View(off, n int64) ([]byte, func())
	// ClaimWrites and ClaimHolds hand the reservations and read holds of a
	// transfer carried across a restart to its instance (carry.go).
	ClaimWrites(owner l1.Owner, offs []int64) ([]l1.Reservation, bool)
	ClaimHolds(offs []int64) ([]l1.ReadRef, bool)
}

// KeyResolver turns a worker-side key into ObjectKeys; *keys.Sessions is one.
type KeyResolver interface {
	ObjectKeys(r keys.KeyRequest) ([]keys.ObjectKey, error)
}

// Deps is what the engine hands the module.
type Deps struct {
	Pool    Pool
	Keys    KeyResolver
	Layouts *layout.Registry
	// ChunkSize is the server chunk size in tokens; 0 takes server.ChunkSize.
	ChunkSize int
	Logger    *slog.Logger
	// Events receives registrations, unregistrations, fallbacks and errors
	// (the dashboard log pane). It is called without module locks held.
	Events func(workers.Event)
	Now    func() time.Time
	// Published, when set, is told of every batch of objects a commit
	// published in L1 (the tiers' write-behind queue). It must not block.
	Published func(ks []keys.ObjectKey, lay layout.Layout)
	// Committed, when set, is told of every committed store batch with
	// what the KV event stream needs beyond the pool's observer (tokens,
	// parent, objects per chunk). It must not block.
	Committed func(kvevents.Commit)
}

// ErrClosed is returned by every request after Close.
var ErrClosed = errors.New("nongpu: module closed")

// ErrTooManyInstances refuses a registration beyond server.max_instances.
var ErrTooManyInstances = errors.New("too many registered instances")

// ErrNotRegistered is a transfer request naming an instance that is not
// registered (never, or no longer: unregistered, reaped, removed). The
// handlers answer it with the request's failure reply rather than nothing,
// so the worker never waits out its timeout for it.
var ErrNotRegistered = errors.New("non-GPU context not registered")

// ErrLayoutConflict refuses a registration whose layouts' ID
// (layout.ID, named by every object key) is that of other layouts
// registered for the model: a SHA-256 prefix collision, which no peer can
// aim at. Other layouts of a registered model register beside it.
var ErrLayoutConflict = errors.New("layout conflicts with the one registered for the model")

// DefaultMaxInstances applies when server.max_instances is not positive. It
// is far above any real deployment (one instance per worker process) and
// keeps /status and the dashboard to a few hundred KiB.
const DefaultMaxInstances = 1024

// MaxModelNameBytes bounds a registered model name: every context keeps it,
// and /status, events and the dashboard show it.
const MaxModelNameBytes = 256

type instance struct {
	id  int64
	p   protocol.RegisterPayload
	lay layout.Layout // groups[0]
	// groups holds one layout per KV group: one for a plain model, several
	// for a hybrid one (each group's objects live under their own keys).
	groups []layout.Layout
	// layoutID is layout.ID(groups): every key of the instance names it,
	// so its chunks are apart from other layouts' of the model.
	layoutID uint64
	mode     workers.Mode
	reason   string
	// shmProven: the worker committed an SHM store it wrote (or a restart
	// restored the registration), so it maps the segment; until then its
	// retrieve replies carry the data beside the slots (carriesData).
	shmProven  bool
	registered time.Time
	last       time.Time
	// peer is the ZMQ routing id that holds the instance: the one that
	// registered it, or that spoke for it once the holder was silent for
	// the peer window (a reconnected worker); peerSeen is when the holder
	// last spoke for it. inFlight counts its requests being served. pinged
	// and transferred are the reaper's two signals (a PING with the id; a
	// prepare or commit).
	peer     string
	peerSeen time.Time
	// restored: carried by a restart record, and no peer has spoken for
	// it since (peer is ""): it counts as held by a live peer for the
	// peer window from its restore (peerSeen), so no other peer can end it
	// meanwhile; the first peer that speaks for it takes it.
	restored bool
	// profile is the protocol table it registered through; "" while its
	// REGISTER's table was a tie-break (--protocol auto) until its holder
	// peer is decided (tentative: PeerDecided sets it then).
	profile             string
	tentative           bool
	inFlight            int
	pinged, transferred bool

	stores, storeFailures, retrieves, hitChunks, bytesIn, bytesOut int64
}

// pendingKey identifies a transfer as upstream's key equality does (every
// field but request_id), per instance. The token list and the cache salt are
// represented by their length and a seeded hash, so a pending entry keeps
// none of the peer's variable-length data (the model name is the instance's).
type pendingKey struct {
	instance  int64
	worldSize int
	worker    int
	nTokens   int
	tokens    uint64
	start     int
	end       int
	nSalt     int
	salt      uint64
	// carried: a transfer the previous process prepared (carry.go);
	// tokens and salt then hold the halves of its keyed digest.
	carried bool
}

// pending is a reservation awaiting COMMIT_STORE (res) or read locks
// awaiting COMMIT_RETRIEVE (refs): readers of them, each answered reply,
// until as many commits came.
type pending struct {
	inst *instance
	// peer is the ZMQ routing id that prepared it ("": unknown, or carried
	// by a restart, when the worker reconnects under a new id): only that
	// peer commits a write, so an old worker whose instance id another
	// peer registered again cannot publish the new one's slots while they
	// are still being written. A read's holds are ended by the peers that
	// joined it (joined), each for its own readers: another peer (the same
	// worker reconnected under a new id) may join the read and read the
	// same slots, but cannot end holds others are still reading under.
	peer    string
	joined  map[string]int
	res     []l1.Reservation
	refs    []l1.ReadRef
	bytes   int64
	created time.Time
	readers int
	reply   protocol.PrepareRetrieveResponse
	// sizes is a read's slots per KV group (reply.Slots, group-major).
	sizes []int
	// carry is the entry's key as the next process matches it (carry.go):
	// set for entries prepared while the stop carries transfers.
	carry *pendingKey
	// chain is a write's chunk hashes in prompt order and the chunk before
	// its first, as its prepare resolved them: kept only while the KV
	// event stream is on (its commit tells them), so that the commit need
	// not hash its tokens again.
	chain *storeChain
}

// storeChain is what a store's commit tells the KV event stream beside
// its tokens: the chunk hashes of its prepare, in prompt order, and the
// hash of the chunk before its first (hasParent false for a prompt's
// first).
type storeChain struct {
	hashes    []keys.Hash
	parent    keys.Hash
	hasParent bool
}

// chainOf is the storeChain of keys ks after prev.
func chainOf(prev, ks []keys.ObjectKey) *storeChain {
	c := &storeChain{hashes: make([]keys.Hash, len(ks))}
	for i := range ks {
		c.hashes[i] = ks[i].Chunk
	}
	if len(prev) > 0 {
		c.parent, c.hasParent = prev[0].Chunk, true
	}
	return c
}

// ownedBy reports whether a request from peer (nil: unknown, an
// in-process caller) may end the entry: a write, when peer prepared it;
// a read, when peer joined it and has a reader left.
func (p *pending) ownedBy(peer []byte) bool {
	if p.peer == "" || len(peer) == 0 {
		return true
	}
	if p.res == nil { // a read: a write always holds its reservation
		return p.joined[string(peer)] > 0
	}
	return p.peer == string(peer)
}

// promptChunks is the number of the prompt's chunks a read's reply names:
// its slots over its KV groups.
func (p *pending) promptChunks() int {
	if len(p.sizes) == 0 {
		return len(p.reply.Slots)
	}
	return p.sizes[0]
}

// join counts one more reader of the read from peer.
func (p *pending) join(peer []byte) {
	p.readers++
	if len(peer) > 0 {
		if p.joined == nil {
			p.joined = map[string]int{}
		}
		p.joined[string(peer)]++
	}
}

// leave counts one reader from peer done, and reports whether it was the
// last one the holds wait for.
func (p *pending) leave(peer []byte) bool {
	if n := p.joined[string(peer)]; n > 1 {
		p.joined[string(peer)] = n - 1
	} else {
		delete(p.joined, string(peer))
	}
	p.readers--
	return p.readers <= 0
}

// chunks is how many objects the entry holds.
func (p *pending) chunks() int { return len(p.res) + len(p.refs) }

// Module is the non-GPU transfer module. Its methods are safe for concurrent use.
type Module struct {
	pool      Pool
	resolver  KeyResolver
	layouts   *layout.Registry
	chunkSize int
	log       *slog.Logger
	emit      func(workers.Event)
	published func(ks []keys.ObjectKey, lay layout.Layout)
	committed func(kvevents.Commit)
	now       func() time.Time
	info      workers.Info
	seed      maphash.Seed
	maxBytes  int64

	mu        sync.Mutex
	closed    bool
	instances map[int64]*instance
	routes    routes
	writes    map[pendingKey]*pending
	reads     map[pendingKey]*pending
	writeTTL  time.Duration
	readTTL   time.Duration
	lastSweep time.Time
	stats     workers.Stats
	errLast   map[string]time.Time
	// maxInstances bounds len(instances) (server.max_instances, live).
	maxInstances int
	// liveness is the reaper's settings; livenessChanged wakes RunReaper.
	liveness        Liveness
	livenessChanged chan struct{}
	// gone remembers the last maxGone reaped or removed instances.
	gone []workers.ContextInfo
	// gate admits pickle stores within server.max_inflight_pickle_mb.
	gate *pickleGate
	// The transfers carried across a restart (carry.go): the secret their
	// keys are hashed with, whether new entries get their carry key, and
	// whether carried entries were restored here.
	carryKey      []byte
	carrying      bool
	restoredCarry bool
}

// New builds the module from the engine's dependencies and the server and L1
// settings, passed through unchanged. The advertised pool info is computed
// once, here, from the pool's Decision alone: server.ShmName was spent on
// the plan the pool carried out (PlanSegment) and is not read again.
func New(deps Deps, server settings.ServerConfig, l1cfg settings.L1Config) (*Module, error) {
	if deps.Pool == nil || deps.Keys == nil || deps.Layouts == nil {
		return nil, errors.New("nongpu: Deps needs Pool, Keys and Layouts")
	}
	cs := deps.ChunkSize
	if cs <= 0 {
		cs = server.ChunkSize
	}
	if cs <= 0 {
		return nil, fmt.Errorf("nongpu: chunk size %d: must be positive", cs)
	}
	m := &Module{
		pool:      deps.Pool,
		resolver:  deps.Keys,
		layouts:   deps.Layouts,
		chunkSize: cs,
		log:       deps.Logger,
		emit:      deps.Events,
		published: deps.Published,
		committed: deps.Committed,
		now:       deps.Now,
		info:      PoolInfo(deps.Pool.Decision()),
		seed:      maphash.MakeSeed(),
		maxBytes:  server.MaxMessageBytes,
		instances: make(map[int64]*instance),
		routes:    routes{tables: make(map[int64]string), held: make(map[string]int64)},
		writes:    make(map[pendingKey]*pending),
		reads:     make(map[pendingKey]*pending),
		errLast:   make(map[string]time.Time),

		livenessChanged: make(chan struct{}, 1),
		gate:            newPickleGate(int64(server.MaxInflightPickleMB) << 20),
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.now == nil {
		m.now = time.Now
	}
	m.SetTTLs(time.Duration(l1cfg.WriteTTLSeconds)*time.Second, time.Duration(l1cfg.ReadTTLSeconds)*time.Second)
	m.SetMaxInstances(server.MaxInstances)
	m.log.Info("non-GPU transfer", "shm_name", m.info.ShmName, "pool_size", m.info.PoolSize, "reason", m.info.Reason)
	return m, nil
}

// SetMaxInflightPickle changes the bytes of pickled chunks admitted at once
// (server.max_inflight_pickle_mb: the engine sets it with each wire server
// it starts, since the module outlives a restart).
func (m *Module) SetMaxInflightPickle(bytes int64) { m.gate.setLimit(bytes) }

// SetTTLs changes how long pending writes and reads are kept (live setting;
// the pool's lock TTLs). A non-positive value keeps upstream's default.
func (m *Module) SetTTLs(write, read time.Duration) {
	if write <= 0 {
		write = 600 * time.Second
	}
	if read <= 0 {
		read = 300 * time.Second
	}
	m.mu.Lock()
	m.writeTTL, m.readTTL = write, read
	m.mu.Unlock()
}

// SetMaxInstances changes how many instances may be registered at once (live
// setting server.max_instances); a non-positive value takes
// DefaultMaxInstances. Lowering it below the current count unregisters
// nobody: only new registrations are refused until enough have left.
func (m *Module) SetMaxInstances(n int) {
	if n <= 0 {
		n = DefaultMaxInstances
	}
	m.mu.Lock()
	m.maxInstances = n
	m.mu.Unlock()
}

// PoolInfo is what registration advertises.
func (m *Module) PoolInfo() workers.Info { return m.info }

// ChunkSize is the server chunk size layouts are built with.
func (m *Module) ChunkSize() int { return m.chunkSize }

// event tells the operator: a log line and an event for the faces. An id
// of 0 is a module-wide event (restart's restore count): its line names no
// instance_id, which would read as a worker's.
func (m *Module) event(kind workers.EventKind, level slog.Level, id int64, msg string) {
	if id == 0 {
		m.log.Log(context.Background(), level, msg, "event", string(kind))
	} else {
		m.log.Log(context.Background(), level, msg, "event", string(kind), "instance_id", id)
	}
	if m.emit != nil {
		m.emit(workers.Event{Time: m.now(), Kind: kind, Level: level, Instance: id, Message: msg})
	}
}

// RegisterThrough handles REGISTER_KV_CACHE_NON_GPU_CONTEXT (spec 4.4) sent
// by the ZMQ peer peer (nil: unknown) under the protocol profile named
// profile (the reaper tells tables apart by it). A known id registered again
// from the peer that holds it (or from an unknown peer) keeps the first
// registration, as upstream. From another peer it is a new worker reusing the
// id (upstream's PID reuse in containers): once the new payload is validated,
// the old worker's pending writes are aborted (never published) and its reads
// released, and the new registration replaces the old, so the new worker
// never sees the old one's pending data.
func (m *Module) RegisterThrough(p protocol.RegisterPayload, peer []byte, profile string) (protocol.RegisterResponse, error) {
	resp := protocol.RegisterResponse{ShmName: m.info.ShmName, PoolSize: m.info.PoolSize}
	now := m.now()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return protocol.RegisterResponse{}, ErrClosed
	}
	old, known := m.instances[p.InstanceID]
	// A restored registration no peer spoke for yet is its worker's, which
	// registers again with the same payload after a reconnect (newer
	// clients do); another payload is a new worker reusing the id.
	unheld := old != nil && old.peer == "" && (!old.restored || samePayload(old.p, p))
	if known && (len(peer) == 0 || unheld || old.peer == string(peer)) {
		old.last = now
		m.notePeerLocked(old, peer, now)
		m.mu.Unlock()
		m.rateLimited("register/again", func() {
			m.event(workers.EventRegister, slog.LevelWarn, p.InstanceID,
				fmt.Sprintf("instance %d registered again: keeping the first registration", p.InstanceID))
		})
		return resp, nil
	}
	// Checked before the payload is validated, so a flood of new ids past
	// the limit costs a map lookup each.
	if !known {
		if err := m.roomLocked(p.InstanceID); err != nil {
			m.mu.Unlock()
			m.refused(p.InstanceID, err)
			return protocol.RegisterResponse{}, err
		}
	}
	m.mu.Unlock()

	groups, err := m.validate(p)
	if err != nil {
		err = fmt.Errorf("register instance %d: %w", p.InstanceID, err)
		m.event(workers.EventError, slog.LevelError, p.InstanceID, err.Error())
		return protocol.RegisterResponse{}, err
	}
	mode, reason := workers.ModePickle, m.info.Reason
	if m.info.Shared() {
		mode = workers.ModeSHM
		reason = "shared segment " + m.info.ShmName
	}
	lay := groups[0]
	inst := &instance{id: p.InstanceID, p: p, lay: lay, groups: groups, mode: mode, reason: reason, registered: now, last: now,
		peer: string(peer), peerSeen: now, profile: profile, tentative: profile == "" && len(peer) > 0}

	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return protocol.RegisterResponse{}, ErrClosed
	}
	cur, ok := m.instances[p.InstanceID]
	replacing := ok && known && cur == old
	if ok && !replacing {
		// A concurrent registration of the same id won; same answer.
		m.mu.Unlock()
		return resp, nil
	}
	if !ok {
		if err := m.roomLocked(p.InstanceID); err != nil {
			m.mu.Unlock()
			m.refused(p.InstanceID, err)
			return protocol.RegisterResponse{}, err
		}
	}
	// Each layout of a model is its own entry, its keys apart (layout.ID
	// in every key), so another layout registered for the model first
	// does not stand in the way; only an ID collision is refused.
	if inst.layoutID, err = m.layouts.AddGroups(p.ModelName, p.WorldSize, groups); err != nil {
		holders := m.holdersLocked(p.ModelName, p.WorldSize, p.InstanceID)
		m.stats.Conflicts++
		m.mu.Unlock()
		err := fmt.Errorf("register instance %d from %s: %w: %s, %s registered model %s world size %d: %v",
			p.InstanceID, peerText(string(peer)), ErrLayoutConflict, groupsText(groups), holders, quoteBounded(p.ModelName), p.WorldSize, err)
		m.event(workers.EventError, slog.LevelError, p.InstanceID, err.Error())
		return protocol.RegisterResponse{}, err
	}
	if replacing {
		m.layouts.Remove(old.p.ModelName, old.p.WorldSize, old.layoutID)
	}
	var writes, reads []*pending
	if replacing {
		writes, reads = m.takePendingLocked(func(k pendingKey) bool { return k.instance == p.InstanceID })
		m.stats.Reused++
	}
	m.forgetGoneLocked(p.InstanceID)
	m.putLocked(inst)
	m.mu.Unlock()

	if replacing {
		m.discard(writes, reads)
		// Rate-limited: two peers taking an id in turns must not flood the
		// log; Stats.Reused counts every one.
		m.rateLimited("register/reused", func() {
			m.event(workers.EventReused, slog.LevelWarn, p.InstanceID, fmt.Sprintf(
				"instance %d registered from %s while %s held it: taken as a new worker; the old one's %d pending writes (never published) and %d pending reads abandoned to their TTL",
				p.InstanceID, peerText(string(peer)), peerText(old.peer), len(writes), len(reads)))
		})
	}

	m.event(workers.EventRegister, slog.LevelInfo, p.InstanceID, fmt.Sprintf(
		"instance %d registered: model %s, world size %d, layout %s, %s (%s)",
		p.InstanceID, p.ModelName, p.WorldSize, groupsText(groups), mode, reason))
	return resp, nil
}

// samePayload reports whether two registrations carry the same fields.
func samePayload(a, b protocol.RegisterPayload) bool {
	return a.InstanceID == b.InstanceID && a.ModelName == b.ModelName && a.WorldSize == b.WorldSize &&
		a.BlockSize == b.BlockSize && a.NumLayers == b.NumLayers && a.HiddenDimSize == b.HiddenDimSize &&
		a.DtypeStr == b.DtypeStr && a.UseMLA == b.UseMLA && slices.Equal(a.GroupLayouts, b.GroupLayouts)
}

// maxHoldersShown bounds the registrations a conflict event names.
const maxHoldersShown = 4

// holdersLocked names the registrations of model and world size (other than
// instance except) with their peers, for the operator: "instance 7 (peer
// 0a0b…)", at most maxHoldersShown and a count of the rest. m.mu is held.
func (m *Module) holdersLocked(model string, worldSize int, except int64) string {
	var ids []int64
	for id, inst := range m.instances {
		if id != except && inst.p.ModelName == model && inst.p.WorldSize == worldSize {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return "an instance being replaced"
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	var parts []string
	for _, id := range ids[:min(len(ids), maxHoldersShown)] {
		parts = append(parts, fmt.Sprintf("instance %d (%s)", id, peerText(m.instances[id].peer)))
	}
	if n := len(ids) - maxHoldersShown; n > 0 {
		parts = append(parts, fmt.Sprintf("%d more", n))
	}
	return strings.Join(parts, ", ")
}

// groupsText renders a model's layouts: the one layout of a plain model,
// "2 groups: [..] float16 | [..] float32" for a hybrid one.
func groupsText(groups []layout.Layout) string {
	if len(groups) == 1 {
		return groups[0].String()
	}
	parts := make([]string, len(groups))
	for i, l := range groups {
		parts[i] = l.String()
	}
	return fmt.Sprintf("%d groups: %s", len(groups), strings.Join(parts, " | "))
}

// roomLocked refuses a new instance when server.max_instances are
// registered. m.mu is held.
func (m *Module) roomLocked(id int64) error {
	if n, limit := len(m.instances), m.maxInstances; n >= limit {
		return fmt.Errorf("register instance %d: %w: %d registered, server.max_instances (--max-instances) is %d; unregister workers or raise the limit",
			id, ErrTooManyInstances, n, limit)
	}
	return nil
}

// refused tells the operator, at most once a second, that registrations are
// refused for lack of room.
func (m *Module) refused(id int64, err error) {
	m.rateLimited("register/full", func() { m.event(workers.EventError, slog.LevelWarn, id, err.Error()) })
}

// validate checks a registration in full and returns its layouts, one per
// KV group. A hybrid model (two or more group_layouts) gets one layout per
// group, each sized as upstream sizes it (layout.NewGroup); with fewer the
// flat fields describe the model, as upstream reads them, and a single
// group entry is still checked.
func (m *Module) validate(p protocol.RegisterPayload) ([]layout.Layout, error) {
	var bad []string
	if len(p.ModelName) > MaxModelNameBytes {
		bad = append(bad, fmt.Sprintf("model_name is %d bytes: at most %d", len(p.ModelName), MaxModelNameBytes))
	} else if err := keys.ValidateModel(p.ModelName); err != nil {
		bad = append(bad, err.Error())
	}
	if p.WorldSize < 1 || p.WorldSize > keys.MaxWorldSize {
		bad = append(bad, fmt.Sprintf("world_size = %d: must be between 1 and %d", p.WorldSize, keys.MaxWorldSize))
	}
	if p.BlockSize <= 0 {
		bad = append(bad, fmt.Sprintf("block_size = %d: must be > 0", p.BlockSize))
	}
	lay, err := layout.New(p.NumLayers, m.chunkSize, p.HiddenDimSize, p.DtypeStr, p.UseMLA)
	if err != nil {
		bad = append(bad, err.Error())
	}
	groups := []layout.Layout{lay}
	if n := len(p.GroupLayouts); n > layout.MaxGroups {
		bad = append(bad, fmt.Sprintf("%d group_layouts: at most %d KV groups", n, layout.MaxGroups))
	} else if n > 0 {
		gs := make([]layout.Layout, n)
		for i, g := range p.GroupLayouts {
			gl, err := layout.NewGroup(layout.Group{
				BlockSize: g.BlockSize, NumLayers: g.NumLayers, HiddenDimSize: g.HiddenDimSize,
				DtypeStr: g.DtypeStr, UseMLA: g.UseMLA, TokensPerBlock: g.TokensPerBlock,
			}, m.chunkSize)
			if err != nil {
				bad = append(bad, fmt.Sprintf("group %d: %v", i, err))
			}
			gs[i] = gl
		}
		if n > 1 {
			groups = gs
		}
	}
	if len(bad) > 0 {
		return nil, errors.New(strings.Join(bad, "; "))
	}
	return groups, nil
}

// UnregisterFrom handles UNREGISTER_KV_CACHE[_NON_GPU_CONTEXT] (spec 4.8)
// sent by the ZMQ peer peer. From another peer than the one holding the
// instance, while that one is alive (it spoke for the instance within the
// peer window), it is refused, counted and reported with both peers: one
// peer must not end another's registration by naming its id (the operator
// can, with POST /unregister). A registration a restart restored is held
// by its worker's previous connection until a peer speaks for it, and
// counts as alive for the peer window from its restore: an UNREGISTER
// before that is refused from every peer. From the holder, an unknown
// peer, or once the holder has gone silent (a worker that died or
// reconnected), it is Unregister. It reports whether the instance was
// unregistered.
func (m *Module) UnregisterFrom(id int64, peer []byte) bool {
	now := m.now()
	m.mu.Lock()
	inst, ok := m.instances[id]
	if ok && len(peer) > 0 && (inst.peer != "" || inst.restored) && inst.peer != string(peer) && m.peerAliveLocked(inst, now) {
		m.stats.RefusedUnregisters++
		holder, seen, window, restored := inst.peer, now.Sub(inst.peerSeen), m.peerWindowLocked(), inst.restored
		m.mu.Unlock()
		m.rateLimited("unregister/refused", func() {
			why := fmt.Sprintf("%s registered it and spoke for it %s ago", peerText(holder), seen.Round(time.Millisecond))
			if restored {
				why = fmt.Sprintf("a restart restored it %s ago and no peer has spoken for it since", seen.Round(time.Millisecond))
			}
			m.event(workers.EventUnregister, slog.LevelWarn, id, fmt.Sprintf(
				"UNREGISTER of instance %d from %s refused: %s (alive within %s); if it is not a worker of yours, remove it (POST /unregister, kvdock ctl unregister)",
				id, peerText(string(peer)), why, window))
		})
		return false
	}
	m.mu.Unlock()
	return m.Unregister(id)
}

// Unregister handles UNREGISTER_KV_CACHE[_NON_GPU_CONTEXT] (spec 4.8): the
// instance's pending writes are aborted (not published), its pending reads
// released, and its layout reference dropped. It reports whether the instance
// was registered; an unknown one is only a warning.
func (m *Module) Unregister(id int64) bool {
	m.mu.Lock()
	inst, ok := m.instances[id]
	if !ok {
		m.mu.Unlock()
		m.event(workers.EventUnregister, slog.LevelWarn, id, fmt.Sprintf("unregister of unknown instance %d ignored", id))
		return false
	}
	m.deleteLocked(inst)
	writes, reads := m.takePendingLocked(func(k pendingKey) bool { return k.instance == id })
	m.layouts.Remove(inst.p.ModelName, inst.p.WorldSize, inst.layoutID)
	m.mu.Unlock()

	m.discard(writes, reads)
	m.gate.forget(id)
	m.event(workers.EventUnregister, slog.LevelInfo, id, fmt.Sprintf(
		"instance %d unregistered (%s); %d pending writes (never published) and %d pending reads abandoned to their TTL",
		id, inst.p.ModelName, len(writes), len(reads)))
	return true
}

// Close discards all pending work and forgets every instance (engine stop or
// rebuild). Later requests fail with ErrClosed.
func (m *Module) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	writes, reads := m.takePendingLocked(func(pendingKey) bool { return true })
	for _, inst := range m.instances {
		m.layouts.Remove(inst.p.ModelName, inst.p.WorldSize, inst.layoutID)
		m.deleteLocked(inst)
	}
	m.mu.Unlock()
	m.discard(writes, reads)
	m.gate.close()
}

// takePendingLocked removes the pending entries whose key matches.
func (m *Module) takePendingLocked(match func(pendingKey) bool) (writes, reads []*pending) {
	for k, p := range m.writes {
		if match(k) {
			writes = append(writes, p)
			delete(m.writes, k)
		}
	}
	for k, p := range m.reads {
		if match(k) {
			reads = append(reads, p)
			delete(m.reads, k)
		}
	}
	return writes, reads
}

// discard abandons the holds of pending writes and reads whose instance was
// dropped (unregister, reap, removal, id reuse, close): the worker may still
// be copying, so the pool keeps their bytes until the holds' TTL and never
// publishes the writes.
func (m *Module) discard(writes, reads []*pending) {
	for _, p := range writes {
		m.pool.Abandon(p.res, nil)
	}
	for _, p := range reads {
		m.pool.Abandon(nil, p.refs)
	}
}

// lookupInstance returns the registered instance and notes the request time.
func (m *Module) lookupInstance(id int64) (*instance, error) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	inst, ok := m.instances[id]
	if !ok {
		return nil, fmt.Errorf("%w for instance %d", ErrNotRegistered, id)
	}
	inst.last = now
	inst.transferred = true // only prepare/commit requests look instances up
	return inst, nil
}

// modeOf returns the instance's current strategy.
func (m *Module) modeOf(inst *instance) workers.Mode {
	m.mu.Lock()
	defer m.mu.Unlock()
	return inst.mode
}

// keyRequest checks a worker-side key against its instance and derives the
// session request and the pending-map identity.
func (m *Module) keyRequest(inst *instance, k protocol.Key) (keys.KeyRequest, pendingKey, error) {
	if k.WorkerID == nil {
		return keys.KeyRequest{}, pendingKey{}, errors.New("worker_id is nil: worker-side requests need it")
	}
	if k.ModelName != inst.p.ModelName || k.WorldSize != inst.p.WorldSize {
		return keys.KeyRequest{}, pendingKey{}, fmt.Errorf("key for model %s world size %d does not match instance %d (model %q world size %d)",
			quoteBounded(k.ModelName), k.WorldSize, inst.id, inst.p.ModelName, inst.p.WorldSize)
	}
	req := keys.KeyRequest{
		RequestID: k.RequestID, Model: k.ModelName, WorldSize: k.WorldSize, Worker: k.WorkerID,
		Tokens: k.TokenIDs, Start: k.Start, End: k.End, Salt: k.CacheSalt, Layout: inst.layoutID,
	}
	pk := pendingKey{
		instance: inst.id, worldSize: k.WorldSize, worker: *k.WorkerID,
		nTokens: len(k.TokenIDs), tokens: m.hashTokens(k.TokenIDs), start: k.Start, end: k.End,
		nSalt: len(k.CacheSalt), salt: maphash.String(m.seed, k.CacheSalt),
	}
	return req, pk, nil
}

func (m *Module) hashTokens(ts []uint32) uint64 {
	var h maphash.Hash
	h.SetSeed(m.seed)
	var buf [4096]byte
	n := 0
	for _, t := range ts {
		buf[n], buf[n+1], buf[n+2], buf[n+3] = byte(t), byte(t>>8), byte(t>>16), byte(t>>24)
		n += 4
		if n == len(buf) {
			h.Write(buf[:])
			n = 0
		}
	}
	h.Write(buf[:n])
	return h.Sum64()
}

func (m *Module) resolve(inst *instance, k protocol.Key) ([]keys.ObjectKey, pendingKey, error) {
	ks, _, pk, err := m.resolveWith(inst, k, false)
	return ks, pk, err
}

// resolveStore is resolve for a store, which also returns the keys of the
// chunk before the key's first when the key starts mid-prompt (a worker
// storing only what LOOKUP missed): the pool links the stored chunks to
// it, so its prefix tree and usable bytes stay true. nil: the key starts
// the prompt.
func (m *Module) resolveStore(inst *instance, k protocol.Key) (ks, prev []keys.ObjectKey, pk pendingKey, err error) {
	return m.resolveWith(inst, k, true)
}

// resolveWith resolves k's keys and, with parent and a key starting
// mid-prompt, the keys of the chunk before its first (resolveStore).
func (m *Module) resolveWith(inst *instance, k protocol.Key, parent bool) (ks, prev []keys.ObjectKey, pk pendingKey, err error) {
	req, pk, err := m.keyRequest(inst, k)
	if err != nil {
		return nil, nil, pk, err
	}
	if ks, err = m.resolver.ObjectKeys(req); err != nil {
		return nil, nil, pk, fmt.Errorf("resolve keys: %w", err)
	}
	if !parent || k.Start < m.chunkSize || len(ks) == 0 {
		return ks, nil, pk, nil
	}
	req.Start, req.End = k.Start-m.chunkSize, k.Start
	if prev, err = m.resolver.ObjectKeys(req); err != nil {
		return nil, nil, pk, fmt.Errorf("resolve the keys before the store's first chunk: %w", err)
	}
	return ks, prev, pk, nil
}

// Contexts lists the registered instances, by id, then the last reaped or
// removed ones (state reaped or removed), by id.
func (m *Module) Contexts() []workers.ContextInfo {
	now := m.now()
	m.mu.Lock()
	out := make([]workers.ContextInfo, 0, len(m.instances)+len(m.gone))
	for _, inst := range m.instances {
		out = append(out, m.contextLocked(inst, now))
	}
	gone := append([]workers.ContextInfo(nil), m.gone...)
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].InstanceID < out[j].InstanceID })
	sort.Slice(gone, func(i, j int) bool { return gone[i].InstanceID < gone[j].InstanceID })
	return append(out, gone...)
}

// cloneLayouts copies a hybrid model's group layouts (nil for one group).
func cloneLayouts(gs []layout.Layout) []layout.Layout {
	if len(gs) < 2 {
		return nil
	}
	out := make([]layout.Layout, len(gs))
	for i, l := range gs {
		out[i] = layout.Layout{Shape: append([]int(nil), l.Shape...), Dtype: l.Dtype, Bytes: l.Bytes}
	}
	return out
}

// Stats returns the module-wide counters.
func (m *Module) Stats() workers.Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stats
	s.Instances = len(m.instances)
	s.PendingWrites = len(m.writes)
	s.PendingReads = len(m.reads)
	return s
}

// Status is upstream's report_status part of this module (spec 8):
// registered_non_cuda_instance_ids and non_cuda_context_meta.
func (m *Module) Status() map[string]any {
	ctxs := m.Contexts()
	ids := make([]int64, 0, len(ctxs))
	meta := make(map[string]any, len(ctxs))
	for _, c := range ctxs {
		if c.State == workers.StateReaped || c.State == workers.StateRemoved {
			continue
		}
		ids = append(ids, c.InstanceID)
		entry := map[string]any{
			"model_name": c.Model,
			"world_size": c.WorldSize,
			"block_size": c.BlockSize,
			"use_mla":    c.MLA,
		}
		if len(c.Groups) > 1 {
			entry["num_groups"] = len(c.Groups)
		}
		meta[strconv.FormatInt(c.InstanceID, 10)] = entry
	}
	return map[string]any{
		"registered_non_cuda_instance_ids": ids,
		"non_cuda_context_meta":            meta,
	}
}

// maxShown bounds how much of a peer's string an error quotes.
const maxShown = 64

// quoteBounded quotes s, cut to maxShown bytes with its full length noted, so
// an error about a huge value stays small.
func quoteBounded(s string) string {
	if len(s) <= maxShown {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:maxShown]) + "… (" + strconv.Itoa(len(s)) + " bytes)"
}
