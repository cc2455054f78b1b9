package engine

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"kvdock/core/protocol"
	"kvdock/core/workers"
)

// PING under the engine-driven profile: [id] marks a registered instance
// pinged, [None] and [] are plain probes, and hostile ids (unknown,
// negative, extreme, wrong-typed, too large for int64) keep no state and
// never stop the server.
func TestPingCarriesInstanceID(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg.Server.Protocol = "engine-driven"
	e := startEngine(t, cfg)
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	register(t, c, 1)
	spec, _ := c.Profile().ByName(protocol.Ping)
	ping := func(payload ...[]byte) (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		r, err := c.CallRaw(ctx, spec.Number, payload...)
		if err != nil {
			return false, err
		}
		var ok bool
		return ok, r.Decode(&ok)
	}
	enc := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	pinged := func() bool {
		for _, ci := range e.Snapshot().Contexts {
			if ci.InstanceID == 1 {
				return ci.Pinged
			}
		}
		t.Fatal("instance 1 gone")
		return false
	}
	for _, p := range [][][]byte{nil, {enc(nil)}, {enc(int64(-1))}, {enc(int64(math.MaxInt64))}, {enc(int64(math.MinInt64))}} {
		if ok, err := ping(p...); err != nil || !ok {
			t.Fatalf("PING %v = %v, %v", p, ok, err)
		}
	}
	if pinged() {
		t.Fatal("instance 1 marked pinged by probes naming other ids")
	}
	// Wrong types and an id past int64 are bad payloads: no answer here
	// (no error marker in this profile), and the server keeps serving.
	for _, p := range [][]byte{enc("1"), enc([]int{1}), enc(uint64(math.MaxUint64)), enc(1.5), {0xc1}} {
		if _, err := ping(p); err == nil {
			t.Fatalf("PING %x answered", p)
		}
		if err := noop(t, c); err != nil {
			t.Fatal(err)
		}
	}
	// A flood of unknown ids keeps nothing.
	for i := int64(0); i < 2000; i++ {
		if _, err := ping(enc(1000 + i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(e.Snapshot().Contexts); n != 1 {
		t.Fatalf("%d contexts after a ping flood", n)
	}
	if ok, err := ping(enc(int64(1))); err != nil || !ok || !pinged() {
		t.Fatalf("PING [1] = %v, %v; pinged %v", ok, err, pinged())
	}
}

// Only profiles whose PING carries the id reap; the settings reach the
// module at start and live.
func TestReaperFollowsProfileAndSettings(t *testing.T) {
	for _, c := range []struct {
		profile string
		reap    bool
		// auto: on, but only for instances registered through these tables
		only []string
	}{{"nongpu-v1", false, nil}, {"nongpu-v2", false, nil}, {"engine-driven", true, nil},
		{"auto", true, []string{"rpc-messages", "engine-driven-v2", "engine-driven-v2-early", "engine-driven"}}} {
		cfg, _ := testConfig(t)
		cfg.Server.Protocol = c.profile
		e := startEngine(t, cfg)
		l := e.cur.Load().dataPlane.transfer.LivenessSettings()
		if l.Reap != c.reap || l.Timeout != 120*time.Second || l.Grace != time.Hour || l.Idle != 5*time.Minute {
			t.Fatalf("%s: liveness %+v", c.profile, l)
		}
		if !slices.Equal(l.Profiles, c.only) {
			t.Fatalf("%s: reaped tables %q, want %q", c.profile, l.Profiles, c.only)
		}
		next := cfg
		next.Server.WorkerReapTimeoutSeconds = 30
		if _, err := e.Apply(context.Background(), next, nil); err != nil {
			t.Fatal(err)
		}
		if l := e.cur.Load().dataPlane.transfer.LivenessSettings(); l.Timeout != 30*time.Second || l.Reap != c.reap {
			t.Fatalf("%s: after apply %+v", c.profile, l)
		}
	}
}

// RemoveInstance: unknown ids are refused and change nothing.
func TestRemoveInstance(t *testing.T) {
	e, _, c := startDialed(t)
	register(t, c, 3)
	if err := e.RemoveInstance(4, ClearByCtl); err == nil {
		t.Fatal("unknown id removed")
	}
	if err := e.RemoveInstance(3, ClearByCtl); err != nil {
		t.Fatal(err)
	}
	cs := e.Snapshot().Contexts
	if len(cs) != 1 || cs[0].State != workers.StateRemoved {
		t.Fatalf("contexts %+v", cs)
	}
}
