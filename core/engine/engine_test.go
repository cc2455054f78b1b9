package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"kvdock/assets"
	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/core/testkit/freeport"
	"kvdock/settings"
)

var nameSeq atomic.Int64

// testConfig is a tiny engine on a free port with its own segment name.
func testConfig(t *testing.T) (settings.Config, string) {
	t.Helper()
	cfg := settings.Default()
	cfg.Server.Port = freeport.Port(t)
	cfg.L1.SizeGB = 16.0 / 1024 // 16 MiB
	cfg.L1.Prefault = false
	name := fmt.Sprintf("kvdock_enginetest_%d_%d", os.Getpid(), nameSeq.Add(1))
	cfg.Server.ShmName = &name
	return cfg, "lmcache_l1_pool_" + name
}

func startEngine(t *testing.T, cfg settings.Config) *Engine {
	t.Helper()
	e := New(cfg, Options{})
	if err := e.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	return e
}

func dial(t *testing.T, port int, profile string) *client.Client {
	t.Helper()
	p, err := protocol.Load(profile, assets.Protocol)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(fmt.Sprintf("tcp://127.0.0.1:%d", port), p, client.Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func noop(t *testing.T, c *client.Client) error {
	t.Helper()
	r, err := c.Call(context.Background(), protocol.Noop)
	if err != nil {
		return err
	}
	var s string
	if err := r.Decode(&s); err != nil || s != "OK" {
		return fmt.Errorf("NOOP answered %q (%v)", s, err)
	}
	return nil
}

func register(t *testing.T, c *client.Client, id int64) protocol.RegisterResponse {
	t.Helper()
	r, err := c.Call(context.Background(), protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{
		InstanceID: id, ModelName: "m", WorldSize: 1, BlockSize: 16, NumLayers: 2, HiddenDimSize: 16, DtypeStr: "float32",
	})
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	var resp struct {
		ShmName  string `msgpack:"shm_name"`
		PoolSize int64  `msgpack:"pool_size"`
	}
	if err := r.Decode(&resp); err != nil {
		t.Fatalf("register reply: %v", err)
	}
	return protocol.RegisterResponse{ShmName: resp.ShmName, PoolSize: resp.PoolSize}
}

func TestStartServesAndStopUnlinksSegment(t *testing.T) {
	cfg, seg := testConfig(t)
	e := New(cfg, Options{Version: "test"})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", seg)); err != nil {
		t.Fatalf("segment missing while serving: %v", err)
	}
	s := e.Snapshot()
	if s.State != Serving || s.Shm.ShmName != seg || s.Shm.PoolSize != cfg.L1.SizeBytes() {
		t.Fatalf("snapshot: state %v shm %+v", s.State, s.Shm)
	}
	if want := fmt.Sprintf("tcp://127.0.0.1:%d", cfg.Server.Port); s.Endpoint != want {
		t.Fatalf("endpoint %q, want %q", s.Endpoint, want)
	}
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	if err := noop(t, c); err != nil {
		t.Fatal(err)
	}
	if got := register(t, c, 7); got.ShmName != seg {
		t.Fatalf("register advertised %q, want the segment %q", got.ShmName, seg)
	}
	if s := e.Snapshot(); len(s.Contexts) != 1 || s.Contexts[0].Mode != "SHM" {
		t.Fatalf("contexts after register: %+v", s.Contexts)
	}
	if err := e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", seg)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("segment left after Stop: %v", err)
	}
	if s := e.Snapshot(); s.State != Stopped {
		t.Fatalf("state after stop: %v", s.State)
	}
}

func TestShmOffAdvertisesNothing(t *testing.T) {
	cfg, _ := testConfig(t)
	off := ""
	cfg.Server.ShmName = &off
	e := startEngine(t, cfg)
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	if got := register(t, c, 1); got.ShmName != "" || got.PoolSize != 0 {
		t.Fatalf("SHM off advertised %+v", got)
	}
	s := e.Snapshot()
	if s.Pool.Decision.Shared || !strings.Contains(s.Shm.Reason, `--shm-name ""`) {
		t.Fatalf("decision %+v reason %q", s.Pool.Decision, s.Shm.Reason)
	}
	if len(s.Contexts) != 1 || s.Contexts[0].Mode != "PICKLE" {
		t.Fatalf("contexts: %+v", s.Contexts)
	}
}

func TestGPUTransferModeRefused(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg.Server.TransferMode = "gpu"
	e := New(cfg, Options{})
	err := e.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "CUDA") {
		t.Fatalf("Start with transfer mode gpu: %v", err)
	}
	if s := e.Snapshot(); s.State != Failed || s.Error == "" {
		t.Fatalf("state %v error %q", s.State, s.Error)
	}
}

func TestSecondServerOnLiveSegmentIsAnError(t *testing.T) {
	cfg, seg := testConfig(t)
	startEngine(t, cfg)
	cfg2 := cfg
	cfg2.Server.Port = freeport.Port(t)
	e2 := New(cfg2, Options{})
	err := e2.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), seg) {
		t.Fatalf("second server on %s: %v", seg, err)
	}
}

func TestApplyLiveKeepsEverything(t *testing.T) {
	e, cfg, c := startDialed(t)
	register(t, c, 1)
	next := cfg
	next.Eviction.Ratio = 0.5
	next.L1.ReadTTLSeconds = 30
	next.L1.MaxLockedSharePerInstance = 0.25
	res, err := e.Apply(context.Background(), next, nil)
	if err != nil || res.Class != settings.Live || len(res.Changes) != 3 {
		t.Fatalf("apply live: %+v %v", res, err)
	}
	s := e.Snapshot()
	if s.Pool.Ratio != 0.5 || s.Pool.ReadTTL != 30*time.Second || len(s.Contexts) != 1 || s.State != Serving {
		t.Fatalf("after live apply: ratio %v ttl %v contexts %d state %v", s.Pool.Ratio, s.Pool.ReadTTL, len(s.Contexts), s.State)
	}
	if s.Pool.OwnerLockCap != s.Pool.Size/4 {
		t.Fatalf("after live apply: owner lock cap %d of %d", s.Pool.OwnerLockCap, s.Pool.Size)
	}
	// The event names the class once: "applied (live): …", not
	// "applied live: live (…)".
	var applied string
	for _, ev := range s.Events {
		if strings.HasPrefix(ev.Message, "applied") {
			applied = ev.Message
		}
	}
	if !strings.HasPrefix(applied, "applied (live): ") || strings.Contains(applied, "live (") || !strings.Contains(applied, "eviction.ratio") {
		t.Fatalf("apply event %q", applied)
	}
	if !s.Rebuilt.At.IsZero() {
		t.Fatalf("a live apply recorded a rebuild: %+v", s.Rebuilt)
	}
	if err := noop(t, c); err != nil {
		t.Fatal(err)
	}
}

func TestApplyRestartKeepsPoolAndContexts(t *testing.T) {
	cfg, seg := testConfig(t)
	e := startEngine(t, cfg)
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	register(t, c, 1)
	next := cfg
	next.Server.Port = freeport.Port(t)
	res, err := e.Apply(context.Background(), next, nil)
	if err != nil || res.Class != settings.Restart {
		t.Fatalf("apply restart: %+v %v", res, err)
	}
	s := e.Snapshot()
	if len(s.Contexts) != 1 || s.Shm.ShmName != seg || s.State != Serving {
		t.Fatalf("after restart: contexts %d shm %q state %v", len(s.Contexts), s.Shm.ShmName, s.State)
	}
	c2 := dial(t, next.Server.Port, cfg.Server.Protocol)
	if err := noop(t, c2); err != nil {
		t.Fatalf("new port: %v", err)
	}
	// The kept context still serves its worker.
	r, err := c2.Call(context.Background(), protocol.PrepareStore, protocol.Key{
		ModelName: "m", WorldSize: 1, WorkerID: new(int), TokenIDs: make([]uint32, 256), Start: 0, End: 256, RequestID: "r",
	}, int64(1))
	if err != nil || !r.Present {
		t.Fatalf("PREPARE_STORE after restart: %v present=%v", err, r.Present)
	}
}

func TestApplyRebuildDropsContextsAndSwapsSegment(t *testing.T) {
	cfg, seg := testConfig(t)
	e := startEngine(t, cfg)
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	register(t, c, 1)
	next := cfg
	name := *cfg.Server.ShmName + "_b"
	next.Server.ShmName = &name
	next.L1.SizeGB = 8.0 / 1024
	res, err := e.Apply(context.Background(), next, nil)
	if err != nil || res.Class != settings.Rebuild {
		t.Fatalf("apply rebuild: %+v %v", res, err)
	}
	s := e.Snapshot()
	if len(s.Contexts) != 0 || s.Shm.ShmName != seg+"_b" || s.Shm.PoolSize != next.L1.SizeBytes() {
		t.Fatalf("after rebuild: contexts %d shm %+v", len(s.Contexts), s.Shm)
	}
	// The faces say why the table is empty.
	if s.Rebuilt.DroppedContexts != 1 || s.Rebuilt.At.IsZero() {
		t.Fatalf("after rebuild: %+v, want 1 dropped context", s.Rebuilt)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", seg)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("old segment still there: %v", err)
	}
	if err := noop(t, c); err != nil {
		t.Fatal(err)
	}
}

// fixedMemory is a settings.MemoryProbe with a set answer.
type fixedMemory int64

func (f fixedMemory) MemAvailable() (int64, error) { return int64(f), nil }

// A new pool size past the host's memory is refused by
// Apply whichever face asked (dashboard, HTTP, SIGHUP); the running pool
// counts as available since a rebuild closes it first.
func TestApplyRefusesPoolLargerThanMemory(t *testing.T) {
	cfg, seg := testConfig(t) // 16 MiB pool
	e := New(cfg, Options{Memory: fixedMemory(8 << 20)})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	c := dial(t, cfg.Server.Port, cfg.Server.Protocol)
	register(t, c, 1)

	next := cfg
	next.L1.SizeGB = 64.0 / 1024
	_, err := e.Apply(context.Background(), next, nil)
	var ve *settings.ValidationError
	if !errors.As(err, &ve) || !strings.Contains(err.Error(), "needs 64.0 MiB") || !strings.Contains(err.Error(), "8.0 MiB available") {
		t.Fatalf("64 MiB pool with 8 MiB free: %v", err)
	}
	s := e.Snapshot()
	if s.Config.L1.SizeGB != cfg.L1.SizeGB || len(s.Contexts) != 1 || s.Shm.ShmName != seg || !s.Rebuilt.At.IsZero() {
		t.Fatalf("refused apply changed the engine: size %v contexts %d rebuilt %+v", s.Config.L1.SizeGB, len(s.Contexts), s.Rebuilt)
	}

	// With overcommit allowed the same size goes through.
	next.L1.AllowOvercommit = true
	if _, err := e.Apply(context.Background(), next, nil); err != nil {
		t.Fatalf("overcommit allowed: %v", err)
	}
	if s := e.Snapshot(); s.Pool.Size != next.L1.SizeBytes() || s.Rebuilt.DroppedContexts != 1 {
		t.Fatalf("after the allowed apply: size %d rebuilt %+v", s.Pool.Size, s.Rebuilt)
	}
}

func TestApplyRollsBackWhenPortTaken(t *testing.T) {
	e, cfg, c := startDialed(t)
	register(t, c, 1)
	busy := busyPort(t)
	next := cfg
	next.Server.Port = busy
	res, err := e.Apply(context.Background(), next, nil)
	if err == nil || !res.RolledBack || !strings.Contains(err.Error(), "rolled back") {
		t.Fatalf("apply onto a taken port: %+v %v", res, err)
	}
	s := e.Snapshot()
	if s.State != Serving || s.Config.Server.Port != cfg.Server.Port || len(s.Contexts) != 1 {
		t.Fatalf("after rollback: state %v port %d contexts %d", s.State, s.Config.Server.Port, len(s.Contexts))
	}
	if err := noop(t, c); err != nil {
		t.Fatalf("old port after rollback: %v", err)
	}
	var sawRollback bool
	for _, ev := range s.Events {
		sawRollback = sawRollback || strings.Contains(ev.Message, "rolled back")
	}
	if !sawRollback {
		t.Fatalf("no rollback event in %+v", s.Events)
	}
}
