package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvdock/core/l1"
	"kvdock/transfer/worker"
)

// TestStopKeepingPickleThenStartAdopts: with --shm-name "" the pool is the
// endpoint's private segment, advertised to nobody; a pickle worker stores,
// the engine stops keeping the pool, and the next start with the same
// settings adopts it: the same worker, without registering again, reads
// its bytes back, and REGISTER still answers {"", 0}.
func TestStopKeepingPickleThenStartAdopts(t *testing.T) {
	cfg, _ := keepConfig(t)
	off := ""
	cfg.Server.ShmName = &off
	private := l1.PrivateSegmentName(cfg.Server.Host, cfg.Server.Port)
	ctx := context.Background()
	e := startEngine(t, cfg)
	if d := e.Snapshot().Pool.Decision; d.Private != private || d.Shared || d.Segment != "" {
		t.Fatalf("pool %+v, want the private segment %s", d, private)
	}
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	w, err := worker.Register(ctx, c, worker.Config{InstanceID: 9, Model: "m", Layers: 2, Hidden: 16, Dtype: "float32"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.Mode() != worker.ModePickle || w.Advertised() {
		t.Fatalf("worker mode %s, advertised %v: want pickle and nothing advertised", w.Mode(), w.Advertised())
	}
	const prompts, chunks = 6, 2
	n := w.Layout().Bytes
	for p := range prompts {
		res, err := w.Store(ctx, w.Key(promptTokens(p, chunks, w.ChunkTokens()), chunks, fmt.Sprint("s", p)),
			[][]byte{chunkOf(p, 0, n), chunkOf(p, 1, n)})
		if err != nil || !res.Committed {
			t.Fatalf("store %d: %+v %v", p, res, err)
		}
	}
	if err := e.StopKeeping(ctx); err != nil {
		t.Fatalf("StopKeeping a pickle-mode pool: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", private)); err != nil {
		t.Fatalf("kept private segment gone: %v", err)
	}

	e2 := startEngine(t, cfg)
	s := e2.Snapshot()
	if r := s.Restart; !r.Adopted || r.Objects != prompts*chunks || r.Contexts != 1 {
		t.Fatalf("restart %+v", r)
	}
	if s.Shm.Shared() || s.Shm.ShmName != "" || s.Pool.Decision.Private != private || s.Pool.Decision.Shared {
		t.Fatalf("after adoption: advertises %+v, pool %+v", s.Shm, s.Pool.Decision)
	}
	sched := worker.Scheduler{C: c}
	for p := range prompts {
		toks := promptTokens(p, chunks, w.ChunkTokens())
		id := fmt.Sprint("r", p)
		if hits, err := sched.Hits(ctx, w.LookupKey(toks, id), 1); err != nil || hits != chunks {
			t.Fatalf("prompt %d after restart: %d hits (%v)", p, hits, err)
		}
		wrong := 0
		got, err := w.Retrieve(ctx, w.Key(toks, chunks, id), func(j int, b []byte) {
			if !bytes.Equal(b, chunkOf(p, j, n)) {
				wrong++
			}
		})
		if err != nil || got != chunks || wrong != 0 {
			t.Fatalf("retrieve %d: %d chunks, %d wrong, %v", p, got, wrong, err)
		}
		_ = sched.EndSession(ctx, id)
	}
	fresh, err := worker.Register(ctx, dial(t, cfg.Server.Port, cfg.Server.Protocol),
		worker.Config{InstanceID: 10, Model: "m", Layers: 2, Hidden: 16, Dtype: "float32"})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if fresh.Advertised() {
		t.Fatal("REGISTER after the adoption advertised a segment")
	}
}

// TestKeptPoolNotAdoptedAcrossSharedAndPrivate: a pool kept private is not
// adopted by a start with a shared segment, nor a shared one by a start
// with --shm-name ""; each start is cold, says why, and removes the kept
// segment.
func TestKeptPoolNotAdoptedAcrossSharedAndPrivate(t *testing.T) {
	off := ""
	for _, tc := range []struct {
		name    string
		keptOff bool
		wantWhy string
	}{
		{"private kept, shared start", true, "this start's pool is shared"},
		{"shared kept, private start", false, "this start's pool is private"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, seg := keepConfig(t)
			private := l1.PrivateSegmentName(cfg.Server.Host, cfg.Server.Port)
			keptCfg, nextCfg, kept := cfg, cfg, seg
			if tc.keptOff {
				keptCfg.Server.ShmName, kept = &off, private
			} else {
				nextCfg.Server.ShmName = &off
			}
			e := startEngine(t, keptCfg)
			storeObjects(t, e, 4, 4096)
			if err := e.StopKeeping(context.Background()); err != nil {
				t.Fatal(err)
			}
			e2 := startEngine(t, nextCfg)
			r := e2.Snapshot().Restart
			if r.Adopted || !strings.Contains(r.Reason, tc.wantWhy) || !strings.Contains(r.Reason, "removed") {
				t.Fatalf("restart %+v, want a cold start saying %q", r, tc.wantWhy)
			}
			if s := e2.Snapshot(); s.Pool.Objects != 0 || (tc.keptOff && s.Shm.ShmName != seg) || (!tc.keptOff && s.Shm.ShmName != "") {
				t.Fatalf("cold start: %d objects, advertises %q", s.Pool.Objects, s.Shm.ShmName)
			}
			if _, err := os.Stat(filepath.Join("/dev/shm", kept)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("kept segment %s left: %v", kept, err)
			}
		})
	}
}
