package engine

import (
	"context"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/settings"
)

// server.max_instances reaches the transfer module at start and live.
func TestMaxInstancesAppliedLive(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg.Server.MaxInstances = 2
	e := startEngine(t, cfg)
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	register(t, c, 1)
	register(t, c, 2)
	refusedRegister := func(id int64) {
		t.Helper()
		// A refused registration gets no reply in this profile; the NOOP
		// after it (inline, same peer) is answered once it was handled.
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, _ = c.Call(ctx, protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{
			InstanceID: id, ModelName: "m", WorldSize: 1, BlockSize: 16, NumLayers: 2, HiddenDimSize: 16, DtypeStr: "float32",
		})
		if err := noop(t, c); err != nil {
			t.Fatal(err)
		}
	}
	refusedRegister(3)
	if n := len(e.Snapshot().Contexts); n != 2 {
		t.Fatalf("%d contexts with max_instances 2", n)
	}
	next := cfg
	next.Server.MaxInstances = 3
	res, err := e.Apply(context.Background(), next, nil)
	if err != nil || res.Class != settings.Live {
		t.Fatalf("apply max_instances: %+v, %v", res, err)
	}
	register(t, c, 3)
	refusedRegister(4)
	if n := len(e.Snapshot().Contexts); n != 3 {
		t.Fatalf("%d contexts with max_instances 3", n)
	}
}
