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

	"kvdock/core/restart"
	"kvdock/settings"
	"kvdock/transfer/worker"
)

// keepConfig is testConfig with a private state directory and keep_on_exit.
func keepConfig(t *testing.T) (settings.Config, string) {
	cfg, seg := testConfig(t)
	cfg.Server.StateDir = filepath.Join(t.TempDir(), "state")
	cfg.L1.KeepOnExit = true
	return cfg, seg
}

// chunkOf is the deterministic content of prompt p's chunk j.
func chunkOf(p, j int, n int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(p*31 + j*7 + i)
	}
	return b
}

func promptTokens(p, chunks, chunk int) []uint32 {
	ts := make([]uint32, chunks*chunk)
	for i := range ts {
		ts[i] = uint32(p*100000 + i)
	}
	return ts
}

// TestStopKeepingThenStartAdopts: a worker stores 24 prompts, the engine
// stops keeping its pool, a new engine starts with the same settings; the
// same worker, without registering again, hits every prompt, reads the
// bytes it stored, and new stores commit.
func TestStopKeepingThenStartAdopts(t *testing.T) {
	cfg, seg := keepConfig(t)
	ctx := context.Background()
	e := startEngine(t, cfg)
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	w, err := worker.Register(ctx, c, worker.Config{InstanceID: 7, Model: "m", Layers: 2, Hidden: 16, Dtype: "float32"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	const prompts, chunks = 24, 2
	n := w.Layout().Bytes
	for p := range prompts {
		data := [][]byte{chunkOf(p, 0, n), chunkOf(p, 1, n)}
		res, err := w.Store(ctx, w.Key(promptTokens(p, chunks, w.ChunkTokens()), chunks, fmt.Sprint("s", p)), data)
		if err != nil || !res.Committed {
			t.Fatalf("store %d: %+v %v", p, res, err)
		}
	}
	if err := e.StopKeeping(ctx); err != nil {
		t.Fatalf("StopKeeping: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", seg)); err != nil {
		t.Fatalf("kept segment gone: %v", err)
	}

	e2 := New(cfg, Options{Version: "next"})
	if err := e2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e2.Stop(ctx) })
	s := e2.Snapshot()
	r := s.Restart
	if !r.Adopted || r.Objects != prompts*chunks || r.Contexts != 1 || r.Generation != 1 {
		t.Fatalf("restart %+v", r)
	}
	if s.Shm.ShmName != seg {
		t.Fatalf("advertises %q, want the adopted %q", s.Shm.ShmName, seg)
	}
	t.Logf("gap %v: adopted %d objects (%d bytes), %d contexts", r.Gap, r.Objects, r.Bytes, r.Contexts)
	if _, err := restart.Take(cfg.Server.StateDir, restart.FileName(cfg.Server.Host, cfg.Server.Port)); !errors.Is(err, restart.ErrNone) {
		t.Fatalf("record not consumed: %v", err)
	}

	sched := worker.Scheduler{C: c}
	wrong := 0
	for p := range prompts {
		toks := promptTokens(p, chunks, w.ChunkTokens())
		id := fmt.Sprint("r", p)
		hits, err := sched.Hits(ctx, w.LookupKey(toks, id), 1)
		if err != nil || hits != chunks {
			t.Fatalf("prompt %d after restart: %d hits (%v), want %d", p, hits, err, chunks)
		}
		got, err := w.Retrieve(ctx, w.Key(toks, hits, id), func(j int, b []byte) {
			if !bytes.Equal(b, chunkOf(p, j, n)) {
				wrong++
			}
		})
		if err != nil || got != chunks {
			t.Fatalf("retrieve %d: %d %v", p, got, err)
		}
		_ = sched.EndSession(ctx, id)
	}
	if wrong != 0 {
		t.Fatalf("%d chunks differ from what was stored", wrong)
	}
	res, err := w.Store(ctx, w.Key(promptTokens(99, chunks, w.ChunkTokens()), chunks, "new"), [][]byte{chunkOf(99, 0, n), chunkOf(99, 1, n)})
	if err != nil || !res.Committed {
		t.Fatalf("new store after restart: %+v %v", res, err)
	}
	if !strings.Contains(lastEvent(e2, "restart: adopted"), "48 objects") {
		t.Fatalf("event %q", lastEvent(e2, "restart:"))
	}
	// A plain stop removes the adopted segment as any other.
	if err := e2.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", seg)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("segment left after a plain stop: %v", err)
	}
}

// keptStop starts an engine on keepConfig, stores 4 objects of 4 KiB and
// stops it keeping the pool; it returns the engine's settings.
func keptStop(t *testing.T) settings.Config {
	t.Helper()
	cfg, _ := keepConfig(t)
	e := startEngine(t, cfg)
	storeObjects(t, e, 4, 4096)
	if err := e.StopKeeping(context.Background()); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestKeptPoolNotAdoptedByAnotherPool: a start whose settings give another
// pool does not adopt, says why, and removes the kept segment.
func TestKeptPoolNotAdoptedByAnotherPool(t *testing.T) {
	cfg := keptStop(t)
	next := cfg
	next.L1.SizeGB = 8.0 / 1024
	e2 := startEngine(t, next)
	r := e2.Snapshot().Restart
	if r.Adopted || !strings.Contains(r.Reason, "l1.size_gb") || !strings.Contains(r.Reason, "removed") {
		t.Fatalf("restart %+v", r)
	}
	if s := e2.Snapshot().Pool; s.Objects != 0 {
		t.Fatalf("a cold start has %d objects", s.Objects)
	}
	if !strings.Contains(lastEvent(e2, "pool not adopted"), "l1.size_gb") {
		t.Fatal("no event says why nothing was adopted")
	}
}

// TestHostileStateFileColdStart: a record changed by someone else is
// refused, the start is cold and says why.
func TestHostileStateFileColdStart(t *testing.T) {
	cfg := keptStop(t)
	path := filepath.Join(cfg.Server.StateDir, restart.FileName(cfg.Server.Host, cfg.Server.Port))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-5] ^= 0x20
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	e2 := startEngine(t, cfg)
	r := e2.Snapshot().Restart
	if r.Adopted || !strings.Contains(r.Reason, "checksum") {
		t.Fatalf("restart %+v", r)
	}
	if s := e2.Snapshot().Pool; s.Objects != 0 {
		t.Fatalf("cold start has %d objects", s.Objects)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("refused record not consumed: %v", err)
	}
}

// TestHostileRecordPartsDroppedShownInRestart: a record with a key twice
// is adopted without that key, and the start says what it left out
// (Restart.Dropped and DropReasons, an event), instead of starting cold.
func TestHostileRecordPartsDroppedShownInRestart(t *testing.T) {
	cfg := keptStop(t)
	dir, file := cfg.Server.StateDir, restart.FileName(cfg.Server.Host, cfg.Server.Port)
	rec, err := restart.Take(dir, file)
	if err != nil {
		t.Fatal(err)
	}
	rec.Pool.Objects[1].Key = rec.Pool.Objects[0].Key
	if err := restart.Write(dir, file, rec); err != nil {
		t.Fatal(err)
	}
	e2 := startEngine(t, cfg)
	r := e2.Snapshot().Restart
	if !r.Adopted || r.Objects != 2 || r.Dropped != 2 || len(r.DropReasons) != 1 || !strings.Contains(r.DropReasons[0], "key recorded twice: 2") {
		t.Fatalf("restart %+v; want 2 objects adopted and the key recorded twice dropped", r)
	}
	if !strings.Contains(lastEvent(e2, "left out"), "key recorded twice") {
		t.Fatal("no event says what was left out")
	}
}
