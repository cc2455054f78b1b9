package settings_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"kvdock/settings"
)

// FuzzLoadFile feeds arbitrary settings-file bytes to Load. Load must never
// panic; when it accepts a file, the config must pass Validate and survive a
// Render → Load round trip unchanged.
func FuzzLoadFile(f *testing.F) {
	f.Add([]byte("server:\n  port: 5556\n  shm_name: \"\"\nl1:\n  size_gb: 0.5\n"))
	f.Add([]byte("ui:\n  refresh: 250ms\neviction:\n  policy: noop\n"))
	f.Add([]byte("l2:\n  adapters:\n    - type: fs\n      base_path: /d\n      max_capacity_gb: 5\n    - {type: resp, cluster: true, startup_nodes: [\"a:1\"], ttl_seconds: 9, key_prefix: \"k:\"}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		path := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		l, err := settings.Load(settings.LoadOptions{ConfigPath: path})
		if err != nil {
			var ve *settings.ValidationError
			if errors.As(err, &ve) && len(ve.Problems) == 0 {
				t.Fatalf("ValidationError without problems")
			}
			return
		}
		if err := settings.Validate(l.Config, l.Sources); err != nil {
			t.Fatalf("Load accepted a config Validate rejects: %v", err)
		}
		again := filepath.Join(dir, "again.yaml")
		out := settings.Render(l.Config, l.Sources)
		if err := os.WriteFile(again, out, 0o600); err != nil {
			t.Fatal(err)
		}
		l2, err := settings.Load(settings.LoadOptions{ConfigPath: again})
		if err != nil {
			t.Fatalf("rendered config does not load: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(l.Config, l2.Config) {
			t.Fatalf("round trip changed the config:\n%+v\n%+v\n%s", l.Config, l2.Config, out)
		}
	})
}
