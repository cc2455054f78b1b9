package interop

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"kvdock/core/testkit/poll"
	"kvdock/tests/harness"
)

// insightDoc is the part of /status that a benchmark could skew.
type insightDoc struct {
	Lookup struct {
		Lookups         int64 `json:"lookups"`
		RequestedChunks int64 `json:"requested_chunks"`
		HitChunks       int64 `json:"hit_chunks"`
		Bench           struct {
			Lookups int64 `json:"lookups"`
		} `json:"bench"`
	} `json:"lookup"`
	Misses struct {
		Missed map[string]uint64 `json:"missed"`
	} `json:"misses"`
	TokensSaved struct {
		Total int64 `json:"total"`
	} `json:"tokens_saved"`
	WhatIf struct {
		Sampled  uint64  `json:"sampled_lookups"`
		Measured float64 `json:"measured_hit_ratio"`
		Window   string  `json:"window"`
	} `json:"whatif"`
	Pool struct {
		Objects int `json:"objects"`
	} `json:"pool"`
	StatsResetAt *time.Time `json:"stats_reset_at"`
}

func insight(t *testing.T, srv *harness.Server) insightDoc {
	t.Helper()
	res, err := http.Get(srv.StatusURL())
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var d insightDoc
	if err := json.NewDecoder(res.Body).Decode(&d); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestBenchLeavesWorkersFigures: `kvdock bench` against a live server (as
// the README suggests) leaves what the real workers (Python, pyzmq, torch)
// see in /status as it was: their lookups, hits, tokens saved, miss
// breakdown and what-if; its own lookups are counted apart. `kvdock ctl
// reset-stats` (with the token) then zeroes the figures and keeps the cache.
func TestBenchLeavesWorkersFigures(t *testing.T) {
	const token = "bench-apart-token"
	srv := harness.Start(t, "--chunk-size", "16", "--http-token", token)
	res := worker(t, srv, "roundtrip", map[string]any{
		"model": "real-model", "dtype": "float16", "mla": false, "world": 1, "layers": 2, "hidden": 32, "chunks": 3,
	})
	if res["hits"] != float64(3) {
		t.Fatalf("worker: %v", res)
	}
	// Tokens saved are taken from the rate samples (one a second); the
	// limit only bounds a failure, and a loaded machine may skip a tick.
	poll.Until(t, 15*time.Second, "the worker's tokens saved sampled", func() bool {
		return insight(t, srv).TokensSaved.Total > 0
	})
	before := insight(t, srv)
	if before.Lookup.Lookups != 1 || before.Lookup.HitChunks != 3 || before.TokensSaved.Total == 0 || before.WhatIf.Sampled == 0 {
		t.Fatalf("the worker's figures before the bench: %+v", before)
	}

	benchStart := time.Now()
	out, err := harness.Run(t, nil, "bench", "--host", "127.0.0.1", "--port", strconv.Itoa(srv.Port),
		"--http-port", strconv.Itoa(srv.HTTPPort), "--server-pid", strconv.Itoa(srv.PID()),
		"--mode", "shm", "--layers", "2", "--hidden", "64", "--dtype", "float16", "--workers", "1", "--rounds", "1", "--prompts", "2",
		"--small-duration", "100ms", "--ref-duration", "100ms", "--timeout", "10s")
	if err != nil {
		t.Fatalf("kvdock bench: %v\n%s", err, out)
	}
	t.Logf("bench ran %v", time.Since(benchStart).Round(time.Millisecond))
	after := insight(t, srv)
	if after.Lookup.Bench.Lookups == 0 {
		t.Fatalf("the bench's lookups were not seen apart: %+v", after.Lookup)
	}
	if after.Lookup.Lookups != before.Lookup.Lookups || after.Lookup.RequestedChunks != before.Lookup.RequestedChunks ||
		after.Lookup.HitChunks != before.Lookup.HitChunks || after.TokensSaved.Total != before.TokensSaved.Total ||
		after.WhatIf.Sampled != before.WhatIf.Sampled || after.WhatIf.Measured != before.WhatIf.Measured ||
		!sameCounts(after.Misses.Missed, before.Misses.Missed) {
		t.Fatalf("%d bench lookups moved the workers' figures:\nbefore %+v\nafter  %+v", after.Lookup.Bench.Lookups, before, after)
	}
	t.Logf("bench: %d lookups apart; workers' figures unchanged (%d lookups, %d hit chunks, %d tokens saved, what-if %d sampled, %s)",
		after.Lookup.Bench.Lookups, after.Lookup.Lookups, after.Lookup.HitChunks, after.TokensSaved.Total, after.WhatIf.Sampled, after.WhatIf.Window)

	// The reset needs the token, then zeroes the figures; the cache stays.
	if out, err := harness.Run(t, nil, "ctl", "--http-port", strconv.Itoa(srv.HTTPPort), "reset-stats"); err == nil || !strings.Contains(out, "token") {
		t.Fatalf("reset-stats without the token: %v\n%s", err, out)
	}
	if d := insight(t, srv); d.Lookup.Lookups != 1 || d.StatsResetAt != nil {
		t.Fatalf("a refused reset reset: %+v", d)
	}
	out, err = harness.Run(t, []string{"KVDOCK_HTTP_TOKEN=" + token}, "ctl", "--http-port", strconv.Itoa(srv.HTTPPort), "reset-stats")
	if err != nil || !strings.Contains(out, "statistics reset at") {
		t.Fatalf("reset-stats: %v\n%s", err, out)
	}
	d := insight(t, srv)
	if d.Lookup.Lookups != 0 || d.Lookup.HitChunks != 0 || d.Lookup.Bench.Lookups != 0 || d.TokensSaved.Total != 0 ||
		d.WhatIf.Sampled != 0 || d.StatsResetAt == nil || d.Pool.Objects != after.Pool.Objects {
		t.Fatalf("after reset-stats: %+v (objects before %d)", d, after.Pool.Objects)
	}
	for reason, n := range d.Misses.Missed {
		if n != 0 {
			t.Fatalf("after reset-stats %s = %d", reason, n)
		}
	}
}
