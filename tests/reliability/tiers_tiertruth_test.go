package reliability

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"kvdock/core/testkit/poll"
	"kvdock/core/testkit/redisserver"
	"kvdock/tests/harness"
)

// The resp tier's figures are true, against the real binary and a real
// redis-server: Redis holds no more than max_capacity_gb across restarts of
// kvdock, the tier's misses count the lookups that asked it in vain, and a
// server that dies while nothing touches the tier shows down within seconds.

// tiertruthHidden makes 256 KiB chunks (320 KiB on the server each).
const tiertruthHidden = 1024

// redisValues is what r holds of kvdock's values (the share lists left
// out): how many and their MEMORY USAGE in all.
func redisValues(t *testing.T, r *redisserver.Server) (int, int64) {
	t.Helper()
	all, err := r.Holds(t.Context(), "*kvdock:*")
	if err != nil {
		t.Fatal(err)
	}
	n, bytes := 0, int64(0)
	for k, sz := range all {
		if strings.Contains(k, "kvdock:index:") {
			continue
		}
		n++
		bytes += sz
	}
	return n, bytes
}

// TestTierTruthRESPCapacityAcrossRestarts: chunks stored past the resp
// tier's capacity, kvdock restarted, more stored: Redis holds at most the
// capacity (as MEMORY USAGE counts it), and /status says what Redis holds.
func TestTierTruthRESPCapacityAcrossRestarts(t *testing.T) {
	r := redisserver.Start(t, redisserver.Options{})
	capGB := 0.002 // 2,147,483 bytes: six chunks
	capBytes := int64(capGB * (1 << 30))
	args := []string{"--chunk-size", "16", "--l2-adapter",
		tierAdapter(t, map[string]any{"type": "resp", "host": "127.0.0.1", "port": r.Port, "max_capacity_gb": capGB})}
	run := func(from int) (int, int64) {
		srv := harness.Start(t, args...)
		w := tierWorker(t, srv, 1, "tiertruth-cap", tiertruthHidden)
		for seed := from; seed < from+12; seed++ {
			storePrompt(t, w, seed, 1)
		}
		waitTierIdle(t, srv)
		n, bytes := redisValues(t, r)
		// The count settles with the last write's MEMORY USAGE.
		poll.Until(t, 10*time.Second, "/status used_bytes = Redis", func() bool {
			st := tier0(t, srv)
			return st.UsedBytes == bytes && st.Objects == int64(n)
		})

		srv.Stop(t)
		return n, bytes
	}
	n1, b1 := run(0)
	n2, b2 := run(100)
	t.Logf("capacity %d bytes: first run Redis holds %d chunks, %d bytes; after a restart and 12 more: %d chunks, %d bytes",
		capBytes, n1, b1, n2, b2)
	if b1 > capBytes || b2 > capBytes || n2 == 0 {
		t.Fatalf("Redis holds %d bytes, then %d after a restart; capacity %d", b1, b2, capBytes)
	}
}

// TestTierTruthRESPMissesAndIdleDown: lookups of chunks the tier lacks count
// as its misses (as many as misses.tier_missed); with no traffic, a killed
// redis-server turns the tier down within 10 s.
func TestTierTruthRESPMissesAndIdleDown(t *testing.T) {
	r := redisserver.Start(t, redisserver.Options{})
	srv := harness.Start(t, "--chunk-size", "16", "--l2-adapter",
		tierAdapter(t, map[string]any{"type": "resp", "host": "127.0.0.1", "port": r.Port}))
	w := tierWorker(t, srv, 1, "tiertruth-miss", harness.WorkerHidden)
	const lookups = 3
	for i := range lookups {
		if h, err := harness.Lookup(context.Background(), w.C, w.Model, harness.Tokens(500+i, 1, w.Chunk), fmt.Sprintf("m-%d", i)); err != nil || h != 0 {
			t.Fatalf("lookup of a chunk never stored: %d hits, %v", h, err)
		}
	}
	st := srv.Status(t)
	if len(st.Tiers) != 1 || st.Tiers[0].Misses != lookups || st.Misses.TierMissed != lookups {
		t.Fatalf("after %d lookups of one chunk the tier lacks: tier misses %d, misses.tier_missed %d", lookups, st.Tiers[0].Misses, st.Misses.TierMissed)
	}

	if s := tier0(t, srv).State; s != "up" {
		t.Fatalf("tier %s before the kill", s)
	}
	killed := time.Now()
	r.Kill()
	poll.Until(t, 10*time.Second, "idle resp tier down after redis-server was killed", func() bool { return tier0(t, srv).State == "down" })
	t.Logf("%d lookups: %d tier misses; idle tier down %v after SIGKILL (%q)",
		lookups, st.Tiers[0].Misses, time.Since(killed).Round(time.Millisecond), tier0(t, srv).Reason)
}
