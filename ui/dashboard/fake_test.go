package dashboard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"

	"kvdock/core/engine"
	"kvdock/core/gpu"
	"kvdock/core/hostmem"
	"kvdock/core/l1"
	"kvdock/core/layout"
	"kvdock/core/misses"
	"kvdock/core/series"
	"kvdock/core/whatif"
	"kvdock/core/workers"
	"kvdock/settings"
)

// t0 is the fake clock: every time in the fixture is relative to it.
var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// fakeEngine is an Engine with a fixed snapshot that records Apply calls.
type fakeEngine struct {
	mu       sync.Mutex
	snap     engine.Snapshot
	cfg      settings.Config
	src      map[string]settings.Source
	applied  []settings.Config
	appSrc   []map[string]settings.Source
	applyErr error
	rollback bool
	events   chan engine.Event
	removed  []int64
}

func (f *fakeEngine) RemoveInstance(id int64, by engine.ClearOrigin) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, c := range f.snap.Contexts {
		if c.InstanceID == id && c.State != workers.StateRemoved && c.State != workers.StateReaped {
			f.removed = append(f.removed, id)
			f.snap.Contexts[i].State = workers.StateRemoved
			return nil
		}
	}
	return fmt.Errorf("instance %d is not registered: %w", id, engine.ErrUnknownInstance)
}

func (f *fakeEngine) Snapshot() engine.Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snap
}

func (f *fakeEngine) Subscribe(buffer int) (<-chan engine.Event, func()) {
	return f.events, func() {}
}

func (f *fakeEngine) Apply(_ context.Context, cfg settings.Config, src map[string]settings.Source) (engine.ApplyResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied = append(f.applied, cfg)
	f.appSrc = append(f.appSrc, src)
	ch := settings.Diff(f.cfg, cfg)
	res := engine.ApplyResult{Changes: ch, Class: settings.Strongest(ch)}
	// One event per apply, as the engine records it.
	var keys []string
	for _, c := range ch {
		keys = append(keys, c.Key)
	}
	what := fmt.Sprintf("(%s): %s", res.Class, strings.Join(keys, ", "))
	ev := engine.Event{Seq: uint64(len(f.snap.Events) + 100), Time: t0, Kind: engine.EventRestart, Level: slog.LevelInfo, Message: "applied " + what}
	if f.applyErr != nil {
		res.RolledBack = f.rollback
		ev.Kind, ev.Level, ev.Message = engine.EventError, slog.LevelError, fmt.Sprintf("apply %s failed, rolled back to the running config: %v", what, f.applyErr)
		f.snap.Events = append(f.snap.Events, ev)
		return res, f.applyErr
	}
	f.snap.Events = append(f.snap.Events, ev)
	f.cfg, f.src = cfg, src
	return res, nil
}

func (f *fakeEngine) Config() (settings.Config, map[string]settings.Source) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cfg, f.src
}

func (f *fakeEngine) applyCalls() []settings.Config {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]settings.Config(nil), f.applied...)
}

func mustLayout(t *testing.T, layers, chunk, hidden int, dtype string) layout.Layout {
	t.Helper()
	l, err := layout.New(layers, chunk, hidden, dtype, false)
	if err != nil {
		t.Fatalf("layout: %v", err)
	}
	return l
}

// newFakeEngine is the fixture behind the goldens: three workers (two SHM,
// one PICKLE), a half-used shared pool, two GPUs and a few events.
func newFakeEngine(t *testing.T) *fakeEngine {
	t.Helper()
	cfg := settings.Default()
	name := "demo"
	cfg.Server.ShmName = &name
	src := map[string]settings.Source{
		"server.shm_name": {Kind: settings.SourceFlag, Detail: "--shm-name"},
		"l1.size_gb":      {Kind: settings.SourceFile, Detail: "/etc/kvdock.yaml:3"},
	}
	lay := mustLayout(t, 32, 256, 1024, "bfloat16")
	small := mustLayout(t, 24, 256, 512, "float16")
	contexts := []workers.ContextInfo{
		// A hybrid model: a second KV group of another layout.
		{InstanceID: 4242, Model: "meta-llama/Llama-3.1-8B", WorldSize: 1, BlockSize: 16, NumLayers: 32, HiddenDimSize: 1024,
			Layout: lay, Groups: []layout.Layout{lay, mustLayout(t, 8, 256, 256, "float32")},
			Mode: workers.ModeSHM, Reason: "segment lmcache_l1_pool_demo attached",
			Registered: t0.Add(-2 * time.Hour), LastRequest: t0.Add(-3 * time.Second),
			State: workers.StateActive, Peer: "006b8b4567", InFlight: 1, Pinged: true, Transferred: true,
			Stores: 120, Retrieves: 80, HitChunks: 640, BytesIn: 3 << 30, BytesOut: 2 << 30},
		{InstanceID: 4243, Model: "meta-llama/Llama-3.1-8B", WorldSize: 2, BlockSize: 16, NumLayers: 32, HiddenDimSize: 1024,
			Layout: lay, Mode: workers.ModeSHM, Reason: "segment lmcache_l1_pool_demo attached",
			Registered: t0.Add(-90 * time.Minute), LastRequest: t0.Add(-45 * time.Second),
			Stores: 7, Retrieves: 300, HitChunks: 12, BytesIn: 200 << 20, BytesOut: 5 << 30},
		{InstanceID: 9001, Model: "Qwen/Qwen2-0.5B", WorldSize: 1, BlockSize: 16, NumLayers: 24, HiddenDimSize: 512,
			Layout: small, Mode: workers.ModePickle, Reason: "worker reported it could not attach the segment",
			Registered: t0.Add(-10 * time.Minute), LastRequest: time.Time{}, State: workers.StateIdle,
			Stores: 3, Retrieves: 0, HitChunks: 0, BytesIn: 12 << 20},
	}
	g := gpu.NewFake(gpu.Snapshot{
		Available: true, Driver: "550.54.15", Sampled: t0,
		Devices: []gpu.Device{
			{Index: 0, Name: "NVIDIA H200", MemUsed: 40 << 30, MemTotal: 141 << 30, Util: 35,
				Processes: []gpu.Process{{PID: 4242, MemUsed: 30 << 30, MemKnown: true, Kind: "C"}, {PID: 777, MemUsed: 0, Kind: "G"}}},
			{Index: 1, Name: "NVIDIA H200", MemUsed: 1 << 30, MemTotal: 141 << 30, Util: -1},
		},
	})
	snap := engine.Snapshot{
		Version: "v0.3.0", State: engine.Serving, Endpoint: "tcp://localhost:5555", Protocol: "nongpu-v1",
		Started: t0.Add(-2*time.Hour - 3*time.Minute - 4*time.Second), Uptime: 2*time.Hour + 3*time.Minute + 4*time.Second, Taken: t0,
		Config: cfg, Sources: src,
		Shm: workers.Info{ShmName: "lmcache_l1_pool_demo", PoolSize: 1 << 30, Reason: "--shm-name \"demo\" given on the command line"},
		Pool: engine.Pool{
			Stats: l1.Stats{Objects: 321, UsedBytes: 512 << 20, ResidentBytes: 512 << 20, UsableBytes: 510 << 20, Size: 1 << 30, Evictions: 17, AllocFailures: 2, Prefaulted: 768 << 20,
				Policy: "LRU", Watermark: 0.8, Ratio: 0.2, WriteTTL: 600 * time.Second, ReadTTL: 300 * time.Second},
			Decision: l1.Decision{Segment: "lmcache_l1_pool_demo", Size: 1 << 30, Shared: true,
				Reason: "--shm-name \"demo\" given on the command line", ShmFree: 30 << 30},
			ShmFree: 30 << 30, HostAvailable: 20 << 30,
		},
		Contexts: contexts,
		Events: []engine.Event{
			{Seq: 1, Time: t0.Add(-2 * time.Hour), Kind: engine.EventLifecycle, Level: slog.LevelInfo, Message: "serving on tcp://localhost:5555"},
			{Seq: 2, Time: t0.Add(-2 * time.Hour), Kind: "register", Level: slog.LevelInfo, Message: "instance 4242 registered: SHM"},
			{Seq: 3, Time: t0.Add(-10 * time.Minute), Kind: "fallback", Level: slog.LevelWarn, Message: "instance 9001 uses PICKLE: worker reported it could not attach the segment"},
		},
		GPU:   g.Sample(),
		Rates: fakeRates(),
		Misses: misses.Report{
			Total: misses.Counts{misses.NeverStored: 1200, misses.Evicted: 340, misses.OtherLayout: 64, misses.AfterMiss: 9},
			Contexts: []misses.ContextCounts{{Context: misses.Context{Model: "meta-llama/Llama-3.1-8B", WorldSize: 1},
				Missed: misses.Counts{misses.NeverStored: 1200, misses.Evicted: 340, misses.AfterMiss: 9}}},
		},
		Host: hostmem.Host{Memory: hostmem.Memory{Total: 128 << 30, Available: 100 << 30}, Nodes: 1},
		WhatIf: whatif.Curve{
			Points: []whatif.Point{
				{Factor: 0.25, PoolBytes: 1 << 28, HitRatio: 0.12}, {Factor: 0.5, PoolBytes: 1 << 29, HitRatio: 0.30},
				{Factor: 0.75, PoolBytes: 3 << 28, HitRatio: 0.37}, {Factor: 1, PoolBytes: 1 << 30, HitRatio: 0.41},
				{Factor: 1.5, PoolBytes: 3 << 29, HitRatio: 0.55}, {Factor: 2, PoolBytes: 2 << 30, HitRatio: 0.63},
				{Factor: 3, PoolBytes: 3 << 30, HitRatio: 0.70}, {Factor: 4, PoolBytes: 4 << 30, HitRatio: 0.72},
			},
			Measured: 0.42, SampleRate: 0.012, Sampled: 3104, Weight: 3000, Tracked: 180, Limit: 256, MemoryBytes: 6600,
		},
	}
	return &fakeEngine{snap: snap, cfg: cfg, src: src, events: make(chan engine.Event, 8)}
}

func testOptions() Options {
	return Options{
		Version:  "test",
		Profile:  colorprofile.ASCII,
		Refresh:  time.Second,
		Now:      func() time.Time { return t0 },
		Location: time.UTC,
		Environ:  []string{},
		LogFile:  "/var/log/kvdock/kvdock.log",
	}
}

func newTestModel(t *testing.T, f *fakeEngine, w, h int) *Model {
	t.Helper()
	opts := testOptions().withDefaults(f)
	m := newModel(context.Background(), f, opts, opts.Profile)
	m.Update(tea.WindowSizeMsg{Width: w, Height: h})
	return m
}

// keyMsg builds the key press a terminal would deliver for a key name.
func keyMsg(k string) tea.KeyPressMsg {
	special := map[string]tea.KeyPressMsg{
		"enter":     {Code: tea.KeyEnter},
		"esc":       {Code: tea.KeyEscape},
		"tab":       {Code: tea.KeyTab},
		"shift+tab": {Code: tea.KeyTab, Mod: tea.ModShift},
		"backspace": {Code: tea.KeyBackspace},
		"up":        {Code: tea.KeyUp},
		"down":      {Code: tea.KeyDown},
		"ctrl+c":    {Code: 'c', Mod: tea.ModCtrl},
		"ctrl+u":    {Code: 'u', Mod: tea.ModCtrl},
		"ctrl+r":    {Code: 'r', Mod: tea.ModCtrl},
		"ctrl+d":    {Code: 'd', Mod: tea.ModCtrl},
		"pgup":      {Code: tea.KeyPgUp},
		"pgdown":    {Code: tea.KeyPgDown},
		"space":     {Code: tea.KeySpace, Text: " "},
	}
	if msg, ok := special[k]; ok {
		return msg
	}
	r := []rune(k)
	if len(r) != 1 {
		panic("keyMsg: unknown key " + k)
	}
	msg := tea.KeyPressMsg{Code: r[0], Text: k}
	if r[0] >= 'A' && r[0] <= 'Z' {
		msg.Code = r[0] + ('a' - 'A')
		msg.ShiftedCode = r[0]
		msg.Mod = tea.ModShift
	}
	return msg
}

// press sends keys in order, running the commands they return (except
// quit and ticks) the way the program would.
func press(t *testing.T, m *Model, keys ...string) tea.Cmd {
	t.Helper()
	var last tea.Cmd
	for _, k := range keys {
		_, cmd := m.Update(keyMsg(k))
		last = runCmd(t, m, cmd)
	}
	return last
}

// typeText types s one key at a time.
func typeText(t *testing.T, m *Model, s string) {
	t.Helper()
	for _, r := range s {
		press(t, m, string(r))
	}
}

// runCmd runs cmd and feeds its message back, once; it returns cmd when
// that is a quit so tests can see it.
func runCmd(t *testing.T, m *Model, cmd tea.Cmd) tea.Cmd {
	t.Helper()
	if cmd == nil {
		return nil
	}
	msg := cmd()
	switch msg.(type) {
	case tea.QuitMsg:
		return cmd
	case applyMsg, removeMsg:
		_, next := m.Update(msg)
		if next != nil {
			m.Update(next()) // the snapshot after the apply
		}
		return nil
	}
	return nil
}

// screen is the view as plain text.
func screen(m *Model) string {
	return ansi.Strip(m.View().Content)
}

func isQuit(cmd tea.Cmd) bool {
	if cmd == nil {
		return false
	}
	_, ok := cmd().(tea.QuitMsg)
	return ok
}

var errPortTaken = errors.New("bind tcp://localhost:6000: address already in use")

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func ioPipe() (*os.File, *os.File) {
	r, w, err := os.Pipe()
	if err != nil {
		panic(err)
	}
	return r, w
}

// fakeRates is ten minutes of made-up but fixed history: a hit ratio that
// climbs as the cache warms, bursts of stores, a pool filling up with a
// few evictions at the end. Instance 9001 has no lookups (no hit ratio).
func fakeRates() engine.Rates {
	const n = 600
	w := func(f func(i int) float64) series.Window {
		v := make([]float64, n)
		for i := range v {
			v[i] = f(i)
		}
		return series.Window{Fine: v}
	}
	wave := func(i, period int) float64 { return float64(i%period) / float64(period-1) } // 0..1 sawtooth
	asked := w(func(i int) float64 { return 40 + float64(i%7) })
	hit := w(func(i int) float64 { return (40 + float64(i%7)) * (0.3 + 0.6*wave(i, 23)) })
	store := w(func(i int) float64 { return float64((i/3)%5) * 0.3e9 })
	retrieve := w(func(i int) float64 { return wave(i, 17) * 1.5e9 })
	ctx := func(scale float64, period int) engine.ContextRates {
		return engine.ContextRates{
			Lookups:          w(func(i int) float64 { return scale * (2 + 4*wave(i, period+5)) }),
			AskedChunks:      w(func(i int) float64 { return scale * 40 }),
			HitChunks:        w(func(i int) float64 { return scale * 40 * (0.2 + 0.75*wave(i, period)) }),
			StoreBytes:       w(func(i int) float64 { return scale * float64((i/2)%5) * 0.2e9 }),
			RetrieveBytes:    w(func(i int) float64 { return scale * wave(i, period+2) * 0.6e9 }),
			TokensSavedTotal: int64(scale * 9_876_543), TokensSavedHour: scale * 1_234_567,
		}
	}
	return engine.Rates{
		Taken: t0,
		Server: engine.ServerRates{
			Lookups: w(func(i int) float64 { return 10 }), AskedChunks: asked, HitChunks: hit,
			StoreBytes: store, RetrieveBytes: retrieve,
			Evictions:        w(func(i int) float64 { return float64(max(0, i-560) % 4) }),
			PoolUsed:         w(func(i int) float64 { return float64(min(i, 599)) / 599 * (512 << 20) }),
			TokensSavedTotal: 48_500_000, TokensSavedHour: 12_345_678,
		},
		Contexts: map[int64]engine.ContextRates{4242: ctx(1, 9), 4243: ctx(0.5, 13)},
		Latency:  fakeLatency(),
	}
}

// fakeLatency is two minutes of request latency per kind: a steady lookup
// path, stores whose p99 climbs in bursts, retrieves that stopped a while
// ago (a gap in their chart), a registration long ago (not listed) and a
// kind never seen.
func fakeLatency() map[string]engine.LatencyRates {
	const n = 120
	w := func(f func(i int) float64) series.Window {
		v := make([]float64, n)
		for i := range v {
			v[i] = f(i)
		}
		return series.Window{Fine: v}
	}
	steady := func(rate, p50, p99 float64, period int) engine.LatencyRates {
		return engine.LatencyRates{
			Rate: w(func(int) float64 { return rate }),
			P50:  w(func(int) float64 { return p50 }),
			P99:  w(func(i int) float64 { return p99 * (1 + float64(i%period)/float64(period)) }),
		}
	}
	retrieve := steady(4, 1.5e-3, 9e-3, 11)
	for i := 40; i < 70; i++ {
		retrieve.Rate.Fine[i], retrieve.P50.Fine[i], retrieve.P99.Fine[i] = 0, 0, 0
	}
	register := engine.LatencyRates{Rate: w(func(i int) float64 { return float64(max(0, 3-i)) }),
		P50: w(func(i int) float64 { return 0.002 * float64(max(0, 3-i)) }), P99: w(func(i int) float64 { return 0.004 * float64(max(0, 3-i)) })}
	lookup := steady(10, 80e-6, 400e-6, 7)
	lookup.P99.Fine[100] = 5e-3 // one slow second
	return map[string]engine.LatencyRates{
		"LOOKUP":                            lookup,
		"QUERY_PREFETCH_STATUS":             steady(31, 30e-6, 120e-6, 5),
		"PREPARE_STORE":                     steady(6, 150e-6, 900e-6, 13),
		"COMMIT_STORE":                      steady(6, 2.1e-3, 12e-3, 17),
		"PREPARE_RETRIEVE":                  retrieve,
		"REGISTER_KV_CACHE_NON_GPU_CONTEXT": register,
		"NOOP":                              {},
	}
}
