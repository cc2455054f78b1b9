package settings_test

import (
	"strings"
	"testing"

	"kvdock/settings"
)

// An enumerated value is taken in any case, from every layer and from Set,
// and kept in one canonical form: what Get, Render and Diff see.
func TestEnumsTakeAnyCaseKeepOneForm(t *testing.T) {
	file := writeFile(t, "l2:\n  store_policy: Write-Behind\nlog:\n  format: JSON\n")
	l := mustLoad(t, settings.LoadOptions{
		ConfigPath: file,
		Environ:    []string{"KVDOCK_EVICTION_POLICY=lru", "KVDOCK_PROTOCOL=AUTO"},
		Flags:      flags(t, "--log-level", "WARN", "--protocol-auto-default", "RPC-Messages", "--hash-algorithm", "BLAKE3"),
	})
	want := map[string]string{
		"eviction.policy": "LRU", "server.protocol": "auto", "l2.store_policy": "write-behind", "log.format": "json",
		"log.level": "warn", "server.protocol_auto_default": "rpc-messages", "server.hash_algorithm": "blake3",
	}
	for key, v := range want {
		if got, _ := settings.Get(l.Config, key); got != v {
			t.Errorf("%s = %q, want %q", key, got, v)
		}
	}
	rendered := string(settings.Render(l.Config, nil))
	for _, v := range []string{"policy: LRU", "store_policy: write-behind", "level: warn"} {
		if !strings.Contains(rendered, v) {
			t.Errorf("Render lacks %q:\n%s", v, rendered)
		}
	}
	def := settings.Default()
	c := def
	if err := settings.Set(&c, "eviction.policy", "PREFIX"); err != nil || c.Eviction.Policy != "prefix" {
		t.Errorf("Set PREFIX: %v, policy %q", err, c.Eviction.Policy)
	}
	if ch := settings.Diff(def, c); len(ch) != 0 {
		t.Errorf("PREFIX against the default prefix differs: %+v", ch)
	}
	// Not a choice in any case: refused, naming the canonical forms.
	_, err := settings.Load(settings.LoadOptions{Environ: []string{"KVDOCK_EVICTION_POLICY=fifo"}})
	if err == nil || !strings.Contains(err.Error(), `eviction.policy = "fifo" (from KVDOCK_EVICTION_POLICY): accepted: LRU, prefix, noop (any case)`) {
		t.Errorf("fifo: %v", err)
	}
	ki, _ := settings.LookupKey("eviction.policy")
	if strings.Join(ki.Choices, ",") != "LRU,prefix,noop" {
		t.Errorf("KeyInfo.Choices = %q", ki.Choices)
	}
}
