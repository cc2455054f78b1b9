package engine

import (
	"context"
	"strings"
	"testing"

	"kvdock/core/logcap"
	"kvdock/core/protocol"
)

// TestEventsCutPeerStrings: a peer's 4 MiB model name reaches the event
// log (and from there the dashboard and /status) cut to a bounded length.
func TestEventsCutPeerStrings(t *testing.T) {
	cfg, _ := testConfig(t)
	e := startEngine(t, cfg)
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	huge := strings.Repeat("M", 4<<20)
	for _, p := range []protocol.RegisterPayload{
		{InstanceID: 1, ModelName: huge, WorldSize: 1, BlockSize: 16, NumLayers: 2, HiddenDimSize: 16, DtypeStr: "float32"},
		{InstanceID: 2, ModelName: huge, WorldSize: 1, BlockSize: 16, NumLayers: 2, HiddenDimSize: 16, DtypeStr: "no-such-dtype-" + huge},
	} {
		_, _ = c.Call(context.Background(), protocol.RegisterKVCacheNonGPUContext, p)
	}
	evs := e.Snapshot().Events
	var sawModel bool
	for _, ev := range evs {
		if len(ev.Message) > logcap.DefaultMaxString+32 {
			t.Fatalf("event of %d bytes: %.80q…", len(ev.Message), ev.Message)
		}
		sawModel = sawModel || strings.Contains(ev.Message, "MMMM")
	}
	if !sawModel {
		t.Fatalf("no event mentions the registration: %+v", evs)
	}
}
