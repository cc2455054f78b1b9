// Package memtier is an in-memory tier.Backend for tests, with fault
// injection: a tier that is down, one whose calls block until released (a
// slow or hung tier), and direct access to the stored values so a test can
// corrupt them.
package memtier

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"kvdock/core/tierstate"
	"kvdock/transfer/tier"
)

// ErrDown is returned by every call while the tier is down.
var ErrDown = errors.New("memtier: down")

// Tier is an in-memory backend. The zero value is not usable; use New.
type Tier struct {
	mu      sync.Mutex
	vals    map[string][]byte
	down    string // reason; "" = up
	since   time.Time
	gate    chan struct{} // non-nil: calls wait for it to close (or ctx)
	puts    int
	entered chan string // non-nil: every call sends its name (tests order on it)
	closed  bool
	rd, wr  uint64
	notify  func(tierstate.Tier)
}

// NotifyState implements tier.StateNotifier.
func (t *Tier) NotifyState(f func(tierstate.Tier)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.notify = f
}

// New returns an empty, up tier.
func New() *Tier {
	return &Tier{vals: make(map[string][]byte), since: time.Now()}
}

// SetDown marks the tier down with reason ("" brings it back up).
func (t *Tier) SetDown(reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.down == reason {
		return
	}
	t.since = time.Now()
	t.down = reason
	if t.notify != nil {
		st := tierstate.Tier{Type: "mem", Target: "memory", State: tierstate.Up, Since: t.since}
		if reason != "" {
			st.State, st.Reason = tierstate.Down, reason
		}
		t.notify(st)
	}
}

// Block makes every call wait until Unblock (or its ctx ends).
func (t *Tier) Block() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.gate == nil {
		t.gate = make(chan struct{})
	}
}

// Unblock releases the calls waiting since Block.
func (t *Tier) Unblock() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.gate != nil {
		close(t.gate)
		t.gate = nil
	}
}

// Entered, once called, makes every later call send its operation name
// ("put", "get", "has", "delete") on the returned channel before it runs.
func (t *Tier) Entered(buffer int) <-chan string {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.entered = make(chan string, buffer)
	return t.entered
}

// Values returns a copy of the stored map (values shared: tests may edit them
// through Set only).
func (t *Tier) Values() map[string][]byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.vals)
}

// Set stores v under key as is (a test writing a foreign or corrupt value).
func (t *Tier) Set(key string, v []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.vals[key] = append([]byte(nil), v...)
}

// Puts is how many Put calls stored a value.
func (t *Tier) Puts() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.puts
}

func (t *Tier) enter(ctx context.Context, op string) error {
	t.mu.Lock()
	entered := t.entered
	t.mu.Unlock()
	if entered != nil {
		// Told first, so a test reacting to the call (Block, SetDown)
		// changes what this very call meets.
		select {
		case entered <- op:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	t.mu.Lock()
	gate, down, closed := t.gate, t.down, t.closed
	t.mu.Unlock()
	if closed {
		return errors.New("memtier: closed")
	}
	if down != "" {
		return fmt.Errorf("%w: %s", ErrDown, down)
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return fmt.Errorf("memtier %s: %w", op, ctx.Err())
		}
	}
	return ctx.Err()
}

// Put implements tier.Backend.
func (t *Tier) Put(ctx context.Context, key string, value []byte) error {
	if err := t.enter(ctx, "put"); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.vals[key] = append([]byte(nil), value...)
	t.puts++
	t.wr += uint64(len(value))
	return nil
}

// Get implements tier.Backend.
func (t *Tier) Get(ctx context.Context, key string) ([]byte, error) {
	if err := t.enter(ctx, "get"); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.vals[key]
	if !ok {
		return nil, fmt.Errorf("memtier get: %w", tier.ErrNotFound)
	}
	t.rd += uint64(len(v))
	return append([]byte(nil), v...), nil
}

// Has implements tier.Backend.
func (t *Tier) Has(ctx context.Context, keys []string) (int, error) {
	if err := t.enter(ctx, "has"); err != nil {
		return 0, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, k := range keys {
		if _, ok := t.vals[k]; !ok {
			return i, nil
		}
	}
	return len(keys), nil
}

// Delete implements tier.Backend.
func (t *Tier) Delete(ctx context.Context, key string) error {
	if err := t.enter(ctx, "delete"); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.vals, key)
	return nil
}

// Stats implements tier.Backend.
func (t *Tier) Stats() tierstate.Tier {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := tierstate.Tier{Type: "mem", Target: "memory", State: tierstate.Up, Since: t.since,
		Objects: int64(len(t.vals)), ReadBytes: t.rd, WriteBytes: t.wr}
	for _, v := range t.vals {
		st.UsedBytes += int64(len(v))
	}
	if t.down != "" {
		st.State, st.Reason = tierstate.Down, t.down
	}
	return st
}

// Close implements tier.Backend.
func (t *Tier) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	return nil
}

var (
	_ tier.Backend       = (*Tier)(nil)
	_ tier.StateNotifier = (*Tier)(nil)
)
