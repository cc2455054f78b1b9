package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"kvdock/core/testkit/freeport"
	"kvdock/core/testkit/poll"
	"kvdock/settings"
)

// TestKVEventsTierMediumFollowsTheTiers: with the stream on and an fs tier
// written behind, a stored prompt is announced for CPU and, once written,
// for STORAGE; a live change of the L2 settings that drops the tier
// removes its medium whole and keeps the pool's.
func TestKVEventsTierMediumFollowsTheTiers(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg.KVEvents.Endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", freeport.Port(t))
	cfg.L2.Adapters = []settings.Adapter{{Type: "fs", FS: settings.FSAdapter{BasePath: t.TempDir(), MaxCapacityGB: 1}}}
	e := startEngine(t, cfg)
	w, _ := tierWorker(t, e, cfg.Server.Port)
	toks := make([]uint32, 3*cfg.Server.ChunkSize)
	for i := range toks {
		toks[i] = uint32(i)
	}
	if res, err := w.Store(context.Background(), w.Key(toks, 3, "kv-tier"), chunkData(w, 3, 1)); err != nil || !res.Committed {
		t.Fatalf("store: %+v %v", res, err)
	}
	poll.Until(t, 10*time.Second, "3 chunks announced for CPU and 3 for STORAGE", func() bool {
		return e.Snapshot().KVEvents.Announced == 6
	})
	next, _ := e.Config()
	next.L2.Adapters = nil
	if _, err := e.Apply(context.Background(), next, nil); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the tier's medium removed, the pool's kept", func() bool {
		s := e.Snapshot().KVEvents
		return s.Announced == 3 && s.RemovedEvents == 3
	})
}
