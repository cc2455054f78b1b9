package rpc_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/core/rpc/client"
)

// TestHandOffDoesNotWaitForSysmon: a request handed to an ordered worker
// right after its caller was busy for a while (a worker copying a prompt
// into its slots) starts without waiting for the Go runtime. With two Ps,
// one held by the in-process client blocked in zmq_poll, the worker readied
// by the hand-off must not wait until the runtime's sysmon takes back the P
// that the socket goroutine keeps while blocked in zmq_poll.
func TestHandOffDoesNotWaitForSysmon(t *testing.T) {
	prev := runtime.GOMAXPROCS(2)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	h := start(t, rpc.Options{OrderedWorkers: 1})
	waits := make(chan time.Duration, 64)
	h.srv.Handle(protocol.PrepareStore, func(_ context.Context, r *rpc.Request) (any, error) {
		waits <- rpc.SinceDispatch(r)
		return protocol.PrepareStoreResponse{}, nil
	})
	c := dial(t, h)
	key := protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: []uint32{1}, RequestID: "r"}
	// The 90th percentile: without the yield it was 1–5 ms (the median
	// 0.13–0.96 ms), with it 37–145 µs, under -race too. A stall is the
	// rule without the yield, load from elsewhere a spell: the guard
	// fails only when three rounds in a row show it.
	withinTries(t, 3, func() string {
		var got []time.Duration
		for range 40 {
			// Busy for 12 ms, as a worker copying a prompt: the socket
			// goroutine's P stays with it in zmq_poll meanwhile.
			for end := time.Now().Add(12 * time.Millisecond); time.Now().Before(end); {
			}
			if _, err := c.Call(context.Background(), protocol.PrepareStore, key, int64(1)); err != nil {
				t.Fatal(err)
			}
			got = append(got, <-waits)
		}
		slices.Sort(got)
		t.Logf("from dispatch to handler: p50 %v, p75 %v, p90 %v, max %v", got[len(got)/2], got[len(got)*3/4], got[len(got)*9/10], got[len(got)-1])
		if p90 := got[len(got)*9/10]; p90 > 500*time.Microsecond {
			return fmt.Sprintf("1 in 10 ordered requests waited %v or more between its hand-off and its handler: the worker waits for the runtime to take back a P", p90)
		}
		return ""
	})
}

// withinTries runs round up to tries times and fails the test with the
// last round's complaint when every round complains ("" is no complaint):
// for guards measured in time, which a spell of load from elsewhere can
// fail once.
func withinTries(t *testing.T, tries int, round func() string) {
	t.Helper()
	var why string
	for i := range tries {
		if why = round(); why == "" {
			return
		}
		t.Logf("round %d of %d: %s", i+1, tries, why)
	}
	t.Error(why)
}

// TestClientFollowerDoesNotWaitForSysmon: a caller whose reply the leading
// caller of a shared client received gets it without waiting for the Go
// runtime. The leader readies it on its own P, then blocks in zmq_poll for
// its own reply; with two Ps, the other held by the server's socket
// goroutine in zmq_poll, the follower must not wait until sysmon takes the
// P back. Judged against a lone caller's NOOPs on a second client, taken in
// turn with the follower's under the same conditions (so load from
// elsewhere falls on both).
func TestClientFollowerDoesNotWaitForSysmon(t *testing.T) {
	prev := runtime.GOMAXPROCS(2)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	h := start(t, rpc.Options{SharedWorkers: 1})
	release := make(chan struct{})
	h.srv.Handle(protocol.QueryPrefetchStatus, func(context.Context, *rpc.Request) (any, error) {
		<-release
		return 0, nil
	})
	shared, lone := dial(t, h), dial(t, h)
	// The leader: a call answered only at the end, so it stays in zmq_poll
	// and reads every other caller's reply.
	led := make(chan error, 1)
	go func() {
		_, err := shared.Call(context.Background(), protocol.QueryPrefetchStatus, "held")
		led <- err
	}()
	time.Sleep(20 * time.Millisecond)
	noop := func(c *client.Client) time.Duration {
		for end := time.Now().Add(12 * time.Millisecond); time.Now().Before(end); {
		}
		start := time.Now()
		if _, err := c.Call(context.Background(), protocol.Noop); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	// Without the yield some runs measured 1.1–3.0 ms against ~0.35 ms
	// alone; others showed no stall (it depends on the state of the
	// runtime's sysmon), and -race runs never did: a weak guard, kept
	// because a follower much slower than a lone caller is wrong anyway.
	withinTries(t, 3, func() string {
		var follower, alone []time.Duration
		for range 40 {
			follower = append(follower, noop(shared))
			alone = append(alone, noop(lone))
		}
		slices.Sort(follower)
		slices.Sort(alone)
		f, a := follower[len(follower)*3/4], alone[len(alone)*3/4]
		t.Logf("NOOP p75: read by another caller %v, alone %v", f, a)
		if f > 2*a+300*time.Microsecond {
			return fmt.Sprintf("1 in 4 NOOPs read by another caller took %v or more, alone %v: the follower waits for the runtime to take back a P", f, a)
		}
		return ""
	})
	close(release)
	if err := <-led; err != nil {
		t.Fatal(err)
	}
}
