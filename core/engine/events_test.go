package engine

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"kvdock/core/logcap"
	"kvdock/core/protocol"
)

// TestEventsCutPeerStrings: a peer's 4 MiB model name never reaches the
// event log (and from there the dashboard and /status) whole: the wire
// refuses it at decode, and whatever text does reach the sink is cut to a
// bounded length.
func TestEventsCutPeerStrings(t *testing.T) {
	e, _, c := startDialed(t)
	huge := strings.Repeat("M", 4<<20)
	for _, p := range []protocol.RegisterPayload{
		{InstanceID: 1, ModelName: huge, WorldSize: 1, BlockSize: 16, NumLayers: 2, HiddenDimSize: 16, DtypeStr: "float32"},
		{InstanceID: 2, ModelName: "m", WorldSize: 1, BlockSize: 16, NumLayers: 2, HiddenDimSize: 16, DtypeStr: "no-such-dtype-" + huge},
	} {
		_, _ = c.Call(context.Background(), protocol.RegisterKVCacheNonGPUContext, p)
	}
	e.events.add(EventError, slog.LevelWarn, "peer text: "+huge)
	evs := e.Snapshot().Events
	var sawCut bool
	for _, ev := range evs {
		if len(ev.Message) > logcap.DefaultMaxString+32 {
			t.Fatalf("event of %d bytes: %.80q…", len(ev.Message), ev.Message)
		}
		sawCut = sawCut || strings.HasPrefix(ev.Message, "peer text: MMMM")
	}
	if !sawCut {
		t.Fatalf("the cut event is missing: %+v", evs)
	}
}
