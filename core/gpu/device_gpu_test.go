//go:build gpu

// This file is the check against a real NVIDIA driver. It is compiled only
// with -tags gpu (scripts/gpu-check.sh), so plain `go test` in CI neither runs
// nor skips it; where it is compiled it fails when no GPU can be read.

package gpu

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"
)

func TestDeviceNVML(t *testing.T) {
	src := NewNVML(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	defer src.Close()
	s := src.Sample()
	if !s.Available {
		t.Fatalf("NVML not available: %s", s.Reason)
	}
	if len(s.Devices) == 0 {
		t.Fatalf("no devices (err %q)", s.Err)
	}
	if s.Err != "" {
		t.Errorf("reading errors: %s", s.Err)
	}
	t.Logf("driver %s, memory info v2: %v", s.Driver, src.(*nvmlSource).memV2)
	for _, d := range s.Devices {
		t.Logf("GPU %d %q %s: %d/%d MiB, util %d%%, %d processes %+v",
			d.Index, d.Name, d.UUID, d.MemUsed>>20, d.MemTotal>>20, d.Util, len(d.Processes), d.Processes)
		if d.Name == "" || d.MemTotal == 0 || d.MemUsed > d.MemTotal {
			t.Errorf("GPU %d: implausible reading %+v", d.Index, d)
		}
		if d.Util < -1 || d.Util > 100 {
			t.Errorf("GPU %d: utilisation %d", d.Index, d.Util)
		}
	}
}

// The Sampler over the real source, under -race: readings arrive and Close
// after Run leaves the source unavailable without touching NVML.
func TestDeviceSampler(t *testing.T) {
	src := NewNVML(nil)
	s := NewSampler(src)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx, 10*time.Millisecond); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	var first time.Time
	for {
		l := s.Latest()
		if !l.Sampled.IsZero() && !l.Available {
			t.Fatalf("NVML not available: %s", l.Reason)
		}
		if l.Available && first.IsZero() {
			first = l.Sampled
		}
		if !first.IsZero() && l.Sampled.After(first) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no second reading within 10s; latest %+v", l)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	src.Close()
	if l := src.Sample(); l.Available || l.Reason != "NVML closed" {
		t.Fatalf("sample after Close = %+v", l)
	}
}
