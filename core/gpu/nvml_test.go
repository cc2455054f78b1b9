package gpu

import (
	"strings"
	"sync"
	"testing"
)

// fakeLib is a scripted NVML: it counts every call and returns what the test
// set, including NVML error codes.
type fakeLib struct {
	mu       sync.Mutex
	calls    map[string]int
	initErr  error
	symbols  map[string]bool
	devs     []*fakeDev
	countErr error
}

type fakeDev struct {
	lib                *fakeLib
	name, uuid         string
	v1Used, v1Total    uint64
	v2Used, v2Total    uint64
	v2Err, v1Err       error
	util               uint32
	utilErr            error
	compute, graphics  []procInfo
	computeErr, gfxErr error
}

func newFakeLib() *fakeLib { return &fakeLib{calls: map[string]int{}, symbols: map[string]bool{}} }

func (l *fakeLib) call(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls[name]++
}

func (l *fakeLib) count(name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[name]
}

func (l *fakeLib) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.calls {
		n += c
	}
	return n
}

func (l *fakeLib) Init() error     { l.call("Init"); return l.initErr }
func (l *fakeLib) Shutdown() error { l.call("Shutdown"); return nil }
func (l *fakeLib) HasSymbol(name string) bool {
	l.call("HasSymbol")
	return l.symbols[name]
}
func (l *fakeLib) DriverVersion() (string, error) { l.call("DriverVersion"); return "550.54.15", nil }
func (l *fakeLib) DeviceCount() (int, error) {
	l.call("DeviceCount")
	if l.countErr != nil {
		return 0, l.countErr
	}
	return len(l.devs), nil
}
func (l *fakeLib) Device(i int) (device, error) { l.call("Device"); return l.devs[i], nil }

func (d *fakeDev) Name() (string, error) { d.lib.call("Name"); return d.name, nil }
func (d *fakeDev) UUID() (string, error) { d.lib.call("UUID"); return d.uuid, nil }
func (d *fakeDev) MemoryInfo() (uint64, uint64, error) {
	d.lib.call("MemoryInfo")
	return d.v1Used, d.v1Total, d.v1Err
}
func (d *fakeDev) MemoryInfoV2() (uint64, uint64, error) {
	d.lib.call("MemoryInfoV2")
	return d.v2Used, d.v2Total, d.v2Err
}
func (d *fakeDev) Utilization() (uint32, error) { d.lib.call("Utilization"); return d.util, d.utilErr }
func (d *fakeDev) ComputeProcesses() ([]procInfo, error) {
	d.lib.call("ComputeProcesses")
	return d.compute, d.computeErr
}
func (d *fakeDev) GraphicsProcesses() ([]procInfo, error) {
	d.lib.call("GraphicsProcesses")
	return d.graphics, d.gfxErr
}

func (l *fakeLib) addDev(d *fakeDev) *fakeDev {
	d.lib = l
	l.devs = append(l.devs, d)
	return d
}

func nvErr(op string, code int) error { return &nvmlError{Op: op, Code: code, Msg: "scripted"} }

const gib = 1 << 30

func TestNVMLInitFailureNeverCallsAgain(t *testing.T) {
	for _, tc := range []struct {
		code int
		want string
	}{
		{codeLibraryNotFound, "NVML unavailable: libnvidia-ml.so.1 not found"},
		{codeDriverNotLoaded, "NVML unavailable: NVIDIA driver not loaded"},
		{999, "NVML unavailable: init: NVML error 999"},
	} {
		l := newFakeLib()
		l.initErr = &nvmlError{Op: "init", Code: tc.code}
		l.addDev(&fakeDev{name: "never read"})
		src := newNVML(nil, l)
		for range 3 {
			s := src.Sample()
			if s.Available || s.Reason != tc.want || len(s.Devices) != 0 || s.Sampled.IsZero() {
				t.Fatalf("code %d: sample = %+v, want unavailable with reason %q", tc.code, s, tc.want)
			}
		}
		src.Close()
		src.Sample()
		if got := l.total(); got != 1 || l.count("Init") != 1 {
			t.Fatalf("code %d: %d NVML calls (%v), want only the one Init", tc.code, got, l.calls)
		}
	}
}

func TestNVMLReadsDevices(t *testing.T) {
	l := newFakeLib()
	l.symbols[memV2Symbol] = true
	l.addDev(&fakeDev{
		name: "NVIDIA H200", uuid: "GPU-0",
		v1Used: 9 * gib, v1Total: 141 * gib, // includes reserved memory: must not be shown
		v2Used: 8 * gib, v2Total: 141 * gib,
		util:     37,
		compute:  []procInfo{{PID: 100, UsedMem: 2 * gib}, {PID: 200, UsedMem: valueNotAvailable}},
		graphics: []procInfo{{PID: 200, UsedMem: 1 * gib}, {PID: 300, UsedMem: valueNotAvailable}},
	})
	l.addDev(&fakeDev{
		name: "NVIDIA T4", uuid: "GPU-1",
		v2Used: 1 * gib, v2Total: 16 * gib,
		utilErr:    nvErr("utilization", codeNotSupported),
		computeErr: nvErr("compute processes", codeNotSupported),
		gfxErr:     nvErr("graphics processes", codeNotSupported),
	})
	src := newNVML(nil, l)
	defer src.Close()
	s := src.Sample()
	if !s.Available || s.Driver != "550.54.15" || s.Err != "" || len(s.Devices) != 2 {
		t.Fatalf("snapshot = %+v", s)
	}
	d0, d1 := s.Devices[0], s.Devices[1]
	if d0.Index != 0 || d0.Name != "NVIDIA H200" || d0.UUID != "GPU-0" || d0.MemUsed != 8*gib || d0.MemTotal != 141*gib || d0.Util != 37 {
		t.Errorf("device 0 = %+v, want v2 memory 8/141 GiB and util 37", d0)
	}
	wantProcs := []Process{
		{PID: 100, MemUsed: 2 * gib, MemKnown: true, Kind: "C"},
		{PID: 200, MemUsed: 1 * gib, MemKnown: true, Kind: "C+G"}, // N/A in one list, known in the other
		{PID: 300, MemUsed: 0, MemKnown: false, Kind: "G"},
	}
	if len(d0.Processes) != len(wantProcs) {
		t.Fatalf("processes = %+v, want %+v", d0.Processes, wantProcs)
	}
	for i, p := range wantProcs {
		if d0.Processes[i] != p {
			t.Errorf("process %d = %+v, want %+v", i, d0.Processes[i], p)
		}
	}
	if d1.Index != 1 || d1.Util != -1 || d1.MemUsed != 1*gib || len(d1.Processes) != 0 {
		t.Errorf("device 1 = %+v, want util -1 (NOT_SUPPORTED), no processes, no error", d1)
	}
	if l.count("MemoryInfo") != 0 || l.count("MemoryInfoV2") != 2 {
		t.Errorf("memory calls = %v, want v2 only", l.calls)
	}
}

func TestNVMLMemoryV1WithoutV2Symbol(t *testing.T) {
	l := newFakeLib() // no v2 symbol: an old driver
	l.addDev(&fakeDev{name: "old", v1Used: 3 * gib, v1Total: 12 * gib, v2Used: 99, v2Total: 99})
	src := newNVML(nil, l)
	defer src.Close()
	s := src.Sample()
	if len(s.Devices) != 1 || s.Devices[0].MemUsed != 3*gib || s.Devices[0].MemTotal != 12*gib {
		t.Fatalf("snapshot = %+v, want v1 memory 3/12 GiB", s)
	}
	if l.count("MemoryInfoV2") != 0 {
		t.Fatalf("MemoryInfoV2 called %d times without the symbol", l.count("MemoryInfoV2"))
	}
}

func TestNVMLMemoryV2RefusedFallsBackOnce(t *testing.T) {
	l := newFakeLib()
	l.symbols[memV2Symbol] = true
	l.addDev(&fakeDev{name: "x", v1Used: 5, v1Total: 10, v2Err: nvErr("memory info v2", 25)})
	src := newNVML(nil, l)
	defer src.Close()
	for range 3 {
		s := src.Sample()
		if s.Err != "" || len(s.Devices) != 1 || s.Devices[0].MemUsed != 5 || s.Devices[0].MemTotal != 10 {
			t.Fatalf("snapshot = %+v, want v1 memory after v2 refusal", s)
		}
	}
	if l.count("MemoryInfoV2") != 1 || l.count("MemoryInfo") != 3 {
		t.Fatalf("calls = %v, want one v2 attempt then v1", l.calls)
	}
}

func TestNVMLErrorsAreReportedNotFatal(t *testing.T) {
	l := newFakeLib()
	l.addDev(&fakeDev{name: "lost", v1Err: nvErr("memory info", 15)})
	l.addDev(&fakeDev{name: "ok", v1Used: 1, v1Total: 2, utilErr: nvErr("utilization", 999)})
	src := newNVML(nil, l)
	defer src.Close()
	s := src.Sample()
	if !s.Available || len(s.Devices) != 1 || s.Devices[0].Name != "ok" || s.Devices[0].Util != -1 {
		t.Fatalf("snapshot = %+v, want only the readable device, util -1", s)
	}
	for _, want := range []string{"GPU 0: memory info: scripted", "GPU 1: utilization: scripted"} {
		if !strings.Contains(s.Err, want) {
			t.Errorf("Err = %q, want it to contain %q", s.Err, want)
		}
	}

	l.countErr = nvErr("device count", 999)
	if s = src.Sample(); !s.Available || len(s.Devices) != 0 || s.Err != "device count: scripted" {
		t.Fatalf("snapshot after count failure = %+v", s)
	}
}

func TestNVMLCloseShutsDownOnce(t *testing.T) {
	l := newFakeLib()
	l.addDev(&fakeDev{name: "x", v1Total: 1})
	src := newNVML(nil, l)
	src.Close()
	src.Close()
	before := l.total()
	s := src.Sample()
	if s.Available || s.Reason != "NVML closed" {
		t.Fatalf("sample after Close = %+v", s)
	}
	if l.count("Shutdown") != 1 || l.total() != before {
		t.Fatalf("calls = %v, want one Shutdown and no call after it", l.calls)
	}
}

// countingLib wraps the real system binding and counts calls into it.
type countingLib struct {
	lib
	mu    sync.Mutex
	calls int
}

func (c *countingLib) n() int { c.mu.Lock(); defer c.mu.Unlock(); return c.calls }
func (c *countingLib) inc()   { c.mu.Lock(); c.calls++; c.mu.Unlock() }

func (c *countingLib) Init() error                    { c.inc(); return c.lib.Init() }
func (c *countingLib) Shutdown() error                { c.inc(); return c.lib.Shutdown() }
func (c *countingLib) HasSymbol(s string) bool        { c.inc(); return c.lib.HasSymbol(s) }
func (c *countingLib) DriverVersion() (string, error) { c.inc(); return c.lib.DriverVersion() }
func (c *countingLib) DeviceCount() (int, error)      { c.inc(); return c.lib.DeviceCount() }
func (c *countingLib) Device(i int) (device, error)   { c.inc(); return c.lib.Device(i) }

// This machine (and CI) has no libnvidia-ml.so.1: the real binding must fail
// Init with a reason and then leave NVML alone. On a GPU machine this test
// would not hold; the gpu-tagged device test covers that case.
func TestNewNVMLOnMachineWithoutGPU(t *testing.T) {
	c := &countingLib{lib: systemLib()}
	src := newNVML(nil, c)
	for range 3 {
		s := src.Sample()
		if s.Available || !strings.HasPrefix(s.Reason, "NVML unavailable: ") || len(s.Devices) != 0 {
			t.Fatalf("sample = %+v, want unavailable with an NVML reason", s)
		}
	}
	t.Logf("reason: %s", src.Sample().Reason)
	src.Close()
	if c.n() != 1 {
		t.Fatalf("%d calls into NVML, want only Init", c.n())
	}

	s := NewNVML(nil).Sample() // the public constructor agrees
	if s.Available || !strings.HasPrefix(s.Reason, "NVML unavailable: ") {
		t.Fatalf("NewNVML sample = %+v", s)
	}
}
