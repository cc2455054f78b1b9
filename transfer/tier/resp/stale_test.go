package resp

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"kvdock/core/tierstate"
)

// After the server restarts, the tier's idle value connections are all
// closed by it; a read finds one broken, and must then try a fresh
// connection rather than the next idle one of the same age.
func TestReadAfterServerRestartSkipsStaleIdleConnections(t *testing.T) {
	tr, s := startTier(t)
	ctx := context.Background()
	v := value(3, 64<<10)
	if err := tr.Put(ctx, key(3), v); err != nil {
		t.Fatal(err)
	}
	// Concurrent reads leave several idle connections to the node.
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got, err := tr.Get(ctx, key(3)); err != nil || !bytes.Equal(got, v) {
				t.Errorf("read before the restart: %v", err)
			}
		}()
	}
	wg.Wait()
	if idle := tr.streams.idleCount(); idle < 2 {
		t.Fatalf("%d idle value connections after 8 concurrent reads, want several", idle)
	}
	s.Restart()
	if _, err := s.Do(ctx, "SET", tr.serverKey(key(3)), string(v)); err != nil {
		t.Fatal(err)
	}
	if got, err := tr.Get(ctx, key(3)); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("read after the restart: %v", err)
	}
}

// TestServerRestartedBetweenCallsKeepsTierUp: a server killed and started
// again between two calls, faster than the health check looks, has closed
// every connection the clients hold. The first calls find theirs closed;
// that is the connections' story, not the server's: the tier stays up and
// the next calls succeed. (A tier marked down by such a call right after
// coming back up fails every call until its probe runs again.)
func TestServerRestartedBetweenCallsKeepsTierUp(t *testing.T) {
	tr, s := startTier(t)
	ctx := context.Background()
	v := value(4, 4<<10)
	if err := tr.Put(ctx, key(4), v); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Has(ctx, []string{key(4)}); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	s.Restart()
	if _, err := s.Do(ctx, "SET", tr.serverKey(key(4)), string(v)); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		// Each call may fail on its stale connection; none may turn the
		// tier down.
		_, herr := tr.Has(ctx, []string{key(4)})
		perr := tr.Put(ctx, key(5+i), value(5+i, 4<<10))
		if st := tr.Stats(); st.State != tierstate.Up {
			t.Fatalf("call %d after the restart (has: %v, put: %v): tier %s (%q)", i, herr, perr, st.State, st.Reason)
		}
	}
	if got, err := tr.Get(ctx, key(4)); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("read after the restart: %v", err)
	}
	if n, err := tr.Has(ctx, []string{key(4)}); err != nil || n != 1 {
		t.Fatalf("has after the restart: %d, %v", n, err)
	}
}
