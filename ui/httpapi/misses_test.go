package httpapi

import (
	"encoding/json"
	"testing"

	"kvdock/core/engine"
	"kvdock/core/misses"
)

func TestStatusMissesSection(t *testing.T) {
	var s engine.Snapshot
	var c misses.Counts
	c[misses.Evicted], c[misses.OtherLayout] = 3, 2
	s.Misses = misses.Report{Total: c, TierMissed: 1, GhostEntries: 65536, GhostBytes: 532480,
		Contexts: []misses.ContextCounts{{Context: misses.Context{Model: "m", WorldSize: 2}, Missed: c, TierMissed: 1}}}
	b, err := json.Marshal(NewStatus(s))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Misses struct {
			Missed      map[string]uint64 `json:"missed"`
			TotalMissed uint64            `json:"total_missed"`
			TierMissed  uint64            `json:"tier_missed"`
			GhostBytes  int64             `json:"ghost_bytes"`
			Other       *json.RawMessage  `json:"other"`
			Contexts    []struct {
				ModelName string            `json:"model_name"`
				WorldSize int               `json:"world_size"`
				Missed    map[string]uint64 `json:"missed"`
			} `json:"contexts"`
		} `json:"misses"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	m := doc.Misses
	if len(m.Missed) != int(misses.NumReasons) || m.Missed["evicted"] != 3 || m.Missed["other_layout"] != 2 ||
		m.Missed["never_stored"] != 0 || m.TotalMissed != 5 || m.TierMissed != 1 || m.GhostBytes != 532480 || m.Other != nil {
		t.Fatalf("misses section %s", b)
	}
	if len(m.Contexts) != 1 || m.Contexts[0].ModelName != "m" || m.Contexts[0].WorldSize != 2 || m.Contexts[0].Missed["evicted"] != 3 {
		t.Fatalf("contexts %+v", m.Contexts)
	}
	// An empty report still lists every reason at zero and an empty array.
	b, _ = json.Marshal(NewStatus(engine.Snapshot{}))
	if err := json.Unmarshal(b, &doc); err != nil || len(doc.Misses.Missed) != int(misses.NumReasons) || doc.Misses.Contexts == nil {
		t.Fatalf("empty misses section %s", b)
	}
}

func TestStatusHostSection(t *testing.T) {
	var s engine.Snapshot
	s.Host.Total, s.Host.Available, s.Host.Nodes = 8<<30, 6<<30, 2
	s.Host.Pool.Pages = []int64{30, 10}
	st := NewStatus(s).Host
	if st.MemoryTotalBytes != 8<<30 || st.MemoryAvailableBytes != 6<<30 || st.NUMANodes != 2 ||
		st.PoolNUMA != "N0 75% N1 25%" || len(st.PoolPagesByNode) != 2 {
		t.Fatalf("host section %+v", st)
	}
	if st := NewStatus(engine.Snapshot{}).Host; st.PoolNUMA != "single-node" || st.PoolPagesByNode == nil {
		t.Fatalf("empty host section %+v", st)
	}
}
