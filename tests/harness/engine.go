package harness

import (
	"context"
	"fmt"
	"testing"
	"time"

	"kvdock/core/engine"
	"kvdock/core/rpc/client"
	"kvdock/settings"
)

// EngineConfig is an in-process engine of sizeMiB on a free port with its
// own segment name and 16-token chunks.
func EngineConfig(t testing.TB, sizeMiB int) settings.Config {
	t.Helper()
	cfg := settings.Default()
	cfg.Server.Port = FreePort(t)
	cfg.Server.ChunkSize = 16
	cfg.L1.SizeGB = float64(sizeMiB) / 1024
	cfg.L1.Prefault = false
	name := UniqueName("relengine")
	cfg.Server.ShmName = &name
	return cfg
}

// StartEngine starts an in-process engine on cfg, stopped when the test
// ends.
func StartEngine(t testing.TB, cfg settings.Config) *engine.Engine {
	t.Helper()
	e := engine.New(cfg, engine.Options{})
	if err := e.Start(context.Background()); err != nil {
		t.Fatalf("engine start: %v", err)
	}
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	return e
}

// DialPort connects a nongpu-v1 Go client to an engine's port on
// 127.0.0.1, timeout a call.
func DialPort(t testing.TB, port int, timeout time.Duration) *client.Client {
	t.Helper()
	return dial(t, fmt.Sprintf("tcp://127.0.0.1:%d", port), "nongpu-v1", timeout)
}
