package resp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The write-behind writers store a value through PutParts, on connections
// of the tier's own that speak just enough RESP for one SET at a time. A
// RESP client library takes a value as one byte slice and writes it to the
// socket in one go: the writer had to copy each 32 MiB chunk out of L1 next
// to its header first, and the socket write (and the server's read of it)
// then took the CPU in one burst that the requests on the same cores
// waited behind (kvdock bench: NOOP and LOOKUP+STATUS while the tier is
// saturated with writes, docs/BENCHMARKS.md). Here the SET is written
// header first, then the payload straight from its L1 bytes a piece at a
// time, with the writer's pace (its yield to the request path) before
// each piece. The server holds the unfinished command in its query buffer
// and stores the value only once the command's last byte arrives: a value
// is never visible in part, and a write given up midway (the source's
// hold ended, the deadline passed, the tier closed) is a closed connection
// that the server discards with its half command.

// streamPiece is how many payload bytes go to the socket between paces.
const streamPiece = 1 << 20

// replyBuffer bounds a reply line read from the server (an error text).
const replyBuffer = 4096

// streams holds the idle connections (of SETs and value reads), per node
// address, at most NumWorkers of them in all, and in a cluster the slot map
// that routes a key.
type streams struct {
	t *Tier

	mu     sync.Mutex
	idle   map[string][]*streamConn
	nidle  int // of all addresses
	closed bool
	slots  *slotMap // nil until fetched; reset when found stale
}

type streamConn struct {
	addr string
	c    net.Conn
	r    *bufio.Reader
	buf  []byte // the command's framing, reused
}

func newStreams(t *Tier) *streams {
	return &streams{t: t, idle: map[string][]*streamConn{}}
}

// replyError is an error reply ("-ERR …") of the server to a streamed SET.
type replyError struct{ msg string }

func (e *replyError) Error() string { return e.msg }

// errUnfinished marks a SET given up before its last byte was sent: the
// server never stored it.
var errUnfinished = errors.New("set not finished")

// set stores value = head ‖ payload under serverKey (with EX ttl when
// ttl > 0), streaming payload from where it lies. valid is asked with
// every byte but the last sent; false abandons the SET unfinished. A
// reused connection that turns out broken before anything was answered is
// replaced once by a fresh one.
func (s *streams) set(ctx context.Context, serverKey string, head, payload []byte, ttl time.Duration, valid func() bool, pace func()) error {
	addr, err := s.route(ctx, serverKey)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		sc, reused, err := s.conn(ctx, addr)
		if err != nil {
			return err
		}
		err = sc.set(ctx, serverKey, head, payload, ttl, valid, pace)
		var re *replyError
		switch {
		case err == nil:
			s.put(sc)
			return nil
		case errors.As(err, &re):
			s.put(sc) // the connection is fine; the server refused
			if strings.HasPrefix(re.msg, "MOVED") || strings.HasPrefix(re.msg, "ASK") {
				s.forgetSlots()
			}
			return err
		}
		sc.c.Close()
		if !reused || attempt > 0 || errors.Is(err, errUnfinished) || ctx.Err() != nil {
			if s.t.cfg.Cluster {
				s.forgetSlots() // a node gone: its slots may have moved
			}
			return err
		}
		// An idle connection the server (or a restart of it) closed
		// meanwhile: its idle siblings are as old, so one try on a fresh
		// connection.
		s.dropIdle(sc.addr)
	}
}

// dropIdle closes the idle connections to addr: one of them was found
// closed by the server, so the others, as old, are likely closed too.
func (s *streams) dropIdle(addr string) {
	s.mu.Lock()
	idle := s.idle[addr]
	delete(s.idle, addr)
	s.nidle -= len(idle)
	s.mu.Unlock()
	for _, sc := range idle {
		sc.c.Close()
	}
}

// conn returns an idle connection to addr, or dials one.
func (s *streams) conn(ctx context.Context, addr string) (*streamConn, bool, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, false, ErrClosed
	}
	if l := s.idle[addr]; len(l) > 0 {
		sc := l[len(l)-1]
		s.idle[addr] = l[:len(l)-1]
		s.nidle--
		s.mu.Unlock()
		return sc, true, nil
	}
	s.mu.Unlock()
	sc, err := s.dial(ctx, addr)
	return sc, false, err
}

// put keeps sc for the next SET to its node.
func (s *streams) put(sc *streamConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.nidle >= s.t.cfg.NumWorkers {
		sc.c.Close()
		return
	}
	s.idle[sc.addr] = append(s.idle[sc.addr], sc)
	s.nidle++
}

// flush closes the idle connections (the tier went down: they may be
// dead); close also refuses new ones.
func (s *streams) flush(close bool) {
	s.mu.Lock()
	idle := s.idle
	s.idle = map[string][]*streamConn{}
	s.nidle = 0
	s.slots = nil
	s.closed = s.closed || close
	s.mu.Unlock()
	for _, l := range idle {
		for _, sc := range l {
			sc.c.Close()
		}
	}
}

// dial connects to addr the way the client does (dialConn: TLS when
// configured, within the tier's bound on connections), then AUTH when
// there is a password.
func (s *streams) dial(ctx context.Context, addr string) (*streamConn, error) {
	cfg := s.t.cfg
	c, err := s.t.dialConn(ctx, addr)
	if err != nil {
		return nil, err
	}
	sc := &streamConn{addr: addr, c: c, r: bufio.NewReaderSize(c, replyBuffer)}
	if cfg.Password != "" {
		args := []string{"AUTH", cfg.Password}
		if cfg.Username != "" {
			args = []string{"AUTH", cfg.Username, cfg.Password}
		}
		_ = c.SetDeadline(time.Now().Add(s.t.opt.Dialer.Timeout))
		if err := sc.command(args...); err != nil {
			c.Close()
			return nil, fmt.Errorf("auth with %s: %w", addr, err)
		}
	}
	return sc, nil
}

// command sends a small command and reads its simple-string reply.
func (sc *streamConn) command(args ...string) error {
	b := appendArrayHead(sc.buf[:0], len(args))
	for _, a := range args {
		b = appendBulk(b, a)
	}
	sc.buf = b
	if _, err := sc.c.Write(b); err != nil {
		return err
	}
	return sc.reply()
}

// set writes one SET, payload a piece at a time, and reads its answer.
func (sc *streamConn) set(ctx context.Context, key string, head, payload []byte, ttl time.Duration, valid func() bool, pace func()) error {
	deadline := time.Now().Add(connWriteTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	if err := sc.c.SetDeadline(deadline); err != nil {
		return err
	}
	// A blocked read or write sees no ctx: a server that stopped answering
	// (paused, hung) would hold the writer, and a stop that waits for its
	// writers, until the deadline. Cancelling ctx moves the deadline to now;
	// the connection is then closed by streams.set, never reused.
	defer context.AfterFunc(ctx, func() { _ = sc.c.SetDeadline(time.Now()) })()
	n := 3
	var ex string
	if ttl > 0 {
		n, ex = 5, strconv.FormatInt(int64(ttl/time.Second), 10)
	}
	b := appendArrayHead(sc.buf[:0], n)
	b = appendBulk(b, "SET")
	b = appendBulk(b, key)
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(head)+len(payload)), 10)
	b = append(b, "\r\n"...)
	b = append(b, head...)
	sc.buf = b
	if _, err := sc.c.Write(b); err != nil {
		return err
	}
	for off := 0; off < len(payload); off += streamPiece {
		if pace != nil {
			pace()
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%w: %w", errUnfinished, err)
		}
		if _, err := sc.c.Write(payload[off:min(off+streamPiece, len(payload))]); err != nil {
			return err
		}
	}
	tail := append(sc.buf[:0], "\r\n"...)
	if ttl > 0 {
		tail = appendBulk(tail, "EX")
		tail = appendBulk(tail, ex)
	}
	sc.buf = tail
	// All but the last byte: the server cannot take the command before
	// it, so the value stays invisible until valid has said yes.
	if _, err := sc.c.Write(tail[:len(tail)-1]); err != nil {
		return err
	}
	if valid != nil && !valid() {
		return fmt.Errorf("%w: the source's bytes were released", errUnfinished)
	}
	if _, err := sc.c.Write(tail[len(tail)-1:]); err != nil {
		return err
	}
	return sc.reply()
}

// reply reads one reply and expects "+…" (an error reply is a replyError).
func (sc *streamConn) reply() error {
	line, err := sc.line()
	if err != nil {
		return err
	}
	switch {
	case len(line) > 0 && line[0] == '+':
		return nil
	case len(line) > 0 && line[0] == '-':
		return &replyError{msg: string(line[1:])}
	default:
		return fmt.Errorf("unexpected reply %q", truncate(line, 64))
	}
}

func truncate(b []byte, n int) []byte { return b[:min(len(b), n)] }

func appendArrayHead(b []byte, n int) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, "\r\n"...)
}

func appendBulk(b []byte, s string) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, "\r\n"...)
	b = append(b, s...)
	return append(b, "\r\n"...)
}

// route returns the address of the node that serves serverKey: the one
// server, or in a cluster the owner of the key's slot (CLUSTER SLOTS,
// fetched again after a MOVED or a lost node).
func (s *streams) route(ctx context.Context, serverKey string) (string, error) {
	cfg := s.t.cfg
	if !cfg.Cluster {
		return cfg.addr(), nil
	}
	s.mu.Lock()
	m := s.slots
	s.mu.Unlock()
	if m == nil {
		var err error
		if m, err = s.fetchSlots(ctx); err != nil {
			return "", err
		}
		s.mu.Lock()
		s.slots = m
		s.mu.Unlock()
	}
	return m.owner(keySlot(serverKey))
}

func (s *streams) forgetSlots() {
	s.mu.Lock()
	s.slots = nil
	s.mu.Unlock()
}

// slotMap is a cluster's slot ranges and their primaries.
type slotMap struct{ ranges []slotRange }

type slotRange struct {
	from, to int
	addr     string
}

func (m *slotMap) owner(slot int) (string, error) {
	for _, r := range m.ranges {
		if slot >= r.from && slot <= r.to {
			return r.addr, nil
		}
	}
	return "", fmt.Errorf("no node serves slot %d", slot)
}

// fetchSlots asks the cluster (through the small commands' client) which
// node serves which slots.
func (s *streams) fetchSlots(ctx context.Context) (*slotMap, error) {
	s.t.mu.Lock()
	cs := s.t.client
	s.t.mu.Unlock()
	if cs == nil {
		return nil, ErrDown
	}
	c := cs.small
	// Not ctx itself: see detached.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
	defer cancel()
	entries, err := c.Do(sctx, c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("cluster slots: %w", err)
	}
	m := &slotMap{}
	for _, e := range entries {
		f, err := e.ToArray()
		if err != nil || len(f) < 3 {
			return nil, fmt.Errorf("cluster slots: malformed entry")
		}
		from, err1 := f[0].AsInt64()
		to, err2 := f[1].AsInt64()
		node, err3 := f[2].ToArray()
		if err := errors.Join(err1, err2, err3); err != nil || len(node) < 2 {
			return nil, fmt.Errorf("cluster slots: malformed entry")
		}
		host, err1 := node[0].ToString()
		port, err2 := node[1].AsInt64()
		if err := errors.Join(err1, err2); err != nil || from < 0 || to >= clusterSlots || from > to || port <= 0 || port > 65535 {
			return nil, fmt.Errorf("cluster slots: malformed entry")
		}
		if host == "" || host == "?" {
			// The node does not know its own address: it is the one
			// the client was seeded with.
			host = s.t.cfg.Host
			if len(s.t.cfg.StartupNodes) > 0 {
				host, _, _ = net.SplitHostPort(s.t.cfg.StartupNodes[0])
			}
		}
		m.ranges = append(m.ranges, slotRange{int(from), int(to), net.JoinHostPort(host, strconv.FormatInt(port, 10))})
	}
	return m, nil
}

const clusterSlots = 16384

// keySlot is the cluster slot of key: CRC-16/XMODEM of the key, or of its
// hash tag (the bytes between the first '{' and the next '}', when there
// are any), modulo 16384.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % clusterSlots
}

// idleCount is how many idle connections are kept (for tests and stats).
func (s *streams) idleCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nidle
}
