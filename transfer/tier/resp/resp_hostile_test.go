package resp

import (
	"bytes"
	"context"
	"errors"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"kvdock/core/testkit/fakeresp"
	"kvdock/core/tierstate"
	"kvdock/transfer/tier"
)

// The hostile-server tests: a fake node (core/testkit/fakeresp) answers
// what no real server would, and the tier must neither crash nor allocate
// past its bounds, must end each call after a few redirects, and must say
// why it is down.

func fakeCfg(n *fakeresp.Node) RESPConfig {
	return RESPConfig{Host: "127.0.0.1", Port: n.Port(), NumWorkers: 4, CapacityBytes: 1 << 30, KeyPrefix: DefaultKeyPrefix}
}

// allocated is what the whole process allocated while fn ran, in bytes.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func waitState(t *testing.T, tr *Tier, want tierstate.State, limit time.Duration) tierstate.Tier {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		st := tr.Stats()
		if st.State == want {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("tier %s after %v (reason %q), want %s", st.State, limit, st.Reason, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHostileClientReplies: replies to the client's commands (EXISTS here)
// with lengths no server sends: each fails the call and marks the tier
// down with the reason, allocates less than 8 MiB, and once the node
// answers sanely again the tier comes back by itself.
func TestHostileClientReplies(t *testing.T) {
	cases := []struct {
		name  string
		reply []byte
	}{
		{"negative bulk", []byte("$-5\r\n")},
		{"1 TiB bulk", []byte("$1099511627776\r\n")},
		{"1 TiB array", []byte("*1099511627776\r\n")},
		{"negative array", []byte("*-5\r\n")},
		{"1 TiB map", []byte("%1099511627776\r\n")},
		{"1 TiB set", []byte("~1099511627776\r\n")},
		{"huge length digits", []byte("$99999999999999999999999\r\n")},
		{"nested a million deep", []byte(strings.Repeat("*1\r\n", 1<<20) + ":1\r\n")},
		{"16 MiB error line", append(append([]byte("-ERR "), bytes.Repeat([]byte("x"), 16<<20)...), "\r\n"...)},
		{"16 MiB in a million small strings", []byte("*1048576\r\n" + strings.Repeat("$10\r\n0123456789\r\n", 1<<20))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var hostile atomic.Bool
			hostile.Store(true)
			n := fakeresp.Start(t, func(cmd []string) []byte {
				if r := fakeresp.Basic(cmd); r != nil {
					return r
				}
				if cmd[0] == "EXISTS" {
					if hostile.Load() {
						return c.reply
					}
					return fakeresp.Int(1)
				}
				return fakeresp.Err("ERR unexpected " + cmd[0])
			})
			tr, _ := open(t, fakeCfg(n))
			// Every down the tier goes through: the probe may bring it up
			// again (the node answers PING) before a poll of the state
			// would see it, on a loaded machine.
			downs := make(chan tierstate.Tier, 16)
			tr.NotifyState(func(st tierstate.Tier) {
				if st.State == tierstate.Down {
					select {
					case downs <- st:
					default:
					}
				}
			})
			var err error
			got := allocated(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_, err = tr.Has(ctx, []string{"k"})
			})
			t.Logf("%s: allocated %.1f MiB during the call; err %.200v", c.name, float64(got)/(1<<20), err)
			if err == nil {
				t.Fatal("a hostile reply was taken as an answer")
			}
			if got > 8<<20 {
				t.Fatalf("the call allocated %.1f MiB, bound 8 MiB", float64(got)/(1<<20))
			}
			var st tierstate.Tier
			select {
			case st = <-downs:
			case <-time.After(5 * time.Second):
				t.Fatalf("the tier never went down (now %s, reason %q)", tr.Stats().State, tr.Stats().Reason)
			}
			if !strings.Contains(st.Reason, "malformed reply") {
				t.Fatalf("down reason %q does not say the reply was malformed", st.Reason)
			}
			hostile.Store(false)
			waitState(t, tr, tierstate.Up, stateLimit)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if k, err := tr.Has(ctx, []string{"k"}); err != nil || k != 1 {
				t.Fatalf("after the node recovered: Has = %d, %v", k, err)
			}
		})
	}
}

// TestHostileValueLength: a value of another length than the chunk asked
// for is refused before a byte of it is read (GetInto: nothing allocated;
// Get: refused past the longest value asked for), as are lengths no server
// sends; the value of the right length is read straight into the caller's
// memory.
func TestHostileValueLength(t *testing.T) {
	const want = 64 << 10
	good := bytes.Repeat([]byte{7}, want)
	big := fakeresp.Bulk(bytes.Repeat([]byte{1}, 16<<20))
	var reply atomic.Pointer[[]byte]
	n := fakeresp.Start(t, func(cmd []string) []byte {
		if r := fakeresp.Basic(cmd); r != nil {
			return r
		}
		if cmd[0] == "GET" {
			return *reply.Load()
		}
		return fakeresp.Err("ERR unexpected " + cmd[0])
	})
	tr, _ := open(t, fakeCfg(n))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	head, payload := make([]byte, 64), make([]byte, want-64)

	reply.Store(&big)
	var err error
	got := allocated(func() { err = tr.GetInto(ctx, "k", head, payload, nil) })
	t.Logf("GetInto of a 16 MiB value, %d bytes asked: allocated %.1f KiB; err %v", want, float64(got)/1024, err)
	if !errors.Is(err, tier.ErrSizeMismatch) || got > 1<<20 {
		t.Fatalf("GetInto of a 16 MiB value: %v, allocated %d bytes (bound 1 MiB)", err, got)
	}
	got = allocated(func() { _, err = tr.Get(ctx, "k") })
	t.Logf("Get of a 16 MiB value after %d bytes were asked for: allocated %.1f KiB; err %v", want, float64(got)/1024, err)
	if !errors.Is(err, tier.ErrSizeMismatch) || got > 1<<20 {
		t.Fatalf("Get of a 16 MiB value: %v, allocated %d bytes (bound 1 MiB)", err, got)
	}
	if st := tr.Stats(); st.State != tierstate.Up {
		t.Fatalf("a value of another length marked the tier %s (%s)", st.State, st.Reason)
	}

	for _, h := range []string{"$-5\r\n", "$1099511627776\r\n", "$99999999999999999999999\r\n", "*1\r\n"} {
		b := []byte(h)
		reply.Store(&b)
		got = allocated(func() { err = tr.GetInto(ctx, "k", head, payload, nil) })
		if err == nil || got > 1<<20 {
			t.Fatalf("GetInto answered %q: %v, allocated %d bytes", h, err, got)
		}
		got = allocated(func() { _, err = tr.Get(ctx, "k") })
		if err == nil || got > 1<<20 {
			t.Fatalf("Get answered %q: %v, allocated %d bytes", h, err, got)
		}
		waitState(t, tr, tierstate.Up, stateLimit) // PING still answers
	}

	ok := fakeresp.Bulk(good)
	reply.Store(&ok)
	pieces := 0
	if err := tr.GetInto(ctx, "k", head, payload, func([]byte) { pieces++ }); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(append(append([]byte{}, head...), payload...), good) || pieces == 0 {
		t.Fatalf("GetInto of the right length: bytes differ or no pieces reported (%d)", pieces)
	}
	if v, err := tr.Get(ctx, "k"); err != nil || !bytes.Equal(v, good) {
		t.Fatalf("Get of the right length: %v", err)
	}
}

// clusterNode is a fake cluster node whose keyed commands answer redirect.
func clusterNode(t *testing.T, owner *atomic.Pointer[string], redirect func() string) *fakeresp.Node {
	return fakeresp.Start(t, func(cmd []string) []byte {
		if r := fakeresp.Basic(cmd); r != nil {
			return r
		}
		switch {
		case cmd[0] == "CLUSTER" && len(cmd) > 1 && strings.EqualFold(cmd[1], "SLOTS"):
			return fakeresp.Slots(*owner.Load())
		case cmd[0] == "CLUSTER":
			return fakeresp.Bulk([]byte("cluster_state:ok\r\n"))
		}
		return fakeresp.Err("MOVED " + strconv.Itoa(keySlot(cmd[len(cmd)-1])) + " " + redirect())
	})
}

// TestHostileRedirectLoop: two nodes that redirect to each other, and a
// node that redirects to itself. A call follows a few redirects and ends,
// the tier goes down naming the loop, and the connections stay few.
func TestHostileRedirectLoop(t *testing.T) {
	t.Run("two nodes", func(t *testing.T) {
		var owner atomic.Pointer[string]
		var a, b *fakeresp.Node
		a = clusterNode(t, &owner, func() string { return b.Addr() })
		b = clusterNode(t, &owner, func() string { return a.Addr() })
		addr := a.Addr()
		owner.Store(&addr)
		cfg := fakeCfg(a)
		cfg.Cluster, cfg.StartupNodes = true, []string{a.Addr()}
		tr, _ := open(t, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start := time.Now()
		_, err := tr.Has(ctx, []string{"k"})
		took := time.Since(start)
		calls := a.Count("EXISTS") + b.Count("EXISTS")
		t.Logf("Has: %v after %v, %d EXISTS sent", err, took, calls)
		if err == nil || took > time.Second {
			t.Fatalf("Has in a redirect loop: %v after %v", err, took)
		}
		if calls > 2*(maxRedirects+1) {
			t.Fatalf("%d EXISTS sent for one lookup, bound %d", calls, 2*(maxRedirects+1))
		}
		st := waitState(t, tr, tierstate.Down, time.Second)
		if !strings.Contains(st.Reason, "redirect loop between") || !strings.Contains(st.Reason, a.Addr()) || !strings.Contains(st.Reason, b.Addr()) {
			t.Fatalf("down reason %q does not name the loop between %s and %s", st.Reason, a.Addr(), b.Addr())
		}
		time.Sleep(time.Second)
		calls = a.Count("EXISTS") + b.Count("EXISTS")
		t.Logf("a second later: %d EXISTS in all; tier %s (%s)", calls, tr.Stats().State, tr.Stats().Reason)
		if calls > 100 {
			t.Fatalf("%d EXISTS a second after the loop was found", calls)
		}
	})
	t.Run("node to itself", func(t *testing.T) {
		var owner atomic.Pointer[string]
		var a *fakeresp.Node
		a = clusterNode(t, &owner, func() string { return a.Addr() })
		addr := a.Addr()
		owner.Store(&addr)
		cfg := fakeCfg(a)
		cfg.Cluster, cfg.StartupNodes = true, []string{a.Addr()}
		tr, _ := open(t, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := tr.Has(ctx, []string{"k"})
		if err == nil {
			t.Fatal("Has in a redirect loop succeeded")
		}
		// Lookups keep coming, as they do from a scheduler.
		for range 100 {
			_, _ = tr.Has(ctx, []string{"k"})
		}
		time.Sleep(time.Second)
		t.Logf("after 101 lookups and 1 s: %d connections accepted, %d open; %d EXISTS; tier %s (%s)",
			a.Accepted(), a.Open(), a.Count("EXISTS"), tr.Stats().State, tr.Stats().Reason)
		if a.Accepted() > 64 || tr.conns.Load() > tr.maxConns {
			t.Fatalf("%d connections accepted (%d held by the tier, bound %d)", a.Accepted(), tr.conns.Load(), tr.maxConns)
		}
		st := waitState(t, tr, tierstate.Down, time.Second)
		if !strings.Contains(st.Reason, "redirect loop between "+a.Addr()+" and itself") {
			t.Fatalf("down reason %q does not name the loop", st.Reason)
		}
	})
}

// TestHostileConnectionBound: dials past maxConns are refused, so no loop
// of reconnects can hold more connections than that.
func TestHostileConnectionBound(t *testing.T) {
	n := fakeresp.Start(t, fakeresp.Basic)
	tr, _ := open(t, fakeCfg(n))
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	var err error
	for range tr.maxConns + 1 {
		var c net.Conn
		if c, err = tr.dialConn(context.Background(), n.Addr()); err != nil {
			break
		}
		held = append(held, c)
	}
	if !errors.Is(err, errTooManyConns) || tr.conns.Load() > tr.maxConns {
		t.Fatalf("dial past the bound: %v; %d open, bound %d", err, tr.conns.Load(), tr.maxConns)
	}
	held[0].Close()
	held[0].Close() // a second Close gives nothing back twice
	c, err := tr.dialConn(context.Background(), n.Addr())
	if err != nil {
		t.Fatalf("a dial after a close: %v", err)
	}
	held[0] = c
}
