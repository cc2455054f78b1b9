package resp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/valkey-io/valkey-go"

	"kvdock/transfer/tier"
)

// Values are read on the tier's own connections (the streamed SETs'), not
// through valkey-go, whose reader allocates whatever length the server
// names: here the length of the reply is read first and checked against
// the one expected (GetInto: the chunk's bytes and header exactly; Get:
// the longest value this process wrote or asked for) before a byte of the
// value is read or anything is allocated for it. GetInto reads the value
// straight into the caller's memory (an L1 slot), so a load holds no copy
// of the chunk beside it.

// drainMax is the longest value of another length whose bytes are read
// and dropped to keep the connection; a longer one closes it instead (the
// server drops the rest).
const drainMax = 64 << 10

var _ tier.ReaderInto = (*Tier)(nil)

// GetInto implements tier.ReaderInto. It returns only once the read has
// ended, also when ctx ends first (the connection is then given up): the
// value is read into the caller's memory.
func (t *Tier) GetInto(ctx context.Context, key string, head, payload []byte, each func(piece []byte)) error {
	want := int64(len(head) + len(payload))
	t.learn(want)
	_, release, err := t.begin(ctx, false)
	if err != nil {
		return err
	}
	defer release()
	rctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return t.read(rctx, key, strconv.FormatInt(want, 10), func(n int64) bool { return n == want }, func(r *bufio.Reader, _ int64) error {
		if _, err := io.ReadFull(r, head); err != nil {
			return err
		}
		for off := 0; off < len(payload); off += streamPiece {
			piece := payload[off:min(off+streamPiece, len(payload))]
			if _, err := io.ReadFull(r, piece); err != nil {
				return err
			}
			if each != nil {
				each(piece)
			}
		}
		return nil
	})
}

// Get returns the value under key, or an error wrapping tier.ErrNotFound.
// A value longer than any this process wrote or asked for (legal; before
// there is one, the server's default bulk limit) is refused unread with an
// error wrapping tier.ErrSizeMismatch: no chunk of ours is that long. Like
// the calls through the client (detached), Get returns when ctx ends while
// the read runs to its end on its worker slot, so an impatient caller
// costs no connection.
func (t *Tier) Get(ctx context.Context, key string) ([]byte, error) {
	limit := t.legal.Load()
	if limit == 0 {
		limit = maxValueBytes
	}
	_, release, err := t.begin(ctx, false)
	if err != nil {
		return nil, err
	}
	type result struct {
		v   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer release()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
		defer cancel()
		var v []byte
		err := t.read(rctx, key, "at most "+strconv.FormatInt(limit, 10), func(n int64) bool { return n <= limit }, func(r *bufio.Reader, n int64) error {
			v = make([]byte, n)
			_, err := io.ReadFull(r, v)
			return err
		})
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, r.err
		}
		return r.v, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("resp tier %s: get: %w", t.target, ctx.Err())
	}
}

// learn raises legal to n.
func (t *Tier) learn(n int64) {
	for {
		cur := t.legal.Load()
		if n <= cur || t.legal.CompareAndSwap(cur, n) {
			return
		}
	}
}

// read GETs key on a connection of the tier's own (the caller holds a
// worker slot) and has fill read the value once accept has said yes to its
// length n; expect says which lengths accept takes, for the error. The
// reply's framing and CRLF are read here. It returns when the read has
// ended, also when ctx ends first (the connection's deadline is moved to
// now): fill may write into the caller's memory.
func (t *Tier) read(ctx context.Context, key, expect string, accept func(n int64) bool, fill func(r *bufio.Reader, n int64) error) error {
	const op = "get"
	n, err := t.streams.get(ctx, t.serverKey(key), accept, fill)
	switch {
	case err == nil:
		t.idx.touch(key)
		t.readBytes.Add(uint64(n))
		return nil
	case errors.Is(err, tier.ErrNotFound):
		t.idx.remove(key)
		return fmt.Errorf("resp tier %s: %s: %w", t.target, op, err)
	case errors.Is(err, tier.ErrSizeMismatch):
		return fmt.Errorf("resp tier %s: %s: a value of %d bytes, expected %s: %w", t.target, op, n, expect, err)
	case ctx.Err() != nil:
		return fmt.Errorf("resp tier %s: %s: %w", t.target, op, ctx.Err())
	case errors.Is(err, ErrClosed):
		return fmt.Errorf("resp tier %s: %s: %w", t.target, op, err)
	}
	return t.fail(ctx, op, err)
}

// errProtocol is a reply that breaks RESP's framing.
var errProtocol = errors.New("malformed reply")

// get GETs serverKey on a connection to its node (see read): n is the
// value's length as the server gave it, also with an error wrapping
// tier.ErrSizeMismatch when accept refused it. A reused connection found
// broken before it answered is replaced once by a fresh one.
func (s *streams) get(ctx context.Context, serverKey string, accept func(n int64) bool, fill func(r *bufio.Reader, n int64) error) (int64, error) {
	addr, err := s.route(ctx, serverKey)
	if err != nil {
		return 0, err
	}
	for attempt := 0; ; attempt++ {
		sc, reused, err := s.conn(ctx, addr)
		if err != nil {
			return 0, err
		}
		n, answered, keep, err := sc.get(ctx, serverKey, accept, fill)
		var re *replyError
		if errors.As(err, &re) && hasPrefix(re.msg, "MOVED", "ASK") {
			s.forgetSlots()
		}
		if keep {
			s.put(sc)
		} else {
			sc.c.Close()
		}
		if err == nil || answered || !reused || attempt > 0 || ctx.Err() != nil {
			return n, err
		}
		s.dropIdle(sc.addr) // as old as the broken one: retry on a fresh one
	}
}

// get sends one GET and reads its reply. answered: the server replied
// (its header was read); keep: the connection is fit for the next call.
func (sc *streamConn) get(ctx context.Context, key string, accept func(n int64) bool, fill func(r *bufio.Reader, n int64) error) (n int64, answered, keep bool, err error) {
	deadline := time.Now().Add(connWriteTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	if err := sc.c.SetDeadline(deadline); err != nil {
		return 0, false, false, err
	}
	// Ending ctx ends the read at once; the connection is then not
	// reused (the deadline may be moved after it was given back).
	stop := context.AfterFunc(ctx, func() { _ = sc.c.SetDeadline(time.Now()) })
	defer func() {
		if !stop() {
			keep = false
		}
	}()
	b := appendArrayHead(sc.buf[:0], 2)
	b = appendBulk(b, "GET")
	b = appendBulk(b, key)
	sc.buf = b
	if _, err := sc.c.Write(b); err != nil {
		return 0, false, false, err
	}
	line, err := sc.line()
	if err != nil {
		return 0, false, false, err
	}
	switch {
	case len(line) > 0 && line[0] == '-':
		return 0, true, true, &replyError{msg: string(line[1:])}
	case len(line) == 0 || line[0] != '$':
		return 0, true, false, fmt.Errorf("%w: %q to a GET", errProtocol, truncate(line, 64))
	}
	n, ok := parseLen(line[1:])
	switch {
	case ok && n == -1:
		return 0, true, true, tier.ErrNotFound
	case !ok || n < 0:
		return 0, true, false, fmt.Errorf("%w: bulk length %q", errProtocol, truncate(line[1:], 24))
	case !accept(n):
		if n > drainMax {
			return n, true, false, tier.ErrSizeMismatch
		}
		if _, err := sc.r.Discard(int(n) + 2); err != nil {
			return n, true, false, tier.ErrSizeMismatch
		}
		return n, true, true, tier.ErrSizeMismatch
	}
	if err := fill(sc.r, n); err != nil {
		return n, true, false, fmt.Errorf("read a value of %d bytes: %w", n, err)
	}
	var crlf [2]byte
	if _, err := io.ReadFull(sc.r, crlf[:]); err != nil {
		return n, true, false, fmt.Errorf("read a value of %d bytes: %w", n, err)
	}
	if crlf != [2]byte{'\r', '\n'} {
		return n, true, false, fmt.Errorf("%w: a value of %d bytes not followed by CRLF", errProtocol, n)
	}
	return n, true, true, nil
}

// line reads one reply line (at most replyBuffer bytes), without its CRLF.
func (sc *streamConn) line() ([]byte, error) {
	line, err := sc.r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%w: a line longer than %d bytes", errProtocol, sc.r.Size())
		}
		return nil, fmt.Errorf("read reply: %w", err)
	}
	line = line[:len(line)-1]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	return line, nil
}

// GetHead implements tier.HeadReader: the first len(buf) bytes of the value
// under key (GETRANGE, so never more than buf is asked for) and its length
// (STRLEN), so that a value of another length is classified from its header
// without being read. The two answers are one pipelined round trip; a value
// replaced between them reads as damage, a miss either way.
func (t *Tier) GetHead(ctx context.Context, key string, buf []byte) (n int, size int64, err error) {
	if len(buf) == 0 {
		return 0, 0, errors.New("resp tier: get head: empty buffer")
	}
	err = t.detached(ctx, "get head", true, func(c valkey.Client, dctx context.Context) error {
		sk := t.serverKey(key)
		res := c.DoMulti(dctx,
			c.B().Strlen().Key(sk).Build(),
			c.B().Getrange().Key(sk).Start(0).End(int64(len(buf)-1)).Build())
		l, err := res[0].AsInt64()
		if err != nil {
			return t.fail(dctx, "get head", err)
		}
		if l == 0 {
			return fmt.Errorf("resp tier %s: get head: %w", t.target, tier.ErrNotFound)
		}
		head, err := res[1].AsBytes()
		if err != nil {
			return t.fail(dctx, "get head", err)
		}
		if len(head) > len(buf) {
			return fmt.Errorf("resp tier %s: get head: %d bytes for a range of %d: %w", t.target, len(head), len(buf), errProtocol)
		}
		n, size = copy(buf, head), l
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	return n, size, nil
}

// Has counts how many leading keys are present, with pipelined EXISTS,
// asking only up to the first key the server said was absent less than
// absentFor ago.
func (t *Tier) Has(ctx context.Context, keys []string) (int, error) {
	asked := t.absent.ask()
	keys = keys[:t.absent.firstFresh(keys, asked.at)]
	if len(keys) == 0 {
		return 0, nil
	}
	// The call may outlive Has (see detached): it reads a copy of keys.
	keys = slices.Clone(keys)
	n := 0
	err := t.detached(ctx, "has", true, func(c valkey.Client, dctx context.Context) error {
		found := 0
		defer func() { n = found }()
		for len(keys) > 0 {
			batch := keys[:min(len(keys), hasBatch)]
			keys = keys[len(batch):]
			cmds := make(valkey.Commands, len(batch))
			for i, k := range batch {
				cmds[i] = c.B().Exists().Key(t.serverKey(k)).Build()
			}
			for i, r := range c.DoMulti(dctx, cmds...) {
				v, err := r.AsInt64()
				if err != nil {
					return t.fail(dctx, "has", err)
				}
				if v == 0 {
					t.absent.add(batch[i], asked)
					return nil
				}
				found++
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// KnownAbsent implements tier.AbsenceKnower: the server said key was
// absent less than absentFor ago (and we have not written it since). An
// answer past refreshAfter is asked again in the background, so a prefix
// that keeps being looked up (a scheduler asks at every step while the
// request waits) is answered from memory throughout instead of waiting on
// the server every absentFor; the answer relied on is still never older
// than absentFor.
func (t *Tier) KnownAbsent(key string) bool {
	absent, refresh := t.absent.knownAbsent(key, time.Now())
	if refresh {
		t.refreshAbsent(key)
	}
	return absent
}

// refreshAbsent asks the server about key in the background and remembers
// the answer. It takes a small-call worker slot only if one is free now and
// refreshes hold at most half of them (one of a single slot), so lookups
// that must ask the server find a slot or wait at most for one EXISTS; a
// refresh not made lets the answer age out as before. Close waits for it.
func (t *Tier) refreshAbsent(key string) {
	if t.refreshing.Add(1) > int32(max(1, t.cfg.NumWorkers/2)) {
		t.refreshing.Add(-1)
		t.absent.drop(key)
		return
	}
	c, release, ok := t.beginNow(true)
	if !ok {
		t.refreshing.Add(-1)
		t.absent.drop(key)
		return
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		release()
		t.refreshing.Add(-1)
		t.absent.drop(key)
		return
	}
	t.refreshes.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.refreshes.Done()
		defer t.refreshing.Add(-1)
		defer release()
		q := t.absent.ask()
		ctx, cancel := context.WithTimeout(t.bg, callTimeout)
		defer cancel()
		v, err := c.Do(ctx, c.B().Exists().Key(t.serverKey(key)).Build()).AsInt64()
		switch {
		case err != nil:
			t.absent.drop(key)
			_ = t.fail(ctx, "has", err)
		case v == 0:
			t.absent.add(key, q)
		default:
			t.absent.present(key)
		}
	}()
}
