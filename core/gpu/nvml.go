package gpu

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// NVML return codes the adapter tells apart (values from nvml.h).
const (
	codeNotSupported    = 3
	codeNoPermission    = 4
	codeDriverNotLoaded = 9
	codeLibraryNotFound = 12
)

// valueNotAvailable is NVML_VALUE_NOT_AVAILABLE (-1) as the unsigned long
// long NVML stores in a process's usedGpuMemory when it cannot tell.
const valueNotAvailable = ^uint64(0)

// memV2Symbol is checked before GetMemoryInfo_v2 is called: go-nvml does not
// pick that symbol by driver version, and calling a symbol the installed
// driver lacks kills the process.
const memV2Symbol = "nvmlDeviceGetMemoryInfo_v2"

// nvmlError is a failed NVML call: the operation, the nvml.h return code and,
// when NVML was live to give it, its message.
type nvmlError struct {
	Op   string
	Code int
	Msg  string
}

func (e *nvmlError) Error() string {
	if e.Msg == "" {
		return fmt.Sprintf("%s: NVML error %d", e.Op, e.Code)
	}
	return e.Op + ": " + e.Msg
}

func hasCode(err error, code int) bool {
	var ne *nvmlError
	return errors.As(err, &ne) && ne.Code == code
}

// lib is the part of NVML the adapter uses. The cgo binding implements it
// over go-nvml; tests implement it with a scripted fake. Errors are
// *nvmlError.
type lib interface {
	Init() error
	Shutdown() error
	HasSymbol(name string) bool
	DriverVersion() (string, error)
	DeviceCount() (int, error)
	Device(index int) (device, error)
}

type device interface {
	Name() (string, error)
	UUID() (string, error)
	MemoryInfo() (used, total uint64, err error)
	MemoryInfoV2() (used, total uint64, err error)
	Utilization() (gpuPercent uint32, err error)
	ComputeProcesses() ([]procInfo, error)
	GraphicsProcesses() ([]procInfo, error)
}

type procInfo struct {
	PID     uint32
	UsedMem uint64
}

// NewNVML initialises NVML once and returns a Source reading it. When NVML
// cannot be initialised (no libnvidia-ml.so.1, no driver, a build without
// cgo) it returns a Source that reports Available=false with the reason and
// never calls NVML. A nil logger discards.
func NewNVML(logger *slog.Logger) Source {
	return newNVML(logger, systemLib())
}

// nvmlSource reads NVML after a successful Init. Its mutex serialises
// readings and Close, so NVML is never called after Shutdown.
type nvmlSource struct {
	log *slog.Logger

	mu      sync.Mutex
	lib     lib // nil once closed
	driver  string
	memV2   bool   // use GetMemoryInfo_v2 (symbol present and not refused)
	lastErr string // last logged reading error, to log each change once
}

func newNVML(logger *slog.Logger, l lib) Source {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := l.Init(); err != nil {
		reason := initReason(err)
		logger.Info("GPU telemetry off", "reason", reason)
		return None(reason)
	}
	s := &nvmlSource{log: logger, lib: l, memV2: l.HasSymbol(memV2Symbol)}
	if v, err := l.DriverVersion(); err == nil {
		s.driver = v
	}
	n, _ := l.DeviceCount()
	logger.Info("GPU telemetry via NVML", "driver", s.driver, "devices", n, "memory_info_v2", s.memV2)
	return s
}

// initReason turns a failed Init into the sentence the dashboard shows.
func initReason(err error) string {
	var ne *nvmlError
	if errors.As(err, &ne) {
		switch ne.Code {
		case codeLibraryNotFound:
			return "NVML unavailable: libnvidia-ml.so.1 not found"
		case codeDriverNotLoaded:
			return "NVML unavailable: NVIDIA driver not loaded"
		case codeNoPermission:
			return "NVML unavailable: no permission to open the GPU"
		}
	}
	return "NVML unavailable: " + err.Error()
}

func (s *nvmlSource) Sample() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.lib == nil {
		return Snapshot{Reason: "NVML closed", Sampled: now}
	}
	snap := Snapshot{Available: true, Driver: s.driver, Sampled: now}
	var errs []string
	n, err := s.lib.DeviceCount()
	if err != nil {
		errs = append(errs, err.Error())
	}
	for i := 0; i < n; i++ {
		d, derrs := s.readDevice(i)
		errs = append(errs, derrs...)
		if d != nil {
			snap.Devices = append(snap.Devices, *d)
		}
	}
	snap.Err = strings.Join(errs, "; ")
	if snap.Err != s.lastErr {
		if snap.Err != "" {
			s.log.Warn("GPU reading incomplete", "err", snap.Err)
		} else {
			s.log.Info("GPU reading complete again")
		}
		s.lastErr = snap.Err
	}
	return snap
}

// readDevice reads device i; a device whose handle or memory cannot be read
// is left out (nil), other gaps are filled with "unknown" values. The errors
// name the device.
func (s *nvmlSource) readDevice(i int) (*Device, []string) {
	var errs []string
	fail := func(err error) { errs = append(errs, fmt.Sprintf("GPU %d: %v", i, err)) }
	h, err := s.lib.Device(i)
	if err != nil {
		fail(err)
		return nil, errs
	}
	d := Device{Index: i, Util: -1}
	if d.Name, err = h.Name(); err != nil {
		fail(err)
	}
	if d.UUID, err = h.UUID(); err != nil && !hasCode(err, codeNotSupported) {
		fail(err)
	}
	if d.MemUsed, d.MemTotal, err = s.memory(h); err != nil {
		fail(err)
		return nil, errs
	}
	if u, err := h.Utilization(); err == nil {
		d.Util = int(u)
	} else if !hasCode(err, codeNotSupported) {
		fail(err)
	}
	for _, list := range []struct {
		kind string
		get  func() ([]procInfo, error)
	}{{"C", h.ComputeProcesses}, {"G", h.GraphicsProcesses}} {
		ps, err := list.get()
		if err != nil {
			if !hasCode(err, codeNotSupported) {
				fail(err)
			}
			continue
		}
		d.Processes = mergeProcesses(d.Processes, ps, list.kind)
	}
	return &d, errs
}

// memory reads used/total memory, preferring v2 (which, like current
// nvidia-smi, does not count driver-reserved memory as used). If the driver
// refuses v2 once, v1 is used from then on.
func (s *nvmlSource) memory(h device) (used, total uint64, err error) {
	if s.memV2 {
		used, total, err = h.MemoryInfoV2()
		if err == nil {
			return used, total, nil
		}
		s.log.Info("GPU memory info v2 refused, using v1", "err", err)
		s.memV2 = false
	}
	return h.MemoryInfo()
}

// mergeProcesses adds ps (of kind "C" or "G") to out; a PID already listed
// becomes "C+G" and keeps the first known memory figure.
func mergeProcesses(out []Process, ps []procInfo, kind string) []Process {
next:
	for _, p := range ps {
		known := p.UsedMem != valueNotAvailable
		mem := p.UsedMem
		if !known {
			mem = 0
		}
		for i := range out {
			if out[i].PID == int(p.PID) {
				out[i].Kind = "C+G"
				if !out[i].MemKnown && known {
					out[i].MemUsed, out[i].MemKnown = mem, true
				}
				continue next
			}
		}
		out = append(out, Process{PID: int(p.PID), MemUsed: mem, MemKnown: known, Kind: kind})
	}
	return out
}

// Close shuts NVML down once; later readings report Available=false.
func (s *nvmlSource) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lib == nil {
		return
	}
	if err := s.lib.Shutdown(); err != nil {
		s.log.Warn("NVML shutdown", "err", err)
	}
	s.lib = nil
}
