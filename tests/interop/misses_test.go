package interop

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"kvdock/tests/harness"
)

type missesDoc struct {
	Lookup struct {
		RequestedChunks int64 `json:"requested_chunks"`
		HitChunks       int64 `json:"hit_chunks"`
	} `json:"lookup"`
	Misses struct {
		Missed      map[string]uint64 `json:"missed"`
		TotalMissed uint64            `json:"total_missed"`
		GhostBytes  int64             `json:"ghost_bytes"`
		Contexts    []struct {
			ModelName string            `json:"model_name"`
			WorldSize int               `json:"world_size"`
			Missed    map[string]uint64 `json:"missed"`
		} `json:"contexts"`
	} `json:"misses"`
}

// TestMissReasonsOverTheWire produces every miss reason on purpose with real
// Python workers (pyzmq, msgpack, torch, SHM) and checks /status's
// breakdown exactly, per context and in total, and the metrics.
func TestMissReasonsOverTheWire(t *testing.T) {
	// 64 MiB pool: 16 chunks of 4 MiB; a 4 s write TTL (pending stores are
	// given up after 2 s). LRU, so that the step that counts evictions
	// knows its victims: the default policy keeps what it predicts comes
	// back, and which prompt that is does not concern the miss reasons.
	srv := harness.Start(t, "--l1-write-ttl-seconds", "4", "--eviction-policy", "LRU")
	p, err := json.Marshal(map[string]any{"status_url": srv.StatusURL(), "write_ttl": 4})
	if err != nil {
		t.Fatal(err)
	}
	out := harness.RunPython(t, 180*time.Second, "py/misses_worker.py", srv.Endpoint, string(p))
	var res struct {
		Hits map[string]int `json:"hits"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &res); err != nil {
		t.Fatalf("worker output %q: %v", out, err)
	}
	for step, hits := range res.Hits {
		want := 0
		if step == "hit" {
			want = 1
		}
		if hits != want {
			t.Errorf("step %s: lookup hit %d chunks, want %d", step, hits, want)
		}
	}

	resp, err := http.Get(srv.StatusURL())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st missesDoc
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	wantCtx := map[string]map[string]uint64{
		"miss-model/1": {"never_stored": 3 + 1, "expired": 2, "evicted": 4, "refused": 17, "cleared": 2,
			"after_miss": 2, "other_layout": 0},
		"miss-model/2": {"other_layout": 2, "never_stored": 0, "expired": 0, "evicted": 0, "refused": 0,
			"cleared": 0, "after_miss": 0},
	}
	if len(st.Misses.Contexts) != len(wantCtx) {
		t.Fatalf("contexts %+v", st.Misses.Contexts)
	}
	total := map[string]uint64{}
	for _, c := range st.Misses.Contexts {
		name := c.ModelName + "/" + string(rune('0'+c.WorldSize))
		want, ok := wantCtx[name]
		if !ok {
			t.Fatalf("unexpected context %s", name)
		}
		if !sameCounts(c.Missed, want) {
			t.Errorf("context %s: missed %v, want %v", name, c.Missed, want)
		}
		for k, v := range want {
			total[k] += v
		}
	}
	if !sameCounts(st.Misses.Missed, total) {
		t.Errorf("total missed %v, want %v", st.Misses.Missed, total)
	}
	// Every chunk asked and not hit has exactly one reason.
	if got, want := st.Misses.TotalMissed, uint64(st.Lookup.RequestedChunks-st.Lookup.HitChunks); got != want || want != 33 {
		t.Errorf("total_missed %d, requested-hit %d, want 33", got, want)
	}
	if st.Misses.GhostBytes <= 0 || st.Misses.GhostBytes > 1<<20 {
		t.Errorf("ghost_bytes %d", st.Misses.GhostBytes)
	}

	resp, err = http.Get(strings.TrimSuffix(srv.StatusURL(), "/status") + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		`kvdock_lookup_missed_chunks_total{reason="refused"} 17`,
		`kvdock_lookup_missed_chunks_total{reason="other_layout"} 2`,
		`kvdock_context_lookup_missed_chunks_total{model="miss-model",reason="evicted",world_size="1"} 4`,
	} {
		if !strings.Contains(b.String(), line+"\n") {
			t.Errorf("/metrics lacks %s", line)
		}
	}
}

func sameCounts(a, b map[string]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return true
}
