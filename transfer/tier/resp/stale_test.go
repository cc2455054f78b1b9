package resp

import (
	"bytes"
	"context"
	"sync"
	"testing"
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
