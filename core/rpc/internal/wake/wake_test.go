package wake

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// Many producers, one polling owner: every published item must be seen
// without the owner ever sleeping past a signal.
func TestNoLostWakeups(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	w, err := New(zctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var published atomic.Int64
	const producers, each = 8, 2000
	var wg sync.WaitGroup
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				published.Add(1)
				w.Signal()
			}
		}()
	}
	poller := zmq.NewPoller()
	poller.Add(w.Socket(), zmq.POLLIN)
	var taken int64
	for taken < producers*each {
		// A lost wake-up shows as a poll timeout with work outstanding.
		polled, err := poller.Poll(2 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if len(polled) == 0 {
			t.Fatalf("lost wake-up: %d of %d taken", taken, producers*each)
		}
		w.Drain()
		taken = published.Load()
	}
	wg.Wait()
}
