package keys

import (
	"bytes"
	"container/list"
	"context"
	"fmt"
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
	DefaultMaxTokens   = 64 << 20 // 64 Mi cached tokens ≈ 256 MiB of token copies
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
}

// Sessions caches the chunk hashes of each request's prompt, keyed by
// request id, so that the scheduler's LOOKUP and every worker's
// PREPARE_STORE/PREPARE_RETRIEVE of the same prompt hash it once.
//
// A session lives TTL from its creation (600 s by default, as upstream); it
// expires lazily on any access and in the periodic sweep of Run. Memory is
// bounded: at most MaxSessions sessions and MaxTokens cached tokens in total
// (SetLimits); past either limit the oldest sessions are dropped first, which
// only costs a re-hash if their request comes back. A single session larger
// than MaxTokens is kept while it is the one in use.
//
// Sessions is safe for concurrent use; hashing runs under a per-session lock
// so different requests hash in parallel.
type Sessions struct {
	h   *Hasher
	ttl time.Duration
	now func() time.Time

	mu          sync.Mutex
	byID        map[string]*session
	order       *list.List // of *session, creation order, oldest first
	maxSessions int
	maxTokens   int
	tokens      int // sum of session.cost over byID

	created, expired, evicted atomic.Int64
	hashed, reused            atomic.Int64
}

type session struct {
	id      string
	created time.Time
	elem    *list.Element
	cost    int // tokens accounted in Sessions.tokens; guarded by Sessions.mu

	mu     sync.Mutex
	tokens []uint32 // tokens of the cached full chunks (a private copy)
	hashes []Hash   // len(tokens)/chunkSize digests
	lookup *lookupKey
}

// lookupKey is what END_SESSION needs of the scheduler's LOOKUP key.
type lookupKey struct {
	model     string
	worldSize int
	salt      string
	hashes    []Hash
}

// SessionStats is a snapshot of the session table.
type SessionStats struct {
	Active       int   // sessions held now
	CachedTokens int   // tokens held in session caches
	Created      int64 // sessions created
	Expired      int64 // sessions dropped by TTL
	Evicted      int64 // sessions dropped by the MaxSessions/MaxTokens limits
	ChunksHashed int64 // chunk digests computed
	ChunksReused int64 // chunk digests served from a session cache
}

// NewSessions returns an empty session table using h. ttl <= 0 means
// DefaultSessionTTL; a nil now means time.Now.
func NewSessions(h *Hasher, ttl time.Duration, now func() time.Time) *Sessions {
	if ttl <= 0 {
		ttl = DefaultSessionTTL
	}
	if now == nil {
		now = time.Now
	}
	return &Sessions{
		h:           h,
		ttl:         ttl,
		now:         now,
		byID:        make(map[string]*session),
		order:       list.New(),
		maxSessions: DefaultMaxSessions,
		maxTokens:   DefaultMaxTokens,
	}
}

// Hasher returns the hasher the sessions use.
func (s *Sessions) Hasher() *Hasher { return s.h }

// SetLimits changes the memory bounds; a value <= 0 restores its default.
// Sessions over the new limits are evicted, oldest first.
func (s *Sessions) SetLimits(maxSessions, maxTokens int) {
	if maxSessions <= 0 {
		maxSessions = DefaultMaxSessions
	}
	if maxTokens <= 0 {
		maxTokens = DefaultMaxTokens
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxSessions, s.maxTokens = maxSessions, maxTokens
	s.enforceLocked(nil)
}

// ObjectKeys resolves a worker-side key: the session of r.RequestID takes
// r.Tokens, and the keys of chunks [r.Start, r.End) for r.Worker (nil = every
// rank) come back chunk-major, rank-minor. Start and End must be multiples of
// the chunk size with 0 <= Start <= End <= len(r.Tokens).
func (s *Sessions) ObjectKeys(r KeyRequest) ([]ObjectKey, error) {
	if err := validateKey(r); err != nil {
		return nil, err
	}
	cs := s.h.chunkSize
	if r.Start%cs != 0 || r.End%cs != 0 {
		return nil, fmt.Errorf("request %q: start %d and end %d must be multiples of the chunk size %d", r.RequestID, r.Start, r.End, cs)
	}
	if r.Start < 0 || r.Start > r.End {
		return nil, fmt.Errorf("request %q: start %d must be between 0 and end %d", r.RequestID, r.Start, r.End)
	}
	if r.End > len(r.Tokens) {
		return nil, fmt.Errorf("request %q: end %d is past the %d tokens sent", r.RequestID, r.End, len(r.Tokens))
	}
	sess := s.acquire(r.RequestID)
	sess.mu.Lock()
	hashes := s.hashesLocked(sess, r.Tokens)
	ks := ObjectKeys(hashes[r.Start/cs:r.End/cs], r.Model, r.WorldSize, r.Worker, r.Salt)
	cost := len(sess.tokens)
	sess.mu.Unlock()
	s.account(sess, cost)
	return ks, nil
}

// LookupKeys resolves a scheduler-side LOOKUP key: every full chunk of
// r.Tokens (Start and End are ignored), for every rank (r.Worker is ignored),
// chunk-major, rank-minor. The session remembers the key for End. No full
// chunk gives no keys and leaves the sessions untouched, as upstream returns
// before it reaches the session.
func (s *Sessions) LookupKeys(r KeyRequest) ([]ObjectKey, error) {
	r.Worker = nil
	if err := validateKey(r); err != nil {
		return nil, err
	}
	if s.h.FullChunks(len(r.Tokens)) == 0 {
		return nil, nil
	}
	sess := s.acquire(r.RequestID)
	sess.mu.Lock()
	hashes := s.hashesLocked(sess, r.Tokens)
	sess.lookup = &lookupKey{model: r.Model, worldSize: r.WorldSize, salt: r.Salt, hashes: append([]Hash(nil), hashes...)}
	ks := ObjectKeys(hashes, r.Model, r.WorldSize, nil, r.Salt)
	cost := len(sess.tokens)
	sess.mu.Unlock()
	s.account(sess, cost)
	return ks, nil
}

// End removes the session of requestID and returns the keys of its LOOKUP
// key (chunk 0 to the last full chunk, every rank) for an LRU touch. ok is
// false when there was no live session; keys is nil when the session never
// saw a LOOKUP.
func (s *Sessions) End(requestID string) (ks []ObjectKey, ok bool) {
	now := s.now()
	s.mu.Lock()
	s.expireLocked(now)
	sess, ok := s.byID[requestID]
	if ok {
		s.removeLocked(sess)
	}
	s.mu.Unlock()
	if !ok {
		return nil, false
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if lk := sess.lookup; lk != nil {
		ks = ObjectKeys(lk.hashes, lk.model, lk.worldSize, nil, lk.salt)
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

// Run sweeps expired sessions every SessionSweepPeriod until ctx is done.
func (s *Sessions) Run(ctx context.Context) {
	t := time.NewTicker(SessionSweepPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Sweep()
		}
	}
}

// Stats returns a snapshot of the counters.
func (s *Sessions) Stats() SessionStats {
	s.mu.Lock()
	active, tokens := len(s.byID), s.tokens
	s.mu.Unlock()
	return SessionStats{
		Active:       active,
		CachedTokens: tokens,
		Created:      s.created.Load(),
		Expired:      s.expired.Load(),
		Evicted:      s.evicted.Load(),
		ChunksHashed: s.hashed.Load(),
		ChunksReused: s.reused.Load(),
	}
}

func validateKey(r KeyRequest) error {
	if err := ValidateModel(r.Model); err != nil {
		return fmt.Errorf("request %q: %w", r.RequestID, err)
	}
	if err := ValidateSalt(r.Salt); err != nil {
		return fmt.Errorf("request %q: %w", r.RequestID, err)
	}
	if err := validateRanks(r.WorldSize, r.Worker); err != nil {
		return fmt.Errorf("request %q: %w", r.RequestID, err)
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
	sess := &session{id: id, created: now}
	sess.elem = s.order.PushBack(sess)
	s.byID[id] = sess
	s.created.Add(1)
	s.enforceLocked(sess)
	return sess
}

// account records the cached size of sess after hashing and enforces the
// token bound, sparing sess itself.
func (s *Sessions) account(sess *session, cost int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID[sess.id] != sess {
		return // evicted or ended meanwhile; its memory goes with it
	}
	s.tokens += cost - sess.cost
	sess.cost = cost
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
	for len(s.byID) > s.maxSessions || s.tokens > s.maxTokens {
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
	s.tokens -= sess.cost
	sess.cost = 0
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
