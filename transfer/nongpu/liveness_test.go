package nongpu

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/core/workers"
)

// reaping are upstream's defaults with the reaper on (a pinging profile).
var reaping = Liveness{Reap: true, Timeout: 120 * time.Second, Grace: 3600 * time.Second, Idle: 300 * time.Second}

func contextOf(t *testing.T, m *Module, id int64) workers.ContextInfo {
	t.Helper()
	for _, c := range m.Contexts() {
		if c.InstanceID == id {
			return c
		}
	}
	t.Fatalf("no context %d in %+v", id, m.Contexts())
	return workers.ContextInfo{}
}

// prepareHalfWritten reserves one chunk for id and writes into it without
// committing: what a worker killed between PREPARE_STORE and COMMIT_STORE
// leaves behind.
func (e *env) prepareHalfWritten(id int64, base uint32) protocol.Key {
	e.t.Helper()
	k := key(tokens(testChunk, base), 0, testChunk)
	r, err := e.mod.PrepareStore(k, id)
	if err != nil || len(r.Slots) != 1 {
		e.t.Fatalf("prepare %+v, %v", r, err)
	}
	fill(view(e.t, e.pool, r.Slots[0].Offset, r.Slots[0].Length), 9)
	return k
}

func TestReaperReapsSilentPingedWorkerAndAbortsItsReservations(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.mod.SetLiveness(reaping)
	e.register(1)
	e.register(2)
	baseline := e.pool.Stats()
	k := e.prepareHalfWritten(1, 100)
	if !e.mod.Touch(1, []byte("peer-1")) || !e.mod.Touch(2, []byte("peer-2")) {
		t.Fatal("PING of registered ids not recorded")
	}
	e.clk.Advance(119 * time.Second)
	e.mod.Touch(2, []byte("peer-2")) // 2 keeps pinging; it never transferred
	if got := e.mod.Reap(); len(got) != 0 {
		t.Fatalf("reaped %v before the timeout", got)
	}
	e.clk.Advance(time.Second)
	if got := e.mod.Reap(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("reaped %v, want [1]", got)
	}
	if e.cached(k) != 0 {
		t.Fatal("the reaped worker's half-written chunk was published")
	}
	if s := e.mod.Stats(); s.PendingWrites != 0 || s.Reaped != 1 || s.Instances != 1 {
		t.Fatalf("stats after reap %+v", s)
	}
	// The reaped worker may still be copying: its slot stays reserved, not
	// published, until the write TTL.
	if got := e.pool.Stats(); got.UsedBytes == baseline.UsedBytes || got.Doomed != 1 {
		t.Fatalf("pool after reap %+v, baseline %d used", got, baseline.UsedBytes)
	}
	c := contextOf(t, e.mod, 1)
	if c.State != workers.StateReaped || c.Gone.IsZero() || c.Peer != fmt.Sprintf("%x", "peer-1") {
		t.Fatalf("reaped context %+v", c)
	}
	ev := e.eventsOf(workers.EventReaped)
	if len(ev) != 1 || !strings.Contains(ev[0].Message, "1 pending writes (never published)") {
		t.Fatalf("reap events %+v", ev)
	}
	// The reaped instance is answered as an unregistered one.
	_, err := e.mod.PrepareStore(k, 1)
	_, want := e.mod.PrepareStore(k, 77)
	if err == nil || strings.Replace(err.Error(), "1", "77", 1) != want.Error() {
		t.Fatalf("reaped instance answered %v; unregistered %v", err, want)
	}
	// Status (upstream's report) lists only registered instances.
	if ids := e.mod.Status()["registered_non_cuda_instance_ids"].([]int64); len(ids) != 1 || ids[0] != 2 {
		t.Fatalf("status ids %v", ids)
	}
	// 2 pinged but never transferred: grace applies, not the timeout.
	e.clk.Advance(3598 * time.Second) // 2 last spoke 1 s ago
	if got := e.mod.Reap(); len(got) != 0 {
		t.Fatalf("reaped %v within the registration grace", got)
	}
	e.clk.Advance(2 * time.Second)
	if got := e.mod.Reap(); len(got) != 1 || got[0] != 2 {
		t.Fatalf("reaped %v after the grace, want [2]", got)
	}
}

func TestReaperOffForSeedProfilesAndWhenTimeoutZero(t *testing.T) {
	for _, l := range []Liveness{
		{Reap: false, Timeout: 120 * time.Second, Grace: 3600 * time.Second, Idle: 300 * time.Second},
		{Reap: true, Timeout: 0, Grace: 3600 * time.Second},
	} {
		e := newEnv(t, true, 1<<20)
		e.mod.SetLiveness(l)
		e.register(1)
		e.prepareHalfWritten(1, 5)
		e.clk.Advance(1000 * time.Hour)
		if got := e.mod.Reap(); got != nil {
			t.Fatalf("%+v: reaped %v", l, got)
		}
		c := contextOf(t, e.mod, 1)
		want := workers.StateIdle
		if l.Idle == 0 {
			want = workers.StateActive
		}
		if c.State != want {
			t.Fatalf("%+v: state %s, want %s", l, c.State, want)
		}
	}
}

func TestIdleStateAndInFlight(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.mod.SetLiveness(Liveness{Idle: 300 * time.Second})
	e.register(1)
	e.clk.Advance(299 * time.Second)
	if c := contextOf(t, e.mod, 1); c.State != workers.StateActive {
		t.Fatalf("state %s before the idle time", c.State)
	}
	e.clk.Advance(time.Second)
	if c := contextOf(t, e.mod, 1); c.State != workers.StateIdle {
		t.Fatalf("state %s after the idle time", c.State)
	}
	end := e.mod.begin(1, []byte{0, 1, 2})
	c := contextOf(t, e.mod, 1)
	if c.State != workers.StateActive || c.InFlight != 1 || c.Peer != "000102" || !c.LastRequest.Equal(e.clk.Now()) {
		t.Fatalf("context during a request %+v", c)
	}
	// A request in flight is never reaped, however old its start.
	e.mod.SetLiveness(Liveness{Reap: true, Timeout: time.Second, Grace: time.Second})
	e.clk.Advance(time.Hour)
	if got := e.mod.Reap(); len(got) != 0 {
		t.Fatalf("reaped %v with a request in flight", got)
	}
	end()
	if c := contextOf(t, e.mod, 1); c.InFlight != 0 {
		t.Fatalf("in flight %d after the request", c.InFlight)
	}
	// Unknown ids are not tracked: begin and Touch keep nothing.
	e.mod.begin(99, []byte("x"))()
	if e.mod.Touch(99, []byte("x")) || len(e.mod.Contexts()) != 1 {
		t.Fatalf("unknown id tracked: %+v", e.mod.Contexts())
	}
}

func TestRemoveByOperator(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	k := e.prepareHalfWritten(1, 40)
	if e.mod.Remove(7, "test") {
		t.Fatal("unknown id removed")
	}
	if len(e.mod.Contexts()) != 1 || e.mod.Stats().Removed != 0 {
		t.Fatal("removing an unknown id changed state")
	}
	if !e.mod.Remove(1, "kvdock ctl") {
		t.Fatal("remove failed")
	}
	if e.cached(k) != 0 || e.mod.Stats().PendingWrites != 0 || e.mod.Stats().Removed != 1 {
		t.Fatalf("after remove: cached %d, %+v", e.cached(k), e.mod.Stats())
	}
	if c := contextOf(t, e.mod, 1); c.State != workers.StateRemoved {
		t.Fatalf("state %s", c.State)
	}
	if e.mod.Remove(1, "again") {
		t.Fatal("removed twice")
	}
	ev := e.eventsOf(workers.EventRemoved)
	if len(ev) != 1 || !strings.Contains(ev[0].Message, "removed by kvdock ctl") {
		t.Fatalf("events %+v", ev)
	}
	// Registering again brings it back active, and forgets the record.
	e.register(1)
	cs := e.mod.Contexts()
	if len(cs) != 1 || cs[0].State != workers.StateActive {
		t.Fatalf("contexts after re-registration %+v", cs)
	}
}

func TestGoneRecordsAreBounded(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	for id := int64(1); id <= maxGone+10; id++ {
		e.register(id)
		e.mod.Remove(id, "test")
	}
	cs := e.mod.Contexts()
	if len(cs) != maxGone || cs[0].InstanceID != 11 {
		t.Fatalf("%d records kept (first %d), want the last %d", len(cs), cs[0].InstanceID, maxGone)
	}
}

func TestReuseFromNewPeerAbortsOldReservations(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	if _, err := e.mod.RegisterThrough(payload(1), []byte("old"), ""); err != nil {
		t.Fatal(err)
	}
	k := e.prepareHalfWritten(1, 300)
	// The same peer again: the first registration stays, its pending too.
	if _, err := e.mod.RegisterThrough(payload(1), []byte("old"), ""); err != nil {
		t.Fatal(err)
	}
	if e.mod.Stats().PendingWrites != 1 || e.mod.Stats().Reused != 0 {
		t.Fatalf("same-peer re-registration touched state: %+v", e.mod.Stats())
	}
	// A bad payload from a new peer changes nothing.
	bad := payload(1)
	bad.DtypeStr = "nope"
	if _, err := e.mod.RegisterThrough(bad, []byte("new"), ""); err == nil {
		t.Fatal("bad payload accepted")
	}
	if e.mod.Stats().PendingWrites != 1 || contextOf(t, e.mod, 1).Peer != fmt.Sprintf("%x", "old") {
		t.Fatalf("a refused re-registration changed state: %+v", e.mod.Stats())
	}
	// The new peer: a new worker.
	p := payload(1)
	p.NumLayers = 4 // a different layout for the same model is fine: the old one's reference went
	if _, err := e.mod.RegisterThrough(p, []byte("new"), ""); err != nil {
		t.Fatal(err)
	}
	if s := e.mod.Stats(); s.PendingWrites != 0 || s.Reused != 1 || s.Instances != 1 {
		t.Fatalf("stats after reuse %+v", s)
	}
	c := contextOf(t, e.mod, 1)
	if c.NumLayers != 4 || c.Peer != fmt.Sprintf("%x", "new") {
		t.Fatalf("context after reuse %+v", c)
	}
	// The new worker's commit of the old one's key publishes nothing, and
	// the key stays a miss.
	if ok, err := e.mod.CommitStore(k, 1, nil); ok || err != nil {
		t.Fatalf("commit of the old worker's pending key = %v, %v", ok, err)
	}
	if e.cached(k) != 0 {
		t.Fatal("old worker's pending data visible to the new one")
	}
	ev := e.eventsOf(workers.EventReused)
	if len(ev) != 1 || !strings.Contains(ev[0].Message, fmt.Sprintf("%x", "old")) || !strings.Contains(ev[0].Message, fmt.Sprintf("%x", "new")) {
		t.Fatalf("reuse events %+v", ev)
	}
	// The layout registry holds exactly the new worker's reference.
	if !e.mod.Unregister(1) || e.layouts.Has("m", 1) {
		t.Fatal("layout reference left after the only unregister")
	}
}

// TestReuseWithAnotherLayoutReplacesOld: an id registered again from
// another peer with another layout of the model is a new worker like any
// other: the old one's pending write is discarded, and the layout
// references are exact.
func TestReuseWithAnotherLayoutReplacesOld(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	if _, err := e.mod.RegisterThrough(payload(1), []byte("a"), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := e.mod.RegisterThrough(payload(2), []byte("b"), ""); err != nil {
		t.Fatal(err)
	}
	e.prepareHalfWritten(1, 50)
	p := payload(1)
	p.NumLayers = 4 // another layout than instance 2's for model m
	if _, err := e.mod.RegisterThrough(p, []byte("c"), ""); err != nil {
		t.Fatalf("reuse with another layout: %v", err)
	}
	if s := e.mod.Stats(); s.PendingWrites != 0 || s.Reused != 1 || contextOf(t, e.mod, 1).NumLayers != 4 {
		t.Fatalf("after the reuse: %+v", s)
	}
	if ids, _ := e.layouts.Registered("m", 1); len(ids) != 2 {
		t.Fatalf("registered layouts %x, want instance 2's and the new one's", ids)
	}
	e.mod.Unregister(1)
	e.mod.Unregister(2)
	if e.layouts.Has("m", 1) {
		t.Fatal("layout references leaked")
	}
}

// TestReapRacesCommit runs reaps against prepare/commit pairs: whatever
// wins, nothing half-written is published and no reservation leaks.
func TestReapRacesCommit(t *testing.T) {
	e := newEnv(t, true, 4<<20)
	e.mod.SetLiveness(Liveness{Reap: true, Timeout: time.Second, Grace: time.Second})
	baseline := e.pool.Stats().UsedBytes
	for round := 0; round < 200; round++ {
		e.register(1)
		e.mod.Touch(1, []byte("p"))
		k := key(tokens(testChunk, uint32(10_000+round)), 0, testChunk)
		r, err := e.mod.PrepareStore(k, 1)
		if err != nil || len(r.Slots) != 1 {
			t.Fatalf("prepare %+v, %v", r, err)
		}
		fill(view(t, e.pool, r.Slots[0].Offset, r.Slots[0].Length), byte(round))
		e.clk.Advance(2 * time.Second)
		var wg sync.WaitGroup
		var committed bool
		wg.Add(2)
		go func() { defer wg.Done(); committed, _ = e.mod.CommitStore(k, 1, nil) }()
		go func() { defer wg.Done(); e.mod.Reap() }()
		wg.Wait()
		if got := e.cached(k); (got == 1) != committed {
			t.Fatalf("round %d: commit said %v, cached %d", round, committed, got)
		}
		e.mod.Unregister(1)
		e.pool.Clear()
		if s := e.mod.Stats(); s.PendingWrites != 0 {
			t.Fatalf("round %d: pending left %+v", round, s)
		}
	}
	// Reaped reservations keep their bytes until the write TTL, then none
	// is left.
	e.clk.Advance(601 * time.Second)
	e.pool.Clear()
	if used := e.pool.Stats().UsedBytes; used != baseline {
		t.Fatalf("pool used %d after the races and the TTL, baseline %d", used, baseline)
	}
}

func TestRunReaperScansAtAQuarterOfTheTimeout(t *testing.T) {
	if got := (Liveness{Timeout: 120 * time.Second}).ScanInterval(); got != 30*time.Second {
		t.Fatalf("scan interval %s", got)
	}
	e := newEnv(t, true, 1<<20)
	e.register(1)
	e.mod.Touch(1, nil)
	e.prepareHalfWritten(1, 1)
	e.clk.Advance(time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.mod.RunReaper(ctx); close(done) }()
	// Real time drives the loop's timer; the fake clock says who is stale.
	e.mod.SetLiveness(Liveness{Reap: true, Timeout: 40 * time.Millisecond, Grace: 40 * time.Millisecond})
	deadline := time.Now().Add(10 * time.Second)
	for e.mod.Stats().Reaped == 0 {
		if time.Now().After(deadline) {
			t.Fatal("RunReaper never reaped")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
}

func TestTouchHostileIDs(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.register(1)
	for _, id := range []int64{-1, 0, math.MinInt64, math.MaxInt64} {
		if e.mod.Touch(id, []byte("x")) {
			t.Fatalf("Touch(%d) found an instance", id)
		}
	}
	for i := int64(0); i < 100_000; i++ {
		e.mod.Touch(1_000_000+i, []byte("flood"))
	}
	if n := len(e.mod.Contexts()); n != 1 {
		t.Fatalf("%d contexts after a ping flood", n)
	}
}

// Two peers taking one id in turns: every reuse is counted, the log is
// rate-limited, nothing accumulates.
func TestReuseFloodIsBounded(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	for i := 0; i < 1000; i++ {
		peer := []byte{byte(i % 2)}
		if _, err := e.mod.RegisterThrough(payload(1), peer, ""); err != nil {
			t.Fatal(err)
		}
	}
	if s := e.mod.Stats(); s.Reused != 999 || s.Instances != 1 {
		t.Fatalf("stats %+v", s)
	}
	if n := len(e.eventsOf(workers.EventReused)); n != 1 {
		t.Fatalf("%d reuse events in one (fake) second", n)
	}
	if !e.mod.Unregister(1) || e.layouts.Has("m", 1) {
		t.Fatal("layout references leaked by the reuses")
	}
}

// TestReaperUnderAutoTakesOnlyPingingTables: with --protocol auto each peer
// speaks its own table. Only instances registered through a table whose
// PING carries the id are reaped; a seed-era worker served by the same
// server is never reaped, however long it stays silent.
func TestReaperUnderAutoTakesOnlyPingingTables(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	e.mod.SetLiveness(Liveness{Reap: true, Timeout: 120 * time.Second, Grace: 3600 * time.Second,
		Profiles: []string{"engine-driven", "rpc-messages"}})
	if _, err := e.mod.RegisterThrough(payload(1), []byte("seed"), "nongpu-v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.mod.RegisterThrough(payload(2), []byte("engine"), "engine-driven"); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(1000 * time.Hour)
	if got := e.mod.Reap(); len(got) != 1 || got[0] != 2 {
		t.Fatalf("reaped %v, want [2] (the engine-driven worker only)", got)
	}
	if c := contextOf(t, e.mod, 1); c.State == workers.StateReaped {
		t.Fatalf("the seed-era worker was reaped: %+v", c)
	}
}

// TestLongPeerIDsShownShort: a peer may choose a 255-byte routing id; the
// context shows its first 16 bytes (what /status lists for up to
// --max-instances contexts stays small), the log line likewise.
func TestLongPeerIDsShownShort(t *testing.T) {
	e := newEnv(t, true, 1<<20)
	peer := bytes.Repeat([]byte{0xab}, 255)
	if _, err := e.mod.RegisterThrough(payload(1), peer, ""); err != nil {
		t.Fatal(err)
	}
	c := contextOf(t, e.mod, 1)
	if want := strings.Repeat("ab", 16) + "…"; c.Peer != want {
		t.Fatalf("peer shown as %q (%d bytes), want %q", c.Peer, len(c.Peer), want)
	}
	if got := peerText("\x00\x01"); got != "peer 0001" {
		t.Fatalf("a short peer: %q", got)
	}
}
