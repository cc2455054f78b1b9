package engine

import (
	"context"
	"strings"
	"testing"

	"kvdock/transfer/worker"
)

// TestColdStartRestoresPickleRegistrations: a restart whose pool cannot be
// kept (l1.size_gb changed) restores the registrations that need no
// segment: the PICKLE worker stores on without registering again, while
// the SHM worker, which maps the old segment, is refused with the reason
// and gets no slots of the new one.
func TestColdStartRestoresPickleRegistrations(t *testing.T) {
	cfg, _ := keepConfig(t)
	ctx := context.Background()
	e := startEngine(t, cfg)
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	shm, err := worker.Register(ctx, c, worker.Config{InstanceID: 1, Model: "m", Layers: 1, Hidden: 32, Dtype: "float32"})
	if err != nil {
		t.Fatal(err)
	}
	defer shm.Close()
	pickle := newWorker(t, c, 2, "m")
	for i, w := range []*worker.Worker{shm, pickle} {
		res, err := w.Store(ctx, w.Key(promptTokens(i, 1, w.ChunkTokens()), 1, "before"), [][]byte{chunkOf(i, 0, w.Layout().Bytes)})
		if err != nil || !res.Committed {
			t.Fatalf("store %d before the restart: %+v %v", i, res, err)
		}
	}
	if err := e.StopKeeping(ctx); err != nil {
		t.Fatal(err)
	}
	next := cfg
	next.L1.SizeGB = 8.0 / 1024
	e2 := startEngine(t, next)
	r := e2.Snapshot().Restart
	if r.Adopted || r.Contexts != 1 || len(r.Refused) != 1 || !strings.Contains(r.Refused[0], "instance 1") ||
		!strings.Contains(r.Refused[0], "did not adopt") {
		t.Fatalf("restart %+v: want a cold pool, instance 2 restored and instance 1 refused", r)
	}
	res, err := pickle.Store(ctx, pickle.Key(promptTokens(5, 1, pickle.ChunkTokens()), 1, "after"), [][]byte{chunkOf(5, 0, pickle.Layout().Bytes)})
	if err != nil || !res.Committed {
		t.Fatalf("the pickle worker's store after a cold restart: %+v %v", res, err)
	}
	res, err = shm.Store(ctx, shm.Key(promptTokens(6, 1, shm.ChunkTokens()), 1, "after"), [][]byte{chunkOf(6, 0, shm.Layout().Bytes)})
	if err != nil || !res.Skipped {
		t.Fatalf("the SHM worker's store after a cold restart: %+v %v; want no slots", res, err)
	}
	if !strings.Contains(lastEvent(e2, "restart: cold pool"), "1 contexts restored, 1 refused") {
		t.Fatalf("event %q", lastEvent(e2, "restart:"))
	}
}
