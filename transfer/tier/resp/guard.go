package resp

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
)

// A reply from the server is hostile until checked (anyone on a non-TLS
// path to it, or who controls its address, writes it). valkey-go's reader
// trusts the lengths it reads: a bulk of length -5 panics in makeslice, one
// of 1 TiB ends the process out of memory, and an aggregate header or a
// deep nesting does the same through its element slices or the stack. No
// release of the client checks them, so every connection the client makes
// comes from dialConn through a guardedConn: the server's bytes reach the
// client only after the RESP framing they carry has been checked against
// clientLimits, and the first header past a limit closes the connection
// with an error instead (the client then fails the calls on it, and the
// tier goes down with the reason). The client carries only small commands
// (EXISTS, UNLINK, SET's "+OK", PING, CLUSTER SLOTS and INFO, HELLO): the
// values are read on the tier's own connections, whose reader checks a
// value's length against the one expected before reading a byte of it
// (read.go).

// replyLimits bounds one reply, and so what the client allocates for it.
type replyLimits struct {
	bulk  int64 // longest blob string
	line  int   // longest line: a simple string, an error, a number
	elems int64 // elements of all the reply's aggregates together
	depth int   // nesting of aggregates
	bytes int64 // wire bytes of the whole reply
}

// clientLimits are the valkey-go clients' limits: a CLUSTER SLOTS of a
// cluster cut into 16,384 one-slot ranges of three nodes each fits; each
// element costs the client about 40 bytes, so a reply costs it at most
// about 10 MiB beside its 8 MiB of bytes.
var clientLimits = replyLimits{
	bulk:  1 << 20,
	line:  64 << 10,
	elems: 1 << 18,
	depth: 16,
	bytes: 8 << 20,
}

// errReply is wrapped by every framing the guard refuses.
var errReply = errors.New("malformed reply")

// scanner follows the RESP2/RESP3 framing of a byte stream a piece at a
// time and refuses the first header past its limits. It needs the bytes
// of a header line only until the line ends, and nothing of a blob.
type scanner struct {
	lim  replyLimits
	blob bool  // inside a blob's bytes (and its CRLF)
	left int64 // of the blob
	typ  byte  // of the header line being read; 0 = next is a type byte
	line []byte
	open []int64 // elements still due per open aggregate
	// Of the current top-level reply.
	elems, bytes int64
	// redirect is told about every MOVED or ASK error reply.
	redirect func(msg string)
}

// feed checks b, the next bytes of the stream.
func (s *scanner) feed(b []byte) error {
	for len(b) > 0 {
		var n int // bytes of b this step takes
		switch {
		case s.blob:
			n = int(min(int64(len(b)), s.left))
		case s.typ == 0:
			n = 1
		default:
			n = len(b)
			if i := bytes.IndexByte(b, '\n'); i >= 0 {
				n = i + 1
			}
		}
		if s.bytes += int64(n); s.bytes > s.lim.bytes {
			return fmt.Errorf("%w: a reply longer than %d bytes", errReply, s.lim.bytes)
		}
		step := b[:n]
		b = b[n:]
		switch {
		case s.blob:
			if s.left -= int64(n); s.left == 0 {
				s.blob = false
				s.done()
			}
		case s.typ == 0:
			s.typ = step[0]
			s.line = s.line[:0]
			if strings.IndexByte("+-:_,#($=!*~>%", s.typ) < 0 {
				return fmt.Errorf("%w: reply type %q", errReply, s.typ)
			}
		default:
			max := s.lim.line
			if strings.IndexByte("$=!*~>%", s.typ) >= 0 {
				max = 24 // a length: a sign, 18 digits, CRLF, with room
			}
			if len(s.line)+len(step) > max {
				return fmt.Errorf("%w: a %q line longer than %d bytes", errReply, s.typ, max)
			}
			s.line = append(s.line, step...)
			if step[len(step)-1] != '\n' {
				continue // the line goes on in the next piece
			}
			line := s.line[:len(s.line)-1]
			if len(line) == 0 || line[len(line)-1] != '\r' {
				return fmt.Errorf("%w: a line without CRLF", errReply)
			}
			if err := s.header(s.typ, line[:len(line)-1]); err != nil {
				return err
			}
		}
	}
	return nil
}

// header acts on a complete line of type typ.
func (s *scanner) header(typ byte, line []byte) error {
	s.typ = 0
	switch typ {
	case '-':
		if s.redirect != nil && (hasPrefix(string(line), "MOVED ", "ASK ")) {
			s.redirect(string(line))
		}
		s.done()
		return nil
	case '+', ':', '_', ',', '#', '(':
		s.done()
		return nil
	}
	n, ok := parseLen(line)
	if !ok {
		return fmt.Errorf("%w: %q length %q", errReply, typ, truncate(line, 24))
	}
	if n == -1 && (typ == '$' || typ == '*') {
		s.done() // RESP2's null
		return nil
	}
	switch typ {
	case '$', '=', '!':
		if n < 0 || n > s.lim.bulk {
			return fmt.Errorf("%w: a string of %d bytes (limit %d)", errReply, n, s.lim.bulk)
		}
		s.blob, s.left = true, n+2
		return nil
	case '%':
		if n > 0 {
			n *= 2 // n < 10^20 / 2 fits: parseLen stops at 18 digits
		}
	}
	if n < 0 || n > s.lim.elems-s.elems {
		return fmt.Errorf("%w: an aggregate of %d elements (limit %d a reply)", errReply, n, s.lim.elems)
	}
	s.elems += n
	if n == 0 {
		s.done()
		return nil
	}
	if len(s.open) >= s.lim.depth {
		return fmt.Errorf("%w: aggregates nested deeper than %d", errReply, s.lim.depth)
	}
	s.open = append(s.open, n)
	return nil
}

// done counts one finished element, closing the aggregates it ends.
func (s *scanner) done() {
	for len(s.open) > 0 {
		top := len(s.open) - 1
		if s.open[top]--; s.open[top] > 0 {
			return
		}
		s.open = s.open[:top]
	}
	s.elems, s.bytes = 0, 0 // a top-level reply ended
}

// parseLen reads a length: an optional '-' and at most 18 digits (no
// length of a legal reply comes near; more could overflow).
func parseLen(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// guardedConn passes the server's bytes to the client only after its
// scanner has checked them; a refused header closes the connection, and
// every read after it fails with the reason.
type guardedConn struct {
	net.Conn
	mu   sync.Mutex
	scan scanner
	err  error
	// refused is told once of the refusal (the tier counts it).
	refused func()
}

func (g *guardedConn) Read(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.Conn.Read(p)
	if n > 0 {
		if serr := g.scan.feed(p[:n]); serr != nil {
			g.err = fmt.Errorf("resp connection to %s closed: %w", g.RemoteAddr(), serr)
			g.Conn.Close()
			if g.refused != nil {
				g.refused()
			}
			return 0, g.err
		}
	}
	return n, err
}

// errTooManyConns is the dial refused past the tier's connection bound.
var errTooManyConns = errors.New("too many connections")

// countedConn gives its place in the tier's connection count back on
// its first Close.
type countedConn struct {
	net.Conn
	once sync.Once
	n    *atomic.Int64
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.n.Add(-1) })
	return c.Conn.Close()
}

// dialConn connects to addr as the client would (TLS when configured, the
// server name taken from the address), within the dial timeout and the
// tier's bound on connections open at once (maxConns): a redirect or a
// reconnect loop can open no more.
func (t *Tier) dialConn(ctx context.Context, addr string) (net.Conn, error) {
	if n := t.conns.Add(1); n > t.maxConns {
		t.conns.Add(-1)
		return nil, fmt.Errorf("dial %s: %w: %d open, the tier's bound", addr, errTooManyConns, t.maxConns)
	}
	c, err := t.dialRaw(ctx, addr)
	if err != nil {
		t.conns.Add(-1)
		return nil, err
	}
	return &countedConn{Conn: c, n: &t.conns}, nil
}

func (t *Tier) dialRaw(ctx context.Context, addr string) (net.Conn, error) {
	d := t.opt.Dialer
	dctx, cancel := context.WithTimeout(ctx, d.Timeout)
	defer cancel()
	c, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) {
			return nil, err // "dial tcp ADDR: …" says it already
		}
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	if t.opt.TLSConfig == nil {
		return c, nil
	}
	tc := t.opt.TLSConfig.Clone()
	if tc.ServerName == "" {
		host, _, _ := net.SplitHostPort(addr)
		tc.ServerName = host
	}
	conn := tls.Client(c, tc)
	if err := conn.HandshakeContext(dctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("tls handshake with %s: %w", addr, err)
	}
	return conn, nil
}

// dialClient is the clients' DialCtxFn: dialConn under a guard.
func (t *Tier) dialClient(ctx context.Context, addr string, _ *net.Dialer, _ *tls.Config) (net.Conn, error) {
	c, err := t.dialConn(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &guardedConn{Conn: c, scan: scanner{lim: clientLimits, redirect: func(msg string) {
		t.sawRedirect(addr, msg)
	}}, refused: func() { t.malformed.Add(1) }}, nil
}

// pingFailed is a PING of the node at addr that failed, the address said
// once: an error of the dial already names it.
func pingFailed(addr string, err error) error {
	if strings.Contains(err.Error(), addr) {
		return fmt.Errorf("ping: %w", err)
	}
	return fmt.Errorf("ping %s: %w", addr, err)
}
