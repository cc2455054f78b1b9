package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"kvdock/assets"
	"kvdock/core/keys"
	"kvdock/core/protocol"
	"kvdock/settings"
)

// TestClearForceKeepsLockedBytes: CLEAR [force] (engine-driven, newest) and
// CLEAR [] clear the same way: a read-locked object is doomed, so no later
// read is served from it and its bytes stay until the holder finishes; a
// force of the wrong type clears nothing.
func TestClearForceKeepsLockedBytes(t *testing.T) {
	for _, prof := range []string{"engine-driven", "rpc-messages"} {
		t.Run(prof, func(t *testing.T) {
			cfg, _ := testConfig(t)
			cfg.Server.Protocol = prof
			e := startEngine(t, cfg)
			storeObjects(t, e, 2, 4096)
			pool := e.cur.Load().dataPlane.pool
			var h keys.Hash
			binary.LittleEndian.PutUint64(h[:], 1)
			locked := []keys.ObjectKey{{Chunk: h, Model: "m", KVRank: keys.KVRank(1, 0)}}
			if n := pool.ReserveReadPrefix(locked, 1); n != 1 {
				t.Fatalf("read lock: %d", n)
			}
			c := dial(t, cfg.Server.Port, prof)
			ctx := context.Background()
			// A force that is not a bool does not decode: no answer (the call
			// times out), nothing cleared.
			if _, err := c.Call(ctx, protocol.Clear, "yes"); err == nil {
				t.Fatal("CLEAR [\"yes\"] answered")
			}
			if got := lastEvent(e, "cache cleared"); got != "" {
				t.Fatalf("a bad force cleared: %q", got)
			}
			if _, err := c.Call(ctx, protocol.Clear, true); err != nil {
				t.Fatal(err)
			}
			if got := lastEvent(e, "cache cleared"); got == "" {
				t.Fatal("CLEAR [true] did not clear")
			}
			if n := pool.ReserveReadPrefix(locked, 1); n != 0 {
				t.Fatal("a cleared, locked object is still readable")
			}
			pool.FinishRead(locked, 1)
		})
	}
}

// TestWaitPrefetchStatusOverTheWire: the newest profile's WAIT_PREFETCH_STATUS
// reaches the lookup module: an id without a job answers 0 at once, and a
// LOOKUP's job answers its hit count.
func TestWaitPrefetchStatusOverTheWire(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg.Server.Protocol = "rpc-messages"
	startEngine(t, cfg)
	c := dial(t, cfg.Server.Port, "rpc-messages")
	ctx := context.Background()
	var n int64
	r, err := c.Call(ctx, protocol.WaitPrefetchStatus, "nobody", 5.0)
	if err != nil || r.Decode(&n) != nil || n != 0 {
		t.Fatalf("WAIT unknown id: %+v %v %d", r, err, n)
	}
	k := protocol.Key{ModelName: "m", WorldSize: 1, TokenIDs: make([]uint32, 2*cfg.Server.ChunkSize),
		End: 2 * cfg.Server.ChunkSize, RequestID: "req"}
	if _, err := c.Call(ctx, protocol.Lookup, k, int64(1)); err != nil {
		t.Fatal(err)
	}
	r, err = c.Call(ctx, protocol.WaitPrefetchStatus, "req", 5.0)
	if err != nil || r.Decode(&n) != nil || n != 0 {
		t.Fatalf("WAIT after a missing LOOKUP: %+v %v %d", r, err, n)
	}
	// A NaN timeout does not decode: no answer.
	nan := 0.0
	if _, err := c.Call(ctx, protocol.WaitPrefetchStatus, "req", nan/nan); err == nil {
		t.Fatal("NaN timeout answered")
	}
}

// TestGetExperimentalAnswersNone: both frozen-number profiles answer
// GET_EXPERIMENTAL with no experimental transfer types; engine-driven-v2,
// which serves POLL_KV_EVENTS, names the poll channel (its log is on by
// default), rpc-messages, which does not, never does.
func TestGetExperimentalAnswersNone(t *testing.T) {
	for prof, want := range map[string]string{"engine-driven-v2": "[kv_events]", "rpc-messages": "[]"} {
		cfg, _ := testConfig(t)
		cfg.Server.Protocol = prof
		startEngine(t, cfg)
		c := dial(t, cfg.Server.Port, prof)
		r, err := c.Call(context.Background(), protocol.GetExperimental)
		var names []string
		if err != nil || r.Decode(&names) != nil || names == nil || fmt.Sprint(names) != want {
			t.Errorf("%s: GET_EXPERIMENTAL %+v %v %v, want %s", prof, r, err, names, want)
		}
	}
}

// TestSettingsNameEveryProfile: the profiles settings accept are exactly the
// embedded tables, and auto detects among all of them, newest first.
func TestSettingsNameEveryProfile(t *testing.T) {
	got := slices.Sorted(slices.Values(settings.ProtocolProfiles()))
	if want := assets.ProtocolNames(); !slices.Equal(got, want) {
		t.Fatalf("settings.ProtocolProfiles %v, embedded tables %v", got, want)
	}
	cfg := settings.Default().Server
	cfg.Protocol = settings.ProtocolAuto
	def, all, err := profiles(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if def.Name != cfg.ProtocolAutoDefault || len(all) != len(got) || all[0].Name != "rpc-messages" ||
		all[len(all)-1].Name != "nongpu-v1" || !slices.Contains(all, def) {
		t.Fatalf("auto: default %s, detect order %v", def.Name, all)
	}
}
