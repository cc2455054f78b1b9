package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"kvdock/core/rpc/client"
	"kvdock/tests/harness"
	"kvdock/transfer/worker"
)

// viewStatus is the part of /status the operator's view across a restart
// is read from.
type viewStatus struct {
	StartedAt *time.Time `json:"started_at"`
	Pool      struct {
		ResidentBytes int64   `json:"resident_bytes"`
		UsableBytes   int64   `json:"usable_bytes"`
		UsableRatio   float64 `json:"usable_ratio"`
		Objects       int     `json:"objects"`
	} `json:"pool"`
	Misses struct {
		TotalMissed uint64 `json:"total_missed"`
	} `json:"misses"`
	TokensSaved struct {
		Total int64 `json:"total"`
	} `json:"tokens_saved"`
	StatsSince     *time.Time `json:"stats_since"`
	StatsRule      string     `json:"stats_rule"`
	StatsCarriedAt *time.Time `json:"stats_carried_at"`
	Restart        struct {
		Adopted            bool `json:"adopted"`
		StatsCarried       bool `json:"stats_carried"`
		PromptLinks        int  `json:"prompt_links"`
		PromptLinksDropped int  `json:"prompt_links_dropped"`
	} `json:"restart"`
	Events []struct {
		Time    time.Time `json:"time"`
		Message string    `json:"message"`
	} `json:"events"`
}

func getView(t *testing.T, srv *harness.Server) viewStatus {
	t.Helper()
	hc := http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/status", srv.HTTPPort))
	if err != nil {
		t.Fatalf("/status: %v", err)
	}
	defer resp.Body.Close()
	var st viewStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("decode /status: %v", err)
	}
	return st
}

// TestRestartKeepsTheOperatorsView: 40 prompts of 4 chunks under the
// prefix policy, looked up (hits and a miss), then SIGUSR2: the new image's
// /status gives the same usable bytes and usable_ratio (1.0: every chunk's
// parent is resident), the same tokens saved, misses and start of the
// figures, with the rule and the previous process's events.
func TestRestartKeepsTheOperatorsView(t *testing.T) {
	srv := harness.StartKeeping(t, false, "--eviction-policy", "prefix")
	ctx := context.Background()
	c, err := client.Dial(srv.Endpoint, harness.Profile(t, srv.Protocol), client.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w, err := worker.Register(ctx, c, worker.Config{InstanceID: 5, Model: "view-model", Layers: 1, Hidden: 16, Dtype: "float32"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	const prompts, chunks = 40, 4
	n := w.Layout().Bytes
	data := make([][]byte, chunks)
	for j := range data {
		data[j] = make([]byte, n)
	}
	tokens := func(p int) []uint32 {
		ts := make([]uint32, chunks*w.ChunkTokens())
		for i := range ts {
			ts[i] = uint32(p*1_000_000 + i)
		}
		return ts
	}
	sched := worker.Scheduler{C: c}
	for p := range prompts {
		if res, err := w.Store(ctx, w.Key(tokens(p), chunks, fmt.Sprint("s", p)), data); err != nil || !res.Committed {
			t.Fatalf("store %d: %+v %v", p, res, err)
		}
		id := fmt.Sprint("r", p)
		if hits, err := sched.Hits(ctx, w.LookupKey(tokens(p), id), 1); err != nil || hits != chunks {
			t.Fatalf("lookup %d: %d hits, %v", p, hits, err)
		}
		_ = sched.EndSession(ctx, id)
	}
	if hits, err := sched.Hits(ctx, w.LookupKey(tokens(999), "miss"), 1); err != nil || hits != 0 {
		t.Fatalf("unknown prompt: %d hits, %v", hits, err)
	}
	_ = sched.EndSession(ctx, "miss")
	// The sampler rates the counters once a second: wait until the
	// tokens saved show, then until they stop changing.
	var before viewStatus
	for deadline := time.Now().Add(15 * time.Second); ; {
		before = getView(t, srv)
		if before.TokensSaved.Total > 0 && before.Misses.TotalMissed > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no tokens saved or misses on /status within 15 s: %+v", before)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if before.Pool.Objects != prompts*chunks || before.Pool.UsableRatio != 1 || before.Pool.UsableBytes != before.Pool.ResidentBytes {
		t.Fatalf("before the restart: %+v", before.Pool)
	}

	srv.RestartSignal(t)
	after := getView(t, srv)
	switch {
	case !after.Restart.Adopted || !after.Restart.StatsCarried || after.StatsCarriedAt == nil:
		t.Fatalf("restart %+v, carried at %v\n%s", after.Restart, after.StatsCarriedAt, srv.Output())
	case after.Pool.UsableBytes != before.Pool.UsableBytes || after.Pool.UsableRatio != before.Pool.UsableRatio ||
		after.Pool.ResidentBytes != before.Pool.ResidentBytes:
		t.Fatalf("pool after SIGUSR2 %+v, before %+v", after.Pool, before.Pool)
	case after.Restart.PromptLinks != prompts*(chunks-1) || after.Restart.PromptLinksDropped != 0:
		t.Fatalf("%d prompt links restored (%d dropped), want %d", after.Restart.PromptLinks, after.Restart.PromptLinksDropped, prompts*(chunks-1))
	case after.TokensSaved.Total != before.TokensSaved.Total || after.Misses.TotalMissed != before.Misses.TotalMissed:
		t.Fatalf("tokens saved %d, misses %d after; %d, %d before", after.TokensSaved.Total, after.Misses.TotalMissed,
			before.TokensSaved.Total, before.Misses.TotalMissed)
	case after.StatsSince == nil || before.StatsSince == nil || !after.StatsSince.Equal(*before.StatsSince):
		t.Fatalf("stats since %v after, %v before", after.StatsSince, before.StatsSince)
	case after.StatsRule == "":
		t.Fatal("/status states no rule for the figures")
	}
	old := before.Events[0]
	for _, ev := range after.Events {
		if ev.Time.Equal(old.Time) && ev.Message == old.Message {
			return
		}
	}
	t.Fatalf("the event %q of the previous process is not on /status after the restart", old.Message)
}
