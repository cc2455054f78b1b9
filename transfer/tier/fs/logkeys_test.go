package fs

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"kvdock/core/testkit/logbuf"
	"kvdock/settings"
	"kvdock/transfer/tier"
)

// A tier opened by the set logs each attribute once: the set names it
// (tier=0 type=fs), the tier adds only its path (the lines read
// `tier=0 type=fs tier=fs` and named base_path twice on close).
func TestTierLogLinesNameEachKeyOnce(t *testing.T) {
	var buf logbuf.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	base := filepath.Join(t.TempDir(), "l2")
	openers := map[string]tier.Opener{"fs": func(_ context.Context, a settings.Adapter, log *slog.Logger) (tier.Backend, error) {
		return Open(FSConfig{BasePath: a.FS.BasePath, CapacityBytes: 64 << 20}, log)
	}}
	bs, err := tier.OpenAll(context.Background(), []settings.Adapter{{Type: "fs", FS: settings.FSAdapter{BasePath: base}}}, openers, log)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
	}
	out := buf.String()
	rep, err := logbuf.RepeatedKeys(out)
	if err != nil || len(rep) > 0 {
		t.Errorf("keys logged twice (%v):\n%s", err, strings.Join(rep, "\n"))
	}
	if !strings.Contains(out, `"msg":"fs tier open","tier":0,"type":"fs","base_path":`) || !strings.Contains(out, `"msg":"fs tier closed","tier":0,"type":"fs","base_path":`) {
		t.Fatalf("want the open and close lines naming the tier, its type and path, got:\n%s", out)
	}
}
