package keys

import (
	"bytes"
	"container/list"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Session defaults. The TTL and sweep period match LMCache's session.py; the
// limits are kvdock's, to keep the table's memory bounded.
const (
	DefaultSessionTTL  = 600 * time.Second
	SessionSweepPeriod = 60 * time.Second
	DefaultMaxSessions = 8192
	// DefaultMaxBytes bounds the session table's memory: token copies (4 B
	// each), chunk digests (32 B each), ids and bookkeeping. 256 MiB holds
	// ~60 Mi cached tokens.
	DefaultMaxBytes = 256 << 20
	// DefaultMaxRequestTokens bounds the tokens of one key request. It is the
	// wire decoder's cap (2 Mi tokens, 8 MiB of token ids), repeated here
	// because the key functions must not rely on the decoder.
	DefaultMaxRequestTokens = 2 << 20
)

// Limits bound what the session table holds; a zero field means its default.
type Limits struct {
	// MaxSessions bounds the number of sessions (DefaultMaxSessions).
	MaxSessions int
	// MaxBytes bounds the memory of all sessions together, in bytes
	// (DefaultMaxBytes).
	MaxBytes int64
	// MaxRequestTokens bounds the tokens of one key request; longer requests
	// are rejected before anything is hashed or kept
	// (DefaultMaxRequestTokens).
	MaxRequestTokens int
}

func (l Limits) withDefaults() Limits {
	l.MaxSessions = positiveOr(l.MaxSessions, DefaultMaxSessions)
	l.MaxBytes = positiveOr(l.MaxBytes, DefaultMaxBytes)
	l.MaxRequestTokens = positiveOr(l.MaxRequestTokens, DefaultMaxRequestTokens)
	return l
}

// Per-session bookkeeping counted on top of its ids, tokens and digests: the
// session struct, its list element and map entry, and the lookup key.
const (
	sessionOverhead = 256
	lookupOverhead  = 64
)

// KeyRequest is the decoded IPC key of one request (IPCCacheEngineKey) in the
// form the key functions need.
type KeyRequest struct {
	RequestID, Model string
	WorldSize        int
	Worker           *int // nil = every rank
	Tokens           []uint32
	Start, End       int
	Salt             string
	// Layout is the layout ID worker-side keys name (ObjectKey.Layout); 0
	// for keys built without one.
	Layout uint64
}

// Sessions caches the chunk hashes of each request's prompt, keyed by
// request id, so that the scheduler's LOOKUP and every worker's
// PREPARE_STORE/PREPARE_RETRIEVE of the same prompt hash it once.
//
// A session lives TTL from its creation (600 s by default, as upstream); it
// expires lazily on any access and in the periodic Sweep. Memory is
// bounded (SetLimits): a request carries at most MaxRequestTokens tokens and a
// request id of at most MaxRequestIDLen bytes, and the table holds at most
// MaxSessions sessions and MaxBytes bytes in total; past either limit the
// oldest sessions are dropped first, which only costs a re-hash if their
// request comes back. A single session larger than MaxBytes is kept while it
// is the one in use.
//
// Sessions is safe for concurrent use; hashing runs under a per-session lock
// so different requests hash in parallel.
type Sessions struct {
	h   *Hasher
	ttl time.Duration
	now func() time.Time

	mu     sync.Mutex
	byID   map[string]*session
	order  *list.List // of *session, creation order, oldest first
	limits Limits
	bytes  int64 // sum of session.cost over byID
	tokens int   // sum of session.ntok over byID

	maxReqTokens atomic.Int64 // limits.MaxRequestTokens, read without mu

	created, expired, evicted atomic.Int64
	hashed, reused            atomic.Int64
}

type session struct {
	id      string
	created time.Time
	elem    *list.Element
	cost    int64 // bytes accounted in Sessions.bytes; guarded by Sessions.mu
	ntok    int   // tokens accounted in Sessions.tokens; guarded by Sessions.mu

	mu     sync.Mutex
	tokens []uint32 // tokens of the cached full chunks (a private copy)
	hashes []Hash   // len(tokens)/chunkSize digests
	lookup *lookupKey
}

// lookupKey is what END_SESSION needs of the scheduler's LOOKUP key. Its
// hashes are a private copy, never modified: KeySets share them.
type lookupKey struct {
	model     string
	worldSize int
	salt      string
	hashes    []Hash
}

// costLocked is the memory sess holds, in bytes; sess.mu must be held.
func (sess *session) costLocked() int64 {
	c := int64(sessionOverhead + len(sess.id) + 4*cap(sess.tokens) + len(Hash{})*cap(sess.hashes))
	if lk := sess.lookup; lk != nil {
		c += int64(lookupOverhead + len(lk.model) + len(lk.salt) + len(Hash{})*cap(lk.hashes))
	}
	return c
}

// SessionStats is a snapshot of the session table.
type SessionStats struct {
	Active       int   // sessions held now
	CachedTokens int   // tokens held in session caches
	CachedBytes  int64 // memory the sessions hold, as counted against MaxBytes
	Created      int64 // sessions created
	Expired      int64 // sessions dropped by TTL
	Evicted      int64 // sessions dropped by the MaxSessions/MaxBytes limits
	ChunksHashed int64 // chunk digests computed
	ChunksReused int64 // chunk digests served from a session cache
}

// NewSessions returns an empty session table using h, with the default
// Limits. ttl <= 0 means DefaultSessionTTL; a nil now means time.Now.
func NewSessions(h *Hasher, ttl time.Duration, now func() time.Time) *Sessions {
	if ttl <= 0 {
		ttl = DefaultSessionTTL
	}
	if now == nil {
		now = time.Now
	}
	s := &Sessions{
		h:      h,
		ttl:    ttl,
		now:    now,
		byID:   make(map[string]*session),
		order:  list.New(),
		limits: Limits{}.withDefaults(),
	}
	s.maxReqTokens.Store(int64(s.limits.MaxRequestTokens))
	return s
}

// Hasher returns the hasher the sessions use.
func (s *Sessions) Hasher() *Hasher { return s.h }

// SetLimits changes the memory bounds; a zero field restores its default.
// Sessions over the new limits are evicted, oldest first.
func (s *Sessions) SetLimits(l Limits) {
	l = l.withDefaults()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limits = l
	s.maxReqTokens.Store(int64(l.MaxRequestTokens))
	s.enforceLocked(nil)
}

// Limits returns the bounds in force.
func (s *Sessions) Limits() Limits {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limits
}

// ObjectKeys resolves a worker-side key into its keys, materialised: see
// Keys. Meant for one worker's rank (a bounded number of keys); callers that
// expand every rank should walk Keys instead.
func (s *Sessions) ObjectKeys(r KeyRequest) ([]ObjectKey, error) {
	ks, err := s.Keys(r)
	if err != nil {
		return nil, err
	}
	return ks.All(), nil
}

// Keys resolves a worker-side key: the session of r.RequestID takes
// r.Tokens, and the keys of chunks [r.Start, r.End) for r.Worker (nil = every
// rank) come back as a KeySet, chunk-major, rank-minor. Start and End must be
// multiples of the chunk size with 0 <= Start <= End <= len(r.Tokens).
func (s *Sessions) Keys(r KeyRequest) (KeySet, error) {
	if err := s.validateKey(r); err != nil {
		return KeySet{}, err
	}
	cs := s.h.chunkSize
	if r.Start%cs != 0 || r.End%cs != 0 {
		return KeySet{}, fmt.Errorf("request %s: start %d and end %d must be multiples of the chunk size %d", Clip(r.RequestID), r.Start, r.End, cs)
	}
	if r.Start < 0 || r.Start > r.End {
		return KeySet{}, fmt.Errorf("request %s: start %d must be between 0 and end %d", Clip(r.RequestID), r.Start, r.End)
	}
	if r.End > len(r.Tokens) {
		return KeySet{}, fmt.Errorf("request %s: end %d is past the %d tokens sent", Clip(r.RequestID), r.End, len(r.Tokens))
	}
	sess := s.acquire(r.RequestID)
	sess.mu.Lock()
	hashes := s.hashesLocked(sess, r.Tokens)
	// A copy: the cache's digests change when the prompt diverges.
	ks := newKeySet(append([]Hash(nil), hashes[r.Start/cs:r.End/cs]...), r.Model, r.WorldSize, r.Worker, r.Salt).WithLayout(r.Layout)
	cost, ntok := sess.costLocked(), len(sess.tokens)
	sess.mu.Unlock()
	s.account(sess, cost, ntok)
	return ks, nil
}

// LookupKeys resolves a scheduler-side LOOKUP key: every full chunk of
// r.Tokens (Start and End are ignored), for every rank (r.Worker is ignored),
// chunk-major, rank-minor. The session remembers the key for End. No full
// chunk gives an empty set and leaves the sessions untouched, as upstream
// returns before it reaches the session.
func (s *Sessions) LookupKeys(r KeyRequest) (KeySet, error) {
	r.Worker = nil
	if err := s.validateKey(r); err != nil {
		return KeySet{}, err
	}
	if s.h.FullChunks(len(r.Tokens)) == 0 {
		return KeySet{}, nil
	}
	sess := s.acquire(r.RequestID)
	sess.mu.Lock()
	hashes := s.hashesLocked(sess, r.Tokens)
	lk := &lookupKey{model: strings.Clone(r.Model), worldSize: r.WorldSize, salt: strings.Clone(r.Salt), hashes: append([]Hash(nil), hashes...)}
	sess.lookup = lk
	cost, ntok := sess.costLocked(), len(sess.tokens)
	sess.mu.Unlock()
	s.account(sess, cost, ntok)
	return newKeySet(lk.hashes, lk.model, lk.worldSize, nil, lk.salt), nil
}

// End removes the session of requestID and returns the keys of its LOOKUP
// key (chunk 0 to the last full chunk, every rank) for an LRU touch. ok is
// false when there was no live session; the set is empty when the session
// never saw a LOOKUP.
func (s *Sessions) End(requestID string) (ks KeySet, ok bool) {
	now := s.now()
	s.mu.Lock()
	s.expireLocked(now)
	sess, ok := s.byID[requestID]
	if ok {
		s.removeLocked(sess)
	}
	s.mu.Unlock()
	if !ok {
		return KeySet{}, false
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if lk := sess.lookup; lk != nil {
		ks = newKeySet(lk.hashes, lk.model, lk.worldSize, nil, lk.salt)
	}
	return ks, true
}

// Len returns the number of live sessions.
func (s *Sessions) Len() int {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
	return len(s.byID)
}

// Sweep drops expired sessions and returns how many went.
func (s *Sessions) Sweep() int {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.expireLocked(now)
}

// Stats returns a snapshot of the counters.
func (s *Sessions) Stats() SessionStats {
	s.mu.Lock()
	active, tokens, bytes := len(s.byID), s.tokens, s.bytes
	s.mu.Unlock()
	return SessionStats{
		Active:       active,
		CachedTokens: tokens,
		CachedBytes:  bytes,
		Created:      s.created.Load(),
		Expired:      s.expired.Load(),
		Evicted:      s.evicted.Load(),
		ChunksHashed: s.hashed.Load(),
		ChunksReused: s.reused.Load(),
	}
}

// validateKey checks every field of r before anything is hashed or kept.
func (s *Sessions) validateKey(r KeyRequest) error {
	if err := ValidateRequestID(r.RequestID); err != nil {
		return err
	}
	if max := s.maxReqTokens.Load(); int64(len(r.Tokens)) > max {
		return fmt.Errorf("request %s: %d tokens: at most %d per request", Clip(r.RequestID), len(r.Tokens), max)
	}
	if err := ValidateModel(r.Model); err != nil {
		return fmt.Errorf("request %s: %w", Clip(r.RequestID), err)
	}
	if err := ValidateSalt(r.Salt); err != nil {
		return fmt.Errorf("request %s: %w", Clip(r.RequestID), err)
	}
	if err := validateRanks(r.WorldSize, r.Worker); err != nil {
		return fmt.Errorf("request %s: %w", Clip(r.RequestID), err)
	}
	return nil
}

// acquire returns the live session of id, creating it if needed.
func (s *Sessions) acquire(id string) *session {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
	if sess, ok := s.byID[id]; ok {
		return sess
	}
	// A clone: the id must not pin the buffer the request was decoded from.
	sess := &session{id: strings.Clone(id), created: now}
	sess.cost = sess.costLocked() // not shared yet
	sess.elem = s.order.PushBack(sess)
	s.byID[sess.id] = sess
	s.bytes += sess.cost
	s.created.Add(1)
	s.enforceLocked(sess)
	return sess
}

// account records the size of sess after hashing and enforces the bounds,
// sparing sess itself.
func (s *Sessions) account(sess *session, cost int64, ntok int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID[sess.id] != sess {
		return // evicted or ended meanwhile; its memory goes with it
	}
	s.bytes += cost - sess.cost
	s.tokens += ntok - sess.ntok
	sess.cost, sess.ntok = cost, ntok
	s.enforceLocked(sess)
}

// expireLocked pops expired sessions off the front of the creation order.
func (s *Sessions) expireLocked(now time.Time) int {
	n := 0
	for e := s.order.Front(); e != nil; e = s.order.Front() {
		sess := e.Value.(*session)
		if now.Sub(sess.created) < s.ttl {
			break
		}
		s.removeLocked(sess)
		n++
	}
	s.expired.Add(int64(n))
	return n
}

// enforceLocked evicts the oldest sessions, except keep, until both limits hold.
func (s *Sessions) enforceLocked(keep *session) {
	for len(s.byID) > s.limits.MaxSessions || s.bytes > s.limits.MaxBytes {
		e := s.order.Front()
		if e != nil && e.Value.(*session) == keep {
			e = e.Next()
		}
		if e == nil {
			return
		}
		s.removeLocked(e.Value.(*session))
		s.evicted.Add(1)
	}
}

func (s *Sessions) removeLocked(sess *session) {
	s.order.Remove(sess.elem)
	delete(s.byID, sess.id)
	s.bytes -= sess.cost
	s.tokens -= sess.ntok
	sess.cost, sess.ntok = 0, 0
}

// hashesLocked makes sess's cache agree with tokens and returns the digests
// of tokens' full chunks. The cache keeps the longest agreeing prefix: a list
// that extends the cached one hashes only its new chunks, a shorter list that
// agrees is served from the cache, and a list that diverges is re-hashed from
// the first chunk that differs (the chain makes every later digest depend on
// it). The returned slice aliases the cache; use it under sess.mu only.
func (s *Sessions) hashesLocked(sess *session, tokens []uint32) []Hash {
	cs := s.h.chunkSize
	full := len(tokens) / cs * cs
	common := min(len(sess.tokens), full)
	keep := agreeingChunks(sess.tokens[:common], tokens[:common], cs)
	if keep*cs < common {
		// Diverged: drop the cache from the first differing chunk on.
		sess.tokens = sess.tokens[:keep*cs]
		sess.hashes = sess.hashes[:keep]
	}
	if full > len(sess.tokens) {
		before := len(sess.hashes)
		sess.tokens = append(sess.tokens, tokens[len(sess.tokens):full]...)
		sess.hashes = s.h.extend(sess.hashes, sess.tokens)
		s.hashed.Add(int64(len(sess.hashes) - before))
		s.reused.Add(int64(before))
	} else {
		s.reused.Add(int64(full / cs))
	}
	return sess.hashes[:full/cs]
}

// agreeingChunks returns how many leading whole chunks a and b (equal
// lengths, a multiple of cs) share. It compares as bytes so the common case,
// a prompt that only grew, costs one vectorised memory compare.
func agreeingChunks(a, b []uint32, cs int) int {
	ab, bb := u32bytes(a), u32bytes(b)
	if bytes.Equal(ab, bb) {
		return len(a) / cs
	}
	step := 4 * cs
	i := 0
	for i+step <= len(ab) && bytes.Equal(ab[i:i+step], bb[i:i+step]) {
		i += step
	}
	return i / step
}

// u32bytes views a token slice as its bytes (host order; only compared).
func u32bytes(v []uint32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

// positiveOr is v, or def where v is not positive: an option left unset
// takes its default. Each core leaf keeps its own, so none imports settings.
func positiveOr[T ~int | ~int64 | ~float64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}
