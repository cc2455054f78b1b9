// Package gpu is kvdock's GPU telemetry: a Source takes one reading of the
// NVIDIA GPUs (memory used/total, utilisation, per-process memory) and a
// Sampler keeps the latest reading fresh on its own goroutine, so the
// dashboard and the HTTP API never wait on the driver.
//
// Sources:
//   - NewNVML reads through NVML (github.com/NVIDIA/go-nvml, cgo). The library
//     libnvidia-ml.so.1 is opened at run time, so kvdock builds and runs on
//     machines without a GPU; there NewNVML reports Available=false with the
//     reason. Without cgo it reports the same way.
//   - None reports "no GPU telemetry" with a fixed reason.
//   - Fake returns whatever snapshot a test sets.
//
// The NVML adapter talks to NVML through a narrow internal interface, so its
// unit tests run against a scripted library on any machine. The check against
// a real driver lives in device_gpu_test.go behind the build tag "gpu": it is
// not compiled by a plain `go test` (so CI, which has no GPU, neither runs nor
// skips it) and it fails, never skips, when the driver is missing. Run it on
// a GPU machine with scripts/gpu-check.sh.
package gpu

import (
	"slices"
	"sync"
	"time"
)

// Device is one GPU at the moment of a reading.
type Device struct {
	Index     int    // NVML index
	Name      string // e.g. "NVIDIA H200"
	UUID      string // "GPU-…"; empty when NVML cannot tell
	MemUsed   uint64 // bytes
	MemTotal  uint64 // bytes
	Util      int    // GPU utilisation in percent, -1 when unsupported or unreadable
	Processes []Process
}

// Process is one process holding memory on a device.
type Process struct {
	PID      int
	MemUsed  uint64 // bytes; 0 with MemKnown=false when NVML reports N/A
	MemKnown bool
	Kind     string // "C" (compute), "G" (graphics) or "C+G", as nvidia-smi prints it
}

// Snapshot is one reading of all devices. Treat it as read-only; the Sampler
// hands out copies.
type Snapshot struct {
	Available bool   // telemetry works; Devices is meaningful
	Reason    string // why not, when !Available
	Driver    string // driver version, e.g. "550.54.15"
	Devices   []Device
	Sampled   time.Time // when the reading was taken; zero before the first one
	Err       string    // the reading's errors, if any (partial data stays in Devices)
}

// Clone returns a deep copy of s.
func (s Snapshot) Clone() Snapshot {
	s.Devices = slices.Clone(s.Devices)
	for i := range s.Devices {
		s.Devices[i].Processes = slices.Clone(s.Devices[i].Processes)
	}
	return s
}

// Source takes readings. Sample and Close may be called from different
// goroutines; Sample after Close reports Available=false.
type Source interface {
	Sample() Snapshot
	Close()
}

// None returns a Source that always reports Available=false with reason.
func None(reason string) Source { return noneSource(reason) }

type noneSource string

func (r noneSource) Sample() Snapshot {
	return Snapshot{Reason: string(r), Sampled: time.Now()}
}

func (noneSource) Close() {}

// Fake is a Source that returns the snapshot last given to Set, exactly as
// given (Sampled included), for tests of the dashboard and the API. The zero
// value is ready and reports an empty, unavailable snapshot.
type Fake struct {
	mu      sync.Mutex
	snap    Snapshot
	samples int
	closed  bool
}

// NewFake returns a Fake that reports s.
func NewFake(s Snapshot) *Fake {
	f := &Fake{}
	f.Set(s)
	return f
}

// Set changes what the next Sample returns.
func (f *Fake) Set(s Snapshot) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snap = s.Clone()
}

// Sample returns a copy of the snapshot last set.
func (f *Fake) Sample() Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.samples++
	return f.snap.Clone()
}

// Close records that the source was closed.
func (f *Fake) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
}

// Samples is how many times Sample was called.
func (f *Fake) Samples() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.samples
}

// Closed reports whether Close was called.
func (f *Fake) Closed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}
