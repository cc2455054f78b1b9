package engine

import (
	"context"
	"fmt"
	"math"
	"testing"

	"kvdock/transfer/worker"
)

// TestRestartCarriesTheOperatorsView: the figures a restart hands over
// follow engine.StatsRule. A restart that adopts the pool keeps the hit
// and lookup histories, tokens saved, the miss breakdown, the events, the
// usable bytes and the start of the figures; a restart whose pool cannot be
// adopted (a new size) keeps the server's figures and starts the miss
// breakdown with its new pool, as a rebuild does.
func TestRestartCarriesTheOperatorsView(t *testing.T) {
	cfg, _ := keepConfig(t)
	ctx := context.Background()
	e := startEngine(t, cfg)
	e.sampleRates() // the first reading of the counters: the next one rates them
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	w, err := worker.Register(ctx, c, worker.Config{InstanceID: 3, Model: "m", Layers: 1, Hidden: 16, Dtype: "float32"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	const prompts, chunks = 6, 3
	n := w.Layout().Bytes
	sched := worker.Scheduler{C: c}
	for p := range prompts {
		toks := promptTokens(p, chunks, w.ChunkTokens())
		data := [][]byte{chunkOf(p, 0, n), chunkOf(p, 1, n), chunkOf(p, 2, n)}
		if res, err := w.Store(ctx, w.Key(toks, chunks, fmt.Sprint("s", p)), data); err != nil || !res.Committed {
			t.Fatalf("store %d: %+v %v", p, res, err)
		}
		id := fmt.Sprint("r", p)
		if hits, err := sched.Hits(ctx, w.LookupKey(toks, id), 1); err != nil || hits != chunks {
			t.Fatalf("lookup %d: %d %v", p, hits, err)
		}
		_ = sched.EndSession(ctx, id)
	}
	// A prompt nobody stored: its chunks miss, never stored.
	if hits, err := sched.Hits(ctx, w.LookupKey(promptTokens(50, chunks, w.ChunkTokens()), "miss"), 1); err != nil || hits != 0 {
		t.Fatalf("unknown prompt: %d %v", hits, err)
	}
	_ = sched.EndSession(ctx, "miss")
	e.sampleRates()
	before := e.Snapshot()
	bs := before.Rates.Server
	if bs.TokensSavedTotal == 0 || before.Misses.Total.Total() == 0 || before.Pool.UsableBytes == 0 {
		t.Fatalf("before: tokens %d, misses %d, usable %d", bs.TokensSavedTotal, before.Misses.Total.Total(), before.Pool.UsableBytes)
	}
	if err := e.StopKeeping(ctx); err != nil {
		t.Fatal(err)
	}

	e2 := New(cfg, Options{Version: "next"})
	if err := e2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	after := e2.Snapshot()
	as := after.Rates.Server
	switch {
	case !after.Restart.Adopted || !after.Restart.StatsCarried || after.Stats.Carried.IsZero():
		t.Fatalf("restart %+v, stats %+v", after.Restart, after.Stats)
	case !after.Stats.Since.Equal(before.Stats.Since):
		t.Fatalf("figures since %v after the restart, %v before", after.Stats.Since, before.Stats.Since)
	case as.TokensSavedTotal != bs.TokensSavedTotal || math.Abs(as.TokensSavedHour-bs.TokensSavedHour) > 1e-6:
		t.Fatalf("tokens saved %d (%.0f in the hour) after, %d (%.0f) before",
			as.TokensSavedTotal, as.TokensSavedHour, bs.TokensSavedTotal, bs.TokensSavedHour)
	case sum(as.HitChunks.Fine) != sum(bs.HitChunks.Fine) || sum(as.AskedChunks.Fine) != sum(bs.AskedChunks.Fine):
		t.Fatalf("hit history %v/%v after, %v/%v before", as.HitChunks.Fine, as.AskedChunks.Fine, bs.HitChunks.Fine, bs.AskedChunks.Fine)
	case after.Misses.Total != before.Misses.Total:
		t.Fatalf("misses %v after, %v before", after.Misses.Total, before.Misses.Total)
	case !after.Stats.PlaneStart(after.Rebuilt.At).Equal(before.Stats.Since):
		t.Fatalf("miss breakdown since %v, want the figures' start %v", after.Stats.PlaneStart(after.Rebuilt.At), before.Stats.Since)
	case after.Stats.WhatIfStart(after.Rebuilt.At).Before(after.Started):
		t.Fatalf("the what-if (not carried) starts %v, before this process (%v)", after.Stats.WhatIfStart(after.Rebuilt.At), after.Started)
	case after.Pool.UsableBytes != before.Pool.UsableBytes || after.Pool.ResidentBytes != before.Pool.ResidentBytes:
		t.Fatalf("usable %d of %d bytes after, %d of %d before", after.Pool.UsableBytes, after.Pool.ResidentBytes,
			before.Pool.UsableBytes, before.Pool.ResidentBytes)
	case after.Restart.Links == 0 || after.Restart.LinksDropped != 0:
		t.Fatalf("links %d restored, %d dropped", after.Restart.Links, after.Restart.LinksDropped)
	}
	old := before.Events[0]
	found := false
	for _, ev := range after.Events {
		found = found || ev.Time.Equal(old.Time) && ev.Message == old.Message
	}
	if !found {
		t.Fatalf("the event %q of the previous process is gone", old.Message)
	}

	// A new pool size: nothing adopted, the server's figures carried, the
	// miss breakdown new with the pool.
	if err := e2.StopKeeping(ctx); err != nil {
		t.Fatal(err)
	}
	cfg3 := cfg
	cfg3.L1.SizeGB *= 2
	e3 := New(cfg3, Options{})
	if err := e3.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e3.Stop(ctx) })
	s3 := e3.Snapshot()
	switch {
	case s3.Restart.Adopted || !s3.Restart.StatsCarried:
		t.Fatalf("restart %+v", s3.Restart)
	case s3.Rates.Server.TokensSavedTotal != bs.TokensSavedTotal || !s3.Stats.Since.Equal(before.Stats.Since):
		t.Fatalf("tokens %d since %v, want %d since %v", s3.Rates.Server.TokensSavedTotal, s3.Stats.Since, bs.TokensSavedTotal, before.Stats.Since)
	case s3.Misses.Total.Total() != 0 || !s3.Stats.PlaneStart(s3.Rebuilt.At).Equal(s3.Stats.PoolSince) || s3.Stats.PoolSince.IsZero():
		t.Fatalf("misses %v since %v with a new pool (pool since %v)", s3.Misses.Total, s3.Stats.PlaneStart(s3.Rebuilt.At), s3.Stats.PoolSince)
	}
}
