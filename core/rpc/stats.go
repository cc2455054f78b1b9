package rpc

import (
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"kvdock/core/protocol"
)

// RequestStats are the counters of one request type.
type RequestStats struct {
	OK, Error, Dropped int64
	// Latency is the summed handling time (decode to reply queued) of all
	// outcomes; Count is how many were summed.
	Latency time.Duration
	Count   int64
}

// Stats is a snapshot of the server's counters.
type Stats struct {
	Profile  string
	Endpoint string
	// Requests by wire name (every request of the profile is present).
	Requests map[string]RequestStats
	// BadInput by kind: protocol.Kind* constants (KindCUDAUnsupported is the
	// shipped profiles' unsupported kind; a profile may name others).
	BadInput map[string]int64
	// DecodeFailures by wire name: wrong arity or undecodable payload of a
	// known type, the mark of a wrong --protocol.
	DecodeFailures map[string]int64
	InFlight       int64
	// Disconnects counts peer disconnects seen on the ROUTER, including those
	// libzmq forces on a peer that sent a frame over MaxMessageBytes.
	Disconnects int64
	// HandoverLost counts requests that arrived after a handover's last
	// answer, down a connection already shut: never answered.
	HandoverLost int64
	// HandoverParked counts the requests a handover parked and answered.
	HandoverParked int64
	// QueuedRequestBytes is the payload bytes of requests queued for the
	// workers now; BudgetWaits counts requests that found the budget full
	// (the server stopped reading until it had room).
	QueuedRequestBytes int64
	BudgetWaits        int64
	// InFlightBytes is the large request frames held now (see
	// Options.InFlightBytes); InFlightWaits counts the times the server
	// stopped reading because of them.
	InFlightBytes int64
	InFlightWaits int64
	// WaitingReplyBytes is the bytes of replies waiting in kvdock for peers
	// that do not read; RepliesDropped counts replies dropped because their
	// peer's reply budget was full or the peer was gone (not bad input: a
	// worker that exits with requests in flight is not misbehaving).
	WaitingReplyBytes int64
	RepliesDropped    int64
	// Detections counts peers settled on each profile (--protocol auto).
	Detections map[string]int64
	// AmbiguousDetections counts the peers among Detections settled by the
	// tie-break, their messages never telling the tables apart.
	AmbiguousDetections int64
}

type reqCounters struct {
	ok, err, dropped, count, latency, decodeFail atomic.Int64
}

type stats struct {
	profile        string
	req            map[string]*reqCounters // fixed at construction
	inFlight       atomic.Int64
	disconnects    atomic.Int64
	handoverLost   atomic.Int64
	handoverParked atomic.Int64
	budgetWaits    atomic.Int64
	inflightWaits  atomic.Int64
	replyBytes     atomic.Int64
	repliesDropped atomic.Int64
	ambiguous      atomic.Int64
	mu             sync.Mutex
	badKinds       map[string]int64
	detections     map[string]int64
}

// newStats counts the requests of every profile given (the first names the
// server's profile; auto-detection serves several).
func newStats(ps ...*protocol.Profile) *stats {
	st := &stats{profile: ps[0].Name, req: map[string]*reqCounters{}, badKinds: map[string]int64{},
		detections: map[string]int64{}}
	for _, p := range ps {
		for _, r := range p.Requests {
			if st.req[r.Name] == nil {
				st.req[r.Name] = &reqCounters{}
			}
		}
	}
	return st
}

// detected counts one peer settled on profile (--protocol auto), guessed
// by the tie-break when ambiguous.
func (st *stats) detected(profile string, ambiguous bool) {
	if ambiguous {
		st.ambiguous.Add(1)
	}
	st.mu.Lock()
	st.detections[profile]++
	st.mu.Unlock()
}

func (st *stats) request(name, outcome string, d time.Duration) {
	c := st.req[name]
	if c == nil {
		return
	}
	switch outcome {
	case OutcomeOK:
		c.ok.Add(1)
	case OutcomeError:
		c.err.Add(1)
	default:
		c.dropped.Add(1)
	}
	c.count.Add(1)
	c.latency.Add(int64(d))
}

func (st *stats) decodeFail(name string) int64 {
	if c := st.req[name]; c != nil {
		return c.decodeFail.Add(1)
	}
	return 0
}

func (st *stats) bad(kind string) {
	st.mu.Lock()
	st.badKinds[kind]++
	st.mu.Unlock()
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	st := s.stats
	out := Stats{
		Profile:        st.profile,
		Endpoint:       s.Endpoint(),
		Requests:       make(map[string]RequestStats, len(st.req)),
		DecodeFailures: map[string]int64{},
		InFlight:       st.inFlight.Load(),
		Disconnects:    st.disconnects.Load(),
		HandoverLost:   st.handoverLost.Load(),
		HandoverParked: st.handoverParked.Load(),

		QueuedRequestBytes: s.in.queued(),
		BudgetWaits:        st.budgetWaits.Load(),
		InFlightBytes:      s.inflight.Load(),
		InFlightWaits:      st.inflightWaits.Load(),
		WaitingReplyBytes:  st.replyBytes.Load(),
		RepliesDropped:     st.repliesDropped.Load(),

		AmbiguousDetections: st.ambiguous.Load(),
	}
	for name, c := range st.req {
		out.Requests[name] = RequestStats{OK: c.ok.Load(), Error: c.err.Load(), Dropped: c.dropped.Load(),
			Count: c.count.Load(), Latency: time.Duration(c.latency.Load())}
		if n := c.decodeFail.Load(); n > 0 {
			out.DecodeFailures[name] = n
		}
	}
	st.mu.Lock()
	out.BadInput = maps.Clone(st.badKinds)
	out.Detections = maps.Clone(st.detections)
	st.mu.Unlock()
	return out
}

// limiter rate-limits log lines per key.
type limiter struct {
	mu    sync.Mutex
	every time.Duration
	last  map[string]time.Time
	seen  map[string]struct{}
}

// limiterCap bounds the remembered keys; peers come and go (a reset DEALER
// gets a new identity), so the maps are simply reset when full.
const limiterCap = 4096

func newLimiter(every time.Duration) *limiter {
	return &limiter{every: every, last: map[string]time.Time{}, seen: map[string]struct{}{}}
}

// allow reports whether key may log now (once per interval).
func (l *limiter) allow(key string) bool {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if t, ok := l.last[key]; ok && now.Sub(t) < l.every {
		return false
	}
	if len(l.last) >= limiterCap {
		clear(l.last)
	}
	l.last[key] = now
	return true
}

// once reports whether key logs for the first time.
func (l *limiter) once(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[key]; ok {
		return false
	}
	if len(l.seen) >= limiterCap {
		clear(l.seen)
	}
	l.seen[key] = struct{}{}
	return true
}
