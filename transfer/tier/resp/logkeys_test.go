package resp

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"kvdock/core/testkit/logbuf"
	"kvdock/core/testkit/redisserver"
	"kvdock/settings"
	"kvdock/transfer/tier"
)

// A tier opened by the set logs each attribute once: the set names it
// (tier=0 type=resp), the tier adds only its target (the lines read
// `tier=0 type=resp tier=resp`).
func TestTierLogLinesNameEachKeyOnce(t *testing.T) {
	s := redisserver.Start(t, redisserver.Options{})
	var buf logbuf.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	openers := map[string]tier.Opener{"resp": func(ctx context.Context, _ settings.Adapter, log *slog.Logger) (tier.Backend, error) {
		return Open(ctx, standaloneCfg(s), log)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bs, err := tier.OpenAll(ctx, []settings.Adapter{{Type: "resp"}}, openers, log)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		_ = b.Close()
	}
	out := buf.String()
	rep, err := logbuf.RepeatedKeys(out)
	if err != nil || len(rep) > 0 {
		t.Errorf("keys logged twice (%v):\n%s", err, strings.Join(rep, "\n"))
	}
	if !strings.Contains(out, `"msg":"resp tier connected","tier":0,"type":"resp","target":`) {
		t.Fatalf("want the connect line naming the tier, its type and target, got:\n%s", out)
	}
}
