package settings_test

import (
	"strings"
	"testing"

	"kvdock/settings"
)

func TestKVEventsValidation(t *testing.T) {
	if err := settings.Validate(settings.Default(), nil); err != nil {
		t.Fatalf("default (events off): %v", err)
	}
	ok := settings.Default()
	ok.KVEvents.Endpoint, ok.KVEvents.ReplayEndpoint = "tcp://127.0.0.1:5557", "tcp://*:5558"
	if err := settings.Validate(ok, nil); err != nil {
		t.Fatalf("valid endpoints: %v", err)
	}
	for _, tc := range []struct {
		set  func(c *settings.Config)
		want string
	}{
		{func(c *settings.Config) { c.KVEvents.Endpoint = "127.0.0.1:5557" }, "kv_events.endpoint"},
		{func(c *settings.Config) { c.KVEvents.Endpoint = "tcp://host:99999" }, "kv_events.endpoint"},
		{func(c *settings.Config) { c.KVEvents.Endpoint = "tcp://host:5x" }, "kv_events.endpoint"},
		{func(c *settings.Config) { c.KVEvents.ReplayEndpoint = "tcp://h:1" }, "needs kv_events.endpoint"},
		{func(c *settings.Config) {
			c.KVEvents.Endpoint, c.KVEvents.ReplayEndpoint = "tcp://h:1", "tcp://h:1"
		}, "must differ"},
		{func(c *settings.Config) { c.KVEvents.Encoding = "json" }, "kv_events.encoding"},
		{func(c *settings.Config) { c.KVEvents.ReplayFormat = "old" }, "kv_events.replay_format"},
		{func(c *settings.Config) { c.KVEvents.Pod = "a@b" }, "kv_events.pod"},
		{func(c *settings.Config) { c.KVEvents.BufferSteps = 0 }, "kv_events.buffer_steps"},
		{func(c *settings.Config) { c.KVEvents.MediumL1 = "" }, "kv_events.medium_l1"},
		{func(c *settings.Config) { c.KVEvents.BlockSize = 100 }, "kv_events.block_size"},
		{func(c *settings.Config) { c.KVEvents.BlockSize = -1 }, "kv_events.block_size"},
	} {
		c := settings.Default()
		tc.set(&c)
		if err := settings.Validate(c, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %q", c.KVEvents, err, tc.want)
		}
	}
}

// The poll log's size: LMCache's flag, the env named as the other
// kv_events settings are, 0 = off, bounded.
func TestKVEventLogSize(t *testing.T) {
	if n := settings.Default().KVEvents.LogSize; n != 32768 {
		t.Fatalf("default log size %d", n)
	}
	l := mustLoad(t, settings.LoadOptions{Environ: []string{"KVDOCK_KV_EVENTS_LOG_SIZE=0"}})
	if l.Config.KVEvents.LogSize != 0 {
		t.Fatalf("env: %d", l.Config.KVEvents.LogSize)
	}
	l = mustLoad(t, settings.LoadOptions{Environ: []string{"KVDOCK_KV_EVENTS_LOG_SIZE=0"},
		Flags: flags(t, "--kv-event-log-size", "100")})
	if l.Config.KVEvents.LogSize != 100 {
		t.Fatalf("flag over env: %d", l.Config.KVEvents.LogSize)
	}
	for _, bad := range []int{-1, 1<<20 + 1} {
		c := settings.Default()
		c.KVEvents.LogSize = bad
		if err := settings.Validate(c, nil); err == nil || !strings.Contains(err.Error(), "kv_events.log_size") {
			t.Errorf("log size %d: %v", bad, err)
		}
	}
}
