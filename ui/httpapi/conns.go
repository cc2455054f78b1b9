package httpapi

import (
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Connection bounds of the API: every open connection holds a file
// descriptor, and descriptors are shared with the wire server, so idle
// keep-alive connections must not be able to exhaust them.
const (
	DefaultMaxConns          = 64
	DefaultIdleTimeout       = 10 * time.Second
	DefaultReadHeaderTimeout = 5 * time.Second
	// ShutdownGrace is how long a stop waits for requests in flight before
	// it closes every connection.
	ShutdownGrace = time.Second
)

// ConnStats counts the API's connections.
type ConnStats struct {
	Open    int   // open now
	Busy    int   // of those, handling a request
	Evicted int64 // idle or silent connections closed to make room for a new one
	Refused int64 // new connections closed at once: every slot was busy with a request
}

// connLimiter is a listener that keeps at most max connections open. At
// the limit a new connection takes the slot of the one waiting longest for
// a request (idle keep-alive, or accepted and silent); when every one is
// handling a request, the new one is closed at once. Either way a new
// client is never queued behind connections that do nothing.
type connLimiter struct {
	net.Listener
	max int
	log *slog.Logger

	mu      sync.Mutex
	conns   map[*limitedConn]struct{}
	lastLog time.Time

	evicted, refused atomic.Int64
}

type limitedConn struct {
	net.Conn
	l     *connLimiter
	once  sync.Once
	busy  bool      // handling a request (guarded by l.mu)
	since time.Time // when it last became idle or was accepted (guarded by l.mu)
}

func newConnLimiter(ln net.Listener, max int, log *slog.Logger) *connLimiter {
	return &connLimiter{Listener: ln, max: max, log: log, conns: make(map[*limitedConn]struct{}, max)}
}

// Accept returns the next connection once it has a slot.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc := &limitedConn{Conn: c, l: l, since: time.Now()}
		l.mu.Lock()
		var victim *limitedConn
		if len(l.conns) >= l.max {
			victim = l.longestWaiting()
			if victim == nil {
				l.refusedLocked()
				l.mu.Unlock()
				_ = c.Close()
				continue
			}
			delete(l.conns, victim)
			l.evicted.Add(1)
		}
		l.conns[lc] = struct{}{}
		l.mu.Unlock()
		if victim != nil {
			_ = victim.Close()
		}
		return lc, nil
	}
}

// longestWaiting is the connection not handling a request that has waited
// longest, or nil.
func (l *connLimiter) longestWaiting() *limitedConn {
	var v *limitedConn
	for c := range l.conns {
		if !c.busy && (v == nil || c.since.Before(v.since)) {
			v = c
		}
	}
	return v
}

// refusedLocked counts a refusal and says so at most every 10 s.
func (l *connLimiter) refusedLocked() {
	n := l.refused.Add(1)
	if now := time.Now(); now.Sub(l.lastLog) >= 10*time.Second {
		l.lastLog = now
		l.log.Warn("HTTP API: connection refused, every connection is handling a request",
			"limit", l.max, "refused_total", n)
	}
}

// track is the http.Server ConnState hook: it marks connections busy while
// they handle a request and forgets closed ones.
func (l *connLimiter) track(c net.Conn, s http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	switch s {
	case http.StateActive:
		l.mu.Lock()
		lc.busy = true
		l.mu.Unlock()
	case http.StateIdle:
		l.mu.Lock()
		lc.busy, lc.since = false, time.Now()
		l.mu.Unlock()
	case http.StateHijacked, http.StateClosed:
		l.remove(lc)
	}
}

func (l *connLimiter) remove(c *limitedConn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
}

// Close frees the connection's slot.
func (c *limitedConn) Close() error {
	c.once.Do(func() { c.l.remove(c) })
	return c.Conn.Close()
}

func (l *connLimiter) stats() ConnStats {
	l.mu.Lock()
	st := ConnStats{Open: len(l.conns), Evicted: l.evicted.Load(), Refused: l.refused.Load()}
	for c := range l.conns {
		if c.busy {
			st.Busy++
		}
	}
	l.mu.Unlock()
	return st
}
