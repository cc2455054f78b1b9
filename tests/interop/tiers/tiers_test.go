// Package tiers holds the end-to-end tier tests: the real binary with
// --l2-adapter (fs, resp, resp cluster), real redis-server processes and
// Python workers (pyzmq, msgpack, torch) that check every retrieved chunk
// with torch.equal.
package tiers

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"kvdock/core/testkit/redisserver"
	"kvdock/tests/harness"
)

// tierStatus is the part of /status the tier tests read.
type tierStatus struct {
	Index         int    `json:"index"`
	Type          string `json:"type"`
	State         string `json:"state"`
	Reason        string `json:"reason"`
	Objects       int64  `json:"objects"`
	Hits          uint64 `json:"hits"`
	Corrupt       uint64 `json:"corrupt"`
	QueueDepth    int    `json:"queue_depth"`
	DroppedWrites uint64 `json:"dropped_writes"`
	Loads         uint64 `json:"loads"`
	LoadTimeouts  uint64 `json:"load_timeouts"`
}

func tiersOf(t *testing.T, srv *harness.Server) []tierStatus {
	t.Helper()
	resp, err := http.Get(srv.StatusURL())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Tiers []tierStatus `json:"tiers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("/status: %v", err)
	}
	return st.Tiers
}

func adapterJSON(t *testing.T, a map[string]any) string {
	t.Helper()
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tierParams are the worker parameters of a tier scenario: prompts of
// chunks chunks each, the data seeded by seed.
func tierParams(model string, prompts, chunks, seed int) map[string]any {
	return map[string]any{"model": model, "dtype": "bfloat16", "layers": 2, "hidden": 32,
		"prompts": prompts, "chunks": chunks, "seed": seed}
}

func with(p map[string]any, kv ...any) map[string]any {
	out := make(map[string]any, len(p)+len(kv)/2)
	for k, v := range p {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

// storeThenCheckElsewhere stores on a (waiting until a's tiers wrote it)
// and checks on b that every chunk is a hit with identical bytes.
func storeThenCheckElsewhere(t *testing.T, a, b *harness.Server, p map[string]any) map[string]any {
	t.Helper()
	st := harness.LMCacheWorker(t, harness.Python, a, "tier_store", with(p, "status_url", a.StatusURL()))
	want := p["prompts"].(int) * p["chunks"].(int)
	if st["stored"] != float64(want) {
		t.Fatalf("stored %v chunks, want %d", st["stored"], want)
	}
	for _, ti := range tiersOf(t, a) {
		if ti.DroppedWrites != 0 {
			t.Fatalf("tier %d dropped %d writes of a small store: %+v", ti.Index, ti.DroppedWrites, ti)
		}
	}
	res := harness.LMCacheWorker(t, harness.Python, b, "tier_check", with(p, "strict", true))
	if res["wrong"] != float64(0) || res["missed"] != float64(0) || res["good"] != float64(want) {
		t.Fatalf("check on the other server: %v", res)
	}
	return res
}

// TestTierFSWarmRestart: chunks stored through an fs tier are hits after
// kvdock is stopped (SIGTERM) and started again with a new pool.
func TestTierFSWarmRestart(t *testing.T) {
	dir := t.TempDir()
	adapter := adapterJSON(t, map[string]any{"type": "fs", "base_path": dir, "max_capacity_gb": 1})
	args := []string{"--chunk-size", "16", "--l2-adapter", adapter}
	first := harness.Start(t, args...)
	p := tierParams("tier-fs-warm", 3, 2, 1)
	st := harness.LMCacheWorker(t, harness.Python, first, "tier_store", with(p, "status_url", first.StatusURL()))
	if st["mode"] != "shm" {
		t.Fatalf("store mode %v, want shm", st["mode"])
	}
	if ts := tiersOf(t, first); len(ts) != 1 || ts[0].Objects != 6 || ts[0].State != "up" {
		t.Fatalf("fs tier after the store: %+v", ts)
	}
	first.Stop(t)

	second := harness.Start(t, args...) // a new segment: a new, empty pool
	if second.Segment == first.Segment {
		t.Fatal("the restart reused the segment name")
	}
	res := harness.LMCacheWorker(t, harness.Python, second, "tier_check", with(p, "strict", true))
	if fmt.Sprint(res["hits"]) != "[2 2 2]" || res["good"] != float64(6) {
		t.Fatalf("after the restart: %v", res)
	}
	ts := tiersOf(t, second)
	if len(ts) != 1 || ts[0].Objects != 6 || ts[0].Loads == 0 || ts[0].Corrupt != 0 {
		t.Fatalf("fs tier after the warm restart: %+v", ts)
	}
}

// TestTierRESPSharedByTwoServers: two kvdock processes (own pools, same
// model and layout) share one redis-server: what A stores, B serves.
func TestTierRESPSharedByTwoServers(t *testing.T) {
	r := redisserver.Start(t, redisserver.Options{})
	adapter := adapterJSON(t, map[string]any{"type": "resp", "host": "127.0.0.1", "port": r.Port})
	a := harness.Start(t, "--chunk-size", "16", "--l2-adapter", adapter)
	b := harness.Start(t, "--chunk-size", "16", "--l2-adapter", adapter)
	storeThenCheckElsewhere(t, a, b, tierParams("tier-resp-shared", 3, 2, 2))
	if ts := tiersOf(t, b); len(ts) != 1 || ts[0].Type != "resp" || ts[0].Loads == 0 || ts[0].Corrupt != 0 {
		t.Fatalf("B's resp tier: %+v", ts)
	}
}

// TestTierRESPClusterSharedByTwoServers is the same over a 3-node Redis
// Cluster on loopback.
func TestTierRESPClusterSharedByTwoServers(t *testing.T) {
	c := redisserver.StartCluster(t, 3)
	adapter := adapterJSON(t, map[string]any{"type": "resp", "cluster": true, "startup_nodes": c.Addrs()})
	a := harness.Start(t, "--chunk-size", "16", "--l2-adapter", adapter)
	b := harness.Start(t, "--chunk-size", "16", "--l2-adapter", adapter)
	// Enough prompts that the keys land on every node's slots.
	storeThenCheckElsewhere(t, a, b, tierParams("tier-resp-cluster", 8, 2, 3))
	if ts := tiersOf(t, b); len(ts) != 1 || ts[0].State != "up" || ts[0].Loads == 0 {
		t.Fatalf("B's cluster tier: %+v", ts)
	}
	for _, n := range c.Nodes {
		if keys, err := n.Do(t.Context(), "DBSIZE"); err != nil || keys == "0" {
			t.Errorf("cluster node %s holds %q keys (%v): the values did not spread", n.Addr, keys, err)
		}
	}
}

// TestTierFSOverSubscribedL1: 3× the L1 pool stored through an fs tier;
// every chunk is still retrievable (from L1 or the tier), none wrong.
func TestTierFSOverSubscribedL1(t *testing.T) {
	dir := t.TempDir()
	adapter := adapterJSON(t, map[string]any{"type": "fs", "base_path": dir, "max_capacity_gb": 1})
	// 64 MiB pool (the harness's --l1-size-gb 0.0625); 4 MiB chunks
	// (2×2×256×1024 float32), 12 prompts of 4 = 192 MiB. A lookup's tier
	// phase gives up after 2 s by default, which a loaded machine reached
	// (a prompt hit 3 of its 4 chunks right after the full suite): the
	// test is of what is kept, not of how fast it loads.
	srv := harness.Start(t, "--chunk-size", "256", "--l2-adapter", adapter, "--l2-prefetch-load-timeout", "60")
	p := map[string]any{"model": "tier-oversub", "dtype": "float32", "layers": 2, "hidden": 1024,
		"prompts": 12, "chunks": 4, "seed": 4}
	st := harness.LMCacheWorker(t, harness.Python, srv, "tier_store", with(p, "status_url", srv.StatusURL()))
	stored := st["stored"].(float64) * st["chunk_bytes"].(float64)
	if st["chunk_bytes"] != float64(4<<20) || stored < 3*64<<20 {
		t.Fatalf("stored %v B in %v B chunks: not 3× the 64 MiB pool", stored, st["chunk_bytes"])
	}
	res := harness.LMCacheWorker(t, harness.Python, srv, "tier_check", p)
	ts := tiersOf(t, srv)
	if res["good"] != float64(48) || res["wrong"] != float64(0) || res["missed"] != float64(0) {
		t.Fatalf("over-subscribed check: %v; the tier: %+v", res, ts)
	}
	if len(ts) != 1 || ts[0].Loads == 0 || ts[0].DroppedWrites != 0 || ts[0].Objects != 48 {
		t.Fatalf("fs tier after the over-subscribed run: %+v", ts)
	}
}
