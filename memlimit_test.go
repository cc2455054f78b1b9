package main

import (
	"io"
	"log/slog"
	"runtime/debug"
	"testing"

	"kvdock/settings"
)

// TestApplyMemoryLimit: 0 derives the Go heap's limit from the in-flight
// pickle bytes (64 MiB + 2 x), an explicit setting wins over everything, and
// a GOMEMLIMIT in the environment is kept when the setting is 0.
func TestApplyMemoryLimit(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sc := settings.Default().Server
	if sc.MaxInflightPickleMB != 256 || sc.GoMemoryLimitMB != 0 {
		t.Fatalf("defaults: in-flight %d MiB, limit %d MiB", sc.MaxInflightPickleMB, sc.GoMemoryLimitMB)
	}
	cases := []struct {
		name     string
		limitMB  int
		inflight int
		env      string
		want     int64
	}{
		{"derived", 0, 256, "", (64 + 512) << 20},
		{"derived, small in-flight", 0, 16, "", (64 + 32) << 20},
		{"explicit", 900, 256, "", 900 << 20},
		{"explicit beats GOMEMLIMIT", 300, 256, "1GiB", 300 << 20},
	}
	for _, c := range cases {
		sc.GoMemoryLimitMB, sc.MaxInflightPickleMB = c.limitMB, c.inflight
		if got := applyMemoryLimit(sc, c.env, log); got != c.want {
			t.Errorf("%s: applied %d, want %d", c.name, got, c.want)
		}
		if got := debug.SetMemoryLimit(-1); got != c.want {
			t.Errorf("%s: runtime limit %d, want %d", c.name, got, c.want)
		}
	}
	debug.SetMemoryLimit(123 << 20)
	sc.GoMemoryLimitMB = 0
	if got := applyMemoryLimit(sc, "123MiB", log); got != 123<<20 || debug.SetMemoryLimit(-1) != 123<<20 {
		t.Errorf("GOMEMLIMIT set, setting 0: limit %d, want the environment's kept", got)
	}
}
