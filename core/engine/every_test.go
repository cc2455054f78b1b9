package engine

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"kvdock/core/testkit/poll"
)

func TestEveryRunsUntilCancelled(t *testing.T) {
	var n atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { every(time.Millisecond, func() { n.Add(1) })(ctx); close(done) }()
	poll.Until(t, 10*time.Second, "three passes", func() bool { return n.Load() >= 3 })
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the loop did not return after cancel")
	}
}
