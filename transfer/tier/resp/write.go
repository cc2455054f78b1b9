// The write path: room made under this process's budget (least recently
// used values deleted past it), then the value written.

package resp

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/valkey-io/valkey-go"

	"kvdock/transfer/tier"
)

// Put stores value under key (SET, with EX when a TTL is configured), first
// deleting this process's least recently used values past the capacity.
// Put does not return while the client may still read value; so once the
// SET has started it runs to its end (at most connWriteTimeout on a server
// that stopped answering) even if ctx ends first.
func (t *Tier) Put(ctx context.Context, key string, value []byte) error {
	c, release, err := t.begin(ctx, false)
	if err != nil {
		return err
	}
	defer release()
	// Past this point the caller's ctx is not handed to the client (see
	// detached and the SET below); the evictions get a bound of their own.
	if err := t.reserve(ctx, c, key, int64(len(value))); err != nil {
		return err
	}
	// A command is spent by its Do: a retry builds it again.
	build := func() valkey.Completed {
		set := c.B().Set().Key(t.serverKey(key)).Value(valkey.BinaryString(value))
		if t.cfg.TTL > 0 {
			return set.ExSeconds(int64(t.cfg.TTL / time.Second)).Build()
		}
		return set.Build()
	}
	// The command holds value itself (no copy). Given a context that can
	// end, the client may return on it while the command still waits in
	// its write queue and reads value later, after the caller has reused
	// the memory: the server would store other bytes under key. So the
	// SET runs to its end, bounded by the connection's write timeout and
	// the dead-connection check (connWriteTimeout), or Close, not by ctx;
	// the caller's ctx bounds the wait for a worker and is checked once
	// more here, before the SET starts.
	if err := ctx.Err(); err != nil {
		t.idx.remove(key)
		return fmt.Errorf("resp tier %s: put: %w", t.target, err)
	}
	err = c.Do(context.WithoutCancel(ctx), build()).Error()
	if err != nil && connClosed(t.clean(err)) && t.stillAnswers() {
		// The connection predates a restart of the server (a fresh PING
		// answered): the SET, which writes the same bytes again, goes
		// once more on the client's new connection.
		err = c.Do(context.WithoutCancel(ctx), build()).Error()
	}
	if err != nil {
		t.idx.remove(key)
		return t.fail(context.WithoutCancel(ctx), "put", err)
	}
	t.idx.confirm(key)
	t.written(ctx, key, int64(len(value)))
	return nil
}

// reserve makes room for size bytes under key in this process's budget,
// deleting the least recently used values past it (through c).
func (t *Tier) reserve(ctx context.Context, c valkey.Client, key string, size int64) error {
	victims, err := t.idx.reserve(key, size, time.Now())
	if err != nil {
		return fmt.Errorf("resp tier %s: put: %w", t.target, err)
	}
	if len(victims) == 0 {
		return nil
	}
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout) // see detached
	defer cancel()
	if err := t.evict(ectx, c, "evict", victims); err != nil {
		t.idx.remove(key)
		return err
	}
	return nil
}

// PutParts implements tier.PartsPutter: it stores head ‖ payload under key
// like Put, streaming payload from where it lies, a piece after each pace
// (see streams). valid false (asked before the SET's last byte) abandons
// the SET unfinished, and nothing is stored.
func (t *Tier) PutParts(ctx context.Context, key string, head, payload []byte, valid func() bool, pace func()) error {
	c, release, err := t.begin(ctx, false)
	if err != nil {
		return err
	}
	defer release()
	size := int64(len(head) + len(payload))
	if size > maxValueBytes {
		// The server would answer with a protocol error and close the
		// connection, which reads as the tier failing.
		return fmt.Errorf("resp tier %s: put: value of %d bytes exceeds the server's default bulk limit (%d)", t.target, size, maxValueBytes)
	}
	if err := t.reserve(ctx, c, key, size); err != nil {
		return err
	}
	if err := t.streams.set(ctx, t.serverKey(key), head, payload, t.cfg.TTL, valid, pace); err != nil {
		t.idx.remove(key)
		err = t.clean(err)
		switch {
		case errors.Is(err, errUnfinished) && ctx.Err() == nil:
			return fmt.Errorf("resp tier %s: put of %d bytes discarded: %w", t.target, size, tier.ErrSourceChanged)
		case errors.Is(err, ErrClosed):
			return fmt.Errorf("resp tier %s: put: %w", t.target, err)
		}
		return t.fail(ctx, "put", err)
	}
	t.idx.confirm(key)
	t.written(ctx, key, size)
	return nil
}

// Delete removes key; an absent key is not an error.
func (t *Tier) Delete(ctx context.Context, key string) error {
	return t.detached(ctx, "delete", true, func(c valkey.Client, dctx context.Context) error {
		t.idx.remove(key)
		return t.evict(dctx, c, "delete", []string{key})
	})
}
