package httpapi_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"kvdock/core/engine"
	"kvdock/core/tierstate"
	"kvdock/settings"
	"kvdock/ui/httpapi"
)

func TestStatusTiers(t *testing.T) {
	// No tier: an empty array, never null, so clients can range over it.
	b, err := json.Marshal(httpapi.NewStatus(engine.Snapshot{}))
	if err != nil || !strings.Contains(string(b), `"tiers":[]`) {
		t.Fatalf("no tiers: %s %v", b, err)
	}

	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := engine.Snapshot{Tiers: []tierstate.Tier{
		{Index: 0, Type: "fs", Target: "/data/l2", State: tierstate.Up, Since: since, UsedBytes: 100, CapacityBytes: 1000,
			Objects: 3, Hits: 4, Misses: 5, Corrupt: 6, QueueDepth: 7, QueueBytes: 8, DroppedWrites: 9,
			ReadBytes: 10, WriteBytes: 11, Loads: 12, LoadTimeouts: 13},
		{Index: 1, Type: "resp", Target: "redis://redis:6379", State: tierstate.Down, Reason: "dial tcp: connection refused"},
	}}
	b, err = json.Marshal(httpapi.NewStatus(s))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Tiers []map[string]any `json:"tiers"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || len(doc.Tiers) != 2 {
		t.Fatalf("tiers: %s %v", b, err)
	}
	want := map[string]any{
		"index": 0.0, "type": "fs", "target": "/data/l2", "state": "up", "since": "2026-01-02T03:04:05Z",
		"used_bytes": 100.0, "capacity_bytes": 1000.0, "objects": 3.0, "hits": 4.0, "misses": 5.0, "corrupt": 6.0,
		"queue_depth": 7.0, "queue_bytes": 8.0, "dropped_writes": 9.0, "read_bytes": 10.0, "write_bytes": 11.0,
		"loads": 12.0, "load_timeouts": 13.0,
	}
	for k, w := range want {
		if doc.Tiers[0][k] != w {
			t.Errorf("tiers[0].%s = %v, want %v", k, doc.Tiers[0][k], w)
		}
	}
	if _, ok := doc.Tiers[0]["reason"]; ok {
		t.Errorf("an up tier has a reason: %v", doc.Tiers[0])
	}
	if d := doc.Tiers[1]; d["state"] != "down" || d["reason"] != "dial tcp: connection refused" || d["type"] != "resp" {
		t.Errorf("tiers[1] = %v", d)
	}
}

func TestConfAdaptersRedacted(t *testing.T) {
	const pass = "p4ss-w0rd-xyz"
	cfg := settings.Default()
	cfg.L2.Adapters = []settings.Adapter{
		{Type: "fs", FS: settings.FSAdapter{BasePath: "/data/l2"}},
		{Type: "resp", RESP: settings.RESPAdapter{Host: "redis", Port: 6379, Password: pass}},
	}
	src := map[string]settings.Source{settings.KeyAdapters: {Kind: settings.SourceFlag, Detail: "--l2-adapter"}}
	conf := httpapi.NewConf(cfg, src)
	b, err := json.Marshal(conf)
	if err != nil || strings.Contains(string(b), pass) {
		t.Fatalf("/conf leaks the password: %s %v", b, err)
	}
	got := conf["l2"]["adapters"]
	list, ok := got.Value.([]any)
	if !ok || len(list) != 2 || got.Source != "flag --l2-adapter" {
		t.Fatalf("/conf l2.adapters = %#v", got)
	}
	if r := list[1].(map[string]any); r["password"] != settings.Redacted || r["host"] != "redis" {
		t.Errorf("resp adapter = %v", r)
	}
	if conf["l2"]["store_policy"].Value != "write-behind" {
		t.Errorf("store_policy = %v", conf["l2"]["store_policy"])
	}
}
