// Health: a failed call marks the tier down with the reason, a PING every
// few seconds checks it while up, and a probe with exponential backoff
// brings it back up.

package resp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/valkey-io/valkey-go"

	"kvdock/core/tierstate"
)

// redirectSeen is a redirect answered by the node at from, to the node at to.
type redirectSeen struct{ from, to string }

// NotifyState implements tier.StateNotifier.
func (t *Tier) NotifyState(f func(tierstate.Tier)) { t.notify.Store(&f) }

// NotifyContents implements tier.ContentNotifier from the index: f is told
// each value this process wrote once its SET succeeded, and when the index
// lets it go (evicted for room, deleted, cleared, past its TTL by kvdock's
// clock, or found gone by a read). A value the server drops behind kvdock's
// back (its own maxmemory policy, another host) is told only once a read
// finds it gone.
func (t *Tier) NotifyContents(f func(key string, present bool)) { t.idx.tell.Store(&f) }

// Stats is the backend's part of the tier's snapshot.
func (t *Tier) Stats() tierstate.Tier {
	used, objects := t.idx.usage(time.Now())
	t.mu.Lock()
	defer t.mu.Unlock()
	return tierstate.Tier{
		Type:          "resp",
		Target:        t.target,
		State:         t.state,
		Reason:        t.reason,
		Since:         t.since,
		UsedBytes:     used,
		CapacityBytes: t.cfg.CapacityBytes,
		Objects:       objects,
		ReadBytes:     t.readBytes.Load(),
		WriteBytes:    t.writeBytes.Load(),
		Corrupt:       t.malformed.Load(),
	}
}

// fail turns a client error into the call's error, changing the tier's
// state when the error says the server is unreachable or unwell.
func (t *Tier) fail(ctx context.Context, op string, err error) error {
	err = t.clean(err)
	if callerGaveUp(ctx) {
		// The caller's deadline (or ours) ran out: slow, not down.
		return fmt.Errorf("resp tier %s: %s: %w", t.target, op, err)
	}
	if msg, ok := serverErr(err); ok {
		switch {
		case isAuth(err), hasPrefix(msg, "LOADING", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN"):
			t.setState(tierstate.Down, msg)
		case hasPrefix(msg, "OOM"):
			t.setState(tierstate.Degraded, "server out of memory: "+msg)
		case hasPrefix(msg, "MOVED", "ASK") && !t.cfg.Cluster:
			t.setState(tierstate.Degraded, "server is a cluster node; set \"cluster\": true")
		case hasPrefix(msg, "MOVED", "ASK") && !errors.As(err, new(*replyError)):
			// The client follows maxRedirects of them; one that comes
			// back is a loop. (The tier's own connections follow none:
			// theirs fetch the slot map again.)
			t.setState(tierstate.Down, t.redirectLoop(msg))
		}
		return fmt.Errorf("resp tier %s: %s: %w", t.target, op, err)
	}
	if connClosed(err) && t.stillAnswers() {
		// The connection predates a restart of the server (or its idle
		// timeout): this call fails, the tier is not down.
		return fmt.Errorf("resp tier %s: %s: %w", t.target, op, err)
	}
	t.setState(tierstate.Down, err.Error())
	return fmt.Errorf("resp tier %s: %s: %w", t.target, op, err)
}

// connClosed tells a connection the server closed (EOF, reset, broken
// pipe) from other failures: a malformed reply or a timeout marks the tier
// down at once, a closed connection only when the server does not answer a
// fresh PING either.
func connClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed)
}

// recheckTimeout bounds the confirming PING: a server that answers does so
// in well under it, a killed one refuses the connection at once.
const recheckTimeout = time.Second

// recheck is one confirming PING, shared by the calls that ask while it runs.
type recheck struct {
	mu      sync.Mutex
	running chan struct{} // closed when the PING under way ends; nil when none
	ok      bool          // its outcome, once running is closed
}

// stillAnswers PINGs every node through the small commands' client: true
// when the server answers, so the call's closed connection was the
// connection's fault, not the server's.
func (t *Tier) stillAnswers() bool {
	r := &t.recheck
	r.mu.Lock()
	if ch := r.running; ch != nil {
		r.mu.Unlock()
		<-ch
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.ok
	}
	ch := make(chan struct{})
	r.running = ch
	r.mu.Unlock()
	ok := t.pingAll()
	r.mu.Lock()
	r.ok, r.running = ok, nil
	r.mu.Unlock()
	close(ch)
	return ok
}

// pingTries bounds stillAnswers' PINGs of one node. The client keeps
// several connections to a node and each may predate the server's restart:
// a PING that meets a closed one is tried again (the client replaces the
// connection it found closed), up to more times than it holds connections.
// A server that is gone refuses the next connection at once, which ends
// the tries.
const pingTries = 8

// pingAll is stillAnswers' PING of every node.
func (t *Tier) pingAll() bool {
	t.mu.Lock()
	c, down := t.client, t.state == tierstate.Down || t.closed
	t.mu.Unlock()
	if c == nil || down {
		return false
	}
	ctx, cancel := context.WithTimeout(t.bg, recheckTimeout)
	defer cancel()
	for _, node := range c.small.Nodes() {
		if !pingNode(ctx, node) {
			return false
		}
	}
	return true
}

// pingNode PINGs one node until it answers, tries again while each failure
// is a closed connection, and gives up on any other failure.
func pingNode(ctx context.Context, node valkey.Client) bool {
	for range pingTries {
		err := node.Do(ctx, node.B().Ping().Build()).Error()
		if err == nil {
			return true
		}
		if !connClosed(err) || ctx.Err() != nil {
			return false
		}
	}
	return false
}

// callerGaveUp tells a call cut short by its context from a server failure.
// A deadline shows in the network error (i/o timeout) a moment before
// ctx.Err() is set, so the deadline itself is checked too.
func callerGaveUp(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// recovered clears a degraded state after a successful write.
func (t *Tier) recovered() {
	t.mu.Lock()
	degraded := t.state == tierstate.Degraded
	t.mu.Unlock()
	if degraded {
		t.setState(tierstate.Up, "")
	}
}

func (t *Tier) setState(s tierstate.State, reason string) {
	t.mu.Lock()
	if t.closed || (t.state == s && t.reason == reason) {
		t.mu.Unlock()
		return
	}
	if t.state == s {
		// Same state, new reason (the probe saw another error): no event.
		t.reason = reason
		t.mu.Unlock()
		return
	}
	t.state, t.reason, t.since = s, reason, time.Now()
	st := tierstate.Tier{Type: "resp", Target: t.target, State: s, Reason: reason, Since: t.since}
	t.mu.Unlock()
	if f := t.notify.Load(); f != nil {
		(*f)(st)
	}
	switch s {
	case tierstate.Up:
		t.log.Info("resp tier up")
	case tierstate.Down:
		t.log.Warn("resp tier down", "reason", reason)
		t.streams.flush(false) // they may be dead; fresh ones after
		select {
		case t.wake <- struct{}{}:
		default:
		}
	default:
		t.log.Warn("resp tier degraded", "reason", reason)
	}
}

// monitor PINGs the server every healthEvery while the tier is up, so a
// server that dies while no call touches it shows down within seconds, and
// probes a down server with exponential backoff until it answers.
func (t *Tier) monitor() {
	defer close(t.done)
	health := time.NewTicker(healthEvery)
	defer health.Stop()
	var answer <-chan error // the health PING under way; nil when none
	var asked time.Time
	for {
		select {
		case <-t.stop:
			return
		case err := <-answer:
			answer = nil
			t.healthAnswered(err)
			continue
		case <-health.C:
			switch {
			case answer == nil:
				answer, asked = t.healthPing(), time.Now()
			case time.Since(asked) >= pingPatience:
				t.setState(tierstate.Down, fmt.Sprintf("health check: no answer to a PING in %v", time.Since(asked).Round(time.Second)))
			}
			continue
		case <-t.wake:
		}
		answer = nil // the probe's answers are the ones that count now
		wait := backoffMin
		for {
			// Jitter keeps many hosts from probing a restarted server in step.
			d := wait/2 + rand.N(wait/2+1)
			select {
			case <-t.stop:
				return
			case <-time.After(d):
			}
			err := t.probe()
			if err == nil {
				t.setState(tierstate.Up, "")
				break
			}
			t.setState(tierstate.Down, t.clean(err).Error())
			wait = min(wait*2, backoffMax)
		}
	}
}

// healthPing PINGs every node through the small commands' client (whose
// replies never wait behind a value) in the background and returns where
// the outcome will be sent; nil when the tier is down or closing (the probe
// has it) or the last health PING has not ended yet. The PING gets the
// deadline of any call, not a short one: valkey-go answers a deadline
// ending mid-call by closing the connection the lookups share; the monitor
// instead gives up waiting after pingPatience.
func (t *Tier) healthPing() <-chan error {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.client
	if c == nil || t.state == tierstate.Down || t.closed || !t.pinging.CompareAndSwap(false, true) {
		return nil
	}
	t.refreshes.Add(1) // Close waits for it
	out := make(chan error, 1)
	go func() {
		defer t.refreshes.Done()
		defer t.pinging.Store(false)
		ctx, cancel := context.WithTimeout(t.bg, callTimeout)
		defer cancel()
		for addr, node := range c.small.Nodes() {
			if err := node.Do(ctx, node.B().Ping().Build()).Error(); err != nil {
				out <- pingFailed(addr, err)
				return
			}
		}
		out <- nil
	}()
	return out
}

// healthAnswered acts on a health PING's outcome: an error marks the tier
// down (an error reply, as fail reads it).
func (t *Tier) healthAnswered(err error) {
	if err == nil || t.bg.Err() != nil {
		return
	}
	if _, reply := serverErr(err); reply {
		_ = t.fail(context.Background(), "health check", err)
		return
	}
	t.setState(tierstate.Down, "health check: "+t.clean(err).Error())
}

// probe PINGs every node (making the client first when Open could not)
// and, in a cluster, asks each whether the cluster is whole.
func (t *Tier) probe() error {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	// Close waits for the monitor: it does not wait out a probe of a
	// server that does not answer.
	go func() {
		select {
		case <-t.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	t.mu.Lock()
	c := t.client
	t.mu.Unlock()
	if c == nil {
		nc, err := t.dial(ctx)
		if err != nil {
			return err
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			nc.close()
			return ErrClosed
		}
		t.client, c = nc, nc
		t.mu.Unlock()
	}
	// Both clients' connections must answer: either may be the one that broke.
	for addr, node := range c.small.Nodes() {
		if err := node.Do(ctx, node.B().Ping().Build()).Error(); err != nil {
			return pingFailed(addr, err)
		}
	}
	for addr, node := range c.bulk.Nodes() {
		if err := node.Do(ctx, node.B().Ping().Build()).Error(); err != nil {
			return pingFailed(addr, err)
		}
		if !t.cfg.Cluster {
			continue
		}
		// A node back from a crash answers PING before the cluster
		// takes it in again; until then keys answer CLUSTERDOWN.
		info, err := node.Do(ctx, node.B().ClusterInfo().Build()).ToString()
		if err != nil {
			return fmt.Errorf("cluster info %s: %w", addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("node %s: cluster state is not ok", addr)
		}
	}
	if t.cfg.Cluster {
		// A keyed command, routed and redirected as the calls are: nodes
		// that all answer PING may still redirect in a loop.
		key := t.serverKey(probeKey)
		if err := c.small.Do(ctx, c.small.B().Exists().Key(key).Build()).Error(); err != nil {
			if msg, ok := serverErr(err); ok && hasPrefix(msg, "MOVED", "ASK") {
				return errors.New(t.redirectLoop(msg))
			}
			return fmt.Errorf("exists %s: %w", key, err)
		}
	}
	return nil
}

// probeKey is the key the probe asks about: no chunk's key looks like it.
const probeKey = "probe"

// sawRedirect remembers a MOVED or ASK reply of the node at from.
func (t *Tier) sawRedirect(from, msg string) {
	if f := strings.Fields(msg); len(f) == 3 {
		t.redirect.Store(&redirectSeen{from: from, to: f[2]})
	}
}

// redirectLoop is the reason of a call that ended on msg, a MOVED or ASK
// left after maxRedirects: the loop's two nodes, as far as known.
func (t *Tier) redirectLoop(msg string) string {
	to := ""
	if f := strings.Fields(msg); len(f) == 3 {
		to = f[2]
	}
	r := t.redirect.Load()
	switch {
	case r == nil || r.to != to:
		return fmt.Sprintf("redirect loop: more than %d redirects, the last to %s", maxRedirects, to)
	case r.from == r.to:
		return fmt.Sprintf("redirect loop between %s and itself", r.to)
	}
	return fmt.Sprintf("redirect loop between %s and %s", r.from, r.to)
}
