package rpc_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/core/rpc/client"
)

// The client has no socket goroutine: the caller holding the socket reads
// for everyone. When it gives up (its deadline), a waiting caller must take
// over and still get its reply.
func TestClientLeaderHandOver(t *testing.T) {
	h := start(t, rpc.Options{SharedWorkers: 2})
	release := make(chan struct{})
	slowIn, fastIn := make(chan struct{}), make(chan struct{})
	leaderGone := make(chan struct{})
	h.srv.Handle(protocol.QueryPrefetchStatus, func(_ context.Context, r *rpc.Request) (any, error) {
		switch r.Args[0].(string) {
		case "slow":
			close(slowIn)
			<-release
		case "fast":
			// Answer only once the leader has given up, so the reply can
			// reach its caller only through a hand-over.
			close(fastIn)
			<-leaderGone
		}
		return r.Args[0].(string), nil
	})
	c := dial(t, h)
	defer close(release)
	// The short call leads (it is alone); the long one queues behind it, is
	// sent by it, then outlives it and must be answered.
	shortErr := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := c.Call(ctx, "QUERY_PREFETCH_STATUS", "slow")
		shortErr <- err
	}()
	select {
	case <-slowIn: // sent, so its caller holds the socket until its deadline
	case err := <-shortErr:
		t.Fatalf("slow call ended before reaching the server: %v", err)
	}
	type answer struct {
		got string
		err error
	}
	fast := make(chan answer, 1)
	go func() {
		var got string
		r, err := c.Call(context.Background(), "QUERY_PREFETCH_STATUS", "fast")
		if err == nil {
			err = r.Decode(&got)
		}
		fast <- answer{got, err}
	}()
	<-fastIn // the leader sent the queued call
	if err := <-shortErr; !errors.Is(err, client.ErrTimeout) {
		t.Fatalf("slow call: want ErrTimeout, got %v", err)
	}
	close(leaderGone)
	if a := <-fast; a.err != nil || a.got != "fast" {
		t.Fatalf("follower call: %q %v", a.got, a.err)
	}
	// A later lone call still works (the token came back).
	var got string
	r, err := c.Call(context.Background(), "QUERY_PREFETCH_STATUS", "again")
	if err != nil || r.Decode(&got) != nil || got != "again" {
		t.Fatalf("later call: %q %v", got, err)
	}
}

// Many callers with mixed deadlines: every call that returns without error
// has its own reply; none hangs.
func TestClientConcurrentCallsMixedDeadlines(t *testing.T) {
	h := start(t, rpc.Options{SharedWorkers: 4})
	h.srv.Handle(protocol.QueryPrefetchStatus, func(_ context.Context, r *rpc.Request) (any, error) {
		var n int
		fmt.Sscanf(r.Args[0].(string), "req-%d", &n)
		if n%7 == 0 {
			time.Sleep(30 * time.Millisecond)
		}
		return n, nil
	})
	c := dial(t, h)
	var wg sync.WaitGroup
	errs := make(chan error, 16*40)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				n := g*1000 + i
				timeout := 5 * time.Second
				if n%7 == 0 && g%2 == 0 {
					timeout = 5 * time.Millisecond
				}
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				r, err := c.Call(ctx, "QUERY_PREFETCH_STATUS", fmt.Sprintf("req-%d", n))
				cancel()
				if err != nil {
					if !errors.Is(err, client.ErrTimeout) || timeout != 5*time.Millisecond {
						errs <- fmt.Errorf("call %d: %w", n, err)
					}
					continue
				}
				var got int
				if err := r.Decode(&got); err != nil || got != n {
					errs <- fmt.Errorf("call %d: reply %d (%v)", n, got, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
