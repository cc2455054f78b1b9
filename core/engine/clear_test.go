package engine

import (
	"context"
	"encoding/binary"
	"strings"
	"testing"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/protocol"
)

// storeObjects puts n objects of size bytes straight into the running pool.
func storeObjects(t *testing.T, e *Engine, n int, size int64) {
	t.Helper()
	ks := make([]keys.ObjectKey, n)
	for i := range ks {
		var h keys.Hash
		binary.LittleEndian.PutUint64(h[:], uint64(i+1))
		ks[i] = keys.ObjectKey{Chunk: h, Model: "m", KVRank: keys.KVRank(1, 0)}
	}
	pool := e.cur.Load().dataPlane.pool
	rs, err := pool.ReserveWrite(l1.InstanceOwner(1), ks, size)
	if err != nil || !pool.FinishWrite(rs) {
		t.Fatalf("storing %d objects: %v", n, err)
	}
}

// lastEvent returns the newest event whose text contains sub.
func lastEvent(e *Engine, sub string) string {
	evs := e.Snapshot().Events
	for i := len(evs) - 1; i >= 0; i-- {
		if strings.Contains(evs[i].Message, sub) {
			return evs[i].Message
		}
	}
	return ""
}

// TestClearCacheSaysWhoAndWhat: every clear reports what it dropped and the
// events pane names who asked (ctl, the HTTP API, a worker's CLEAR).
func TestClearCacheSaysWhoAndWhat(t *testing.T) {
	cfg, _ := testConfig(t)
	e := startEngine(t, cfg)

	storeObjects(t, e, 3, 1<<20)
	got, err := e.ClearCache(ClearByCtl)
	if err != nil {
		t.Fatal(err)
	}
	if got.Objects != 3 || got.Bytes < 3<<20 {
		t.Fatalf("ClearCache = %+v, want 3 objects of at least 3 MiB", got)
	}
	if ev := lastEvent(e, "cache cleared"); !strings.Contains(ev, "by kvdock ctl: 3 objects, 3.0 MiB") {
		t.Fatalf("event %q does not say ctl cleared 3 objects, 3.0 MiB", ev)
	}

	if got, err := e.ClearCache(ClearByHTTP); err != nil || got.Objects != 0 || got.Bytes != 0 {
		t.Fatalf("clearing an empty cache = %+v, %v", got, err)
	}
	if ev := lastEvent(e, "cache cleared"); !strings.Contains(ev, "by HTTP API: 0 objects") {
		t.Fatalf("event %q does not name the HTTP API", ev)
	}

	storeObjects(t, e, 2, 4096)
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	if _, err := c.Call(context.Background(), protocol.Clear); err != nil {
		t.Fatal(err)
	}
	if ev := lastEvent(e, "cache cleared"); !strings.Contains(ev, "by a worker (ZMQ CLEAR): 2 objects") {
		t.Fatalf("event %q does not name the worker's CLEAR", ev)
	}
}
