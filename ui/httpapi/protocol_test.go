package httpapi_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/core/testkit/profiles"
	"kvdock/settings"
	"kvdock/ui/httpapi"
)

// TestStatusProtocolDetections: under --protocol auto, /status names the
// mode and the default and counts the peers settled on each table, from
// workers of two tables registering over the real wire; a fixed profile
// says so and counts none.
func TestStatusProtocolDetections(t *testing.T) {
	h := startWith(t, "", func(c *settings.Config) {
		c.Server.Protocol = settings.ProtocolAuto
		c.Server.ProtocolAutoDefault = "nongpu-v1"
	})
	st := h.status()
	if d := st.ProtocolDetection; d.Mode != "auto" || d.Default != "nongpu-v1" || len(d.Detections) != len(settings.ProtocolProfiles()) {
		t.Fatalf("protocol_detection before traffic = %+v; want every profile at 0", d)
	}
	for _, n := range st.ProtocolDetection.Detections {
		if n != 0 {
			t.Fatalf("detections before traffic = %v", st.ProtocolDetection.Detections)
		}
	}
	// A worker of the newest table and one of the oldest: REGISTER and
	// the first PREPARE_STORE tell the tables apart.
	workerAs(t, h, "rpc-messages", 21)
	workerAs(t, h, "nongpu-v1", 22)
	var got httpapi.ProtocolDetectionStatus
	deadline := time.Now().Add(10 * time.Second)
	for {
		got = h.status().ProtocolDetection
		if got.Detections["rpc-messages"]+got.Detections["nongpu-v1"] == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got.Detections["rpc-messages"] != 1 || got.Detections["nongpu-v1"] != 1 || got.Ambiguous != 0 {
		t.Errorf("protocol_detection = %+v; want one peer of each worker's table, none ambiguous", got)
	}
	var total int64
	for _, n := range got.Detections {
		total += n
	}
	if total != 2 {
		t.Errorf("detections %v: only the two workers settled", got.Detections)
	}
}

func TestStatusProtocolFixed(t *testing.T) {
	h := start(t, "")
	h.register()
	d := h.status().ProtocolDetection
	if d.Mode != "fixed" || d.Default != "nongpu-v1" || len(d.Detections) != 0 || d.Ambiguous != 0 {
		t.Errorf("protocol_detection under a fixed profile = %+v", d)
	}
}

// workerAs registers instance id over a new connection speaking profile
// and asks to store one chunk.
func workerAs(t *testing.T, h *harness, profile string, id int64) {
	t.Helper()
	prof := profiles.Load(t, profile)
	c, err := client.Dial(fmt.Sprintf("tcp://127.0.0.1:%d", h.port), prof, client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Call(ctx, protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{InstanceID: id, ModelName: "m",
		WorldSize: 1, BlockSize: chunk, NumLayers: layers, HiddenDimSize: hidden, DtypeStr: "float16"}); err != nil {
		t.Fatalf("%s REGISTER: %v", profile, err)
	}
	k := key(fmt.Sprint("detect-", id), 1)
	if _, err := c.Call(ctx, protocol.PrepareStore, k, id); err != nil {
		t.Fatalf("%s PREPARE_STORE: %v", profile, err)
	}
}
