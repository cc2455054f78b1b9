package dashboard

import (
	"strings"
	"testing"
	"time"

	"kvdock/core/engine"
)

func TestHeaderSaysTheLastRestart(t *testing.T) {
	if got := restartText(engine.Restart{}); got != "" {
		t.Fatalf("no record: %q", got)
	}
	got := restartText(engine.Restart{Adopted: true, Objects: 48, Bytes: 3 << 20, Contexts: 1, Gap: 17 * time.Millisecond})
	for _, want := range []string{"restarted", "48 objects", "3.0 MiB", "1 ctx", "gap 17 ms"} {
		if !strings.Contains(got, want) {
			t.Errorf("adopted: %q lacks %q", got, want)
		}
	}
	if got := restartText(engine.Restart{Reason: "kept pool not adopted: size"}); !strings.Contains(got, "nothing adopted") {
		t.Fatalf("refused: %q", got)
	}
	// One rule for the figures, said with the restart (engine.StatsRule).
	for _, c := range []struct {
		r    engine.Restart
		want string
	}{
		{engine.Restart{Adopted: true, StatsCarried: true}, "stats kept"},
		{engine.Restart{Adopted: true}, "stats restarted"},
		{engine.Restart{Reason: "kept pool not adopted: size", StatsCarried: true}, "stats kept"},
		{engine.Restart{Reason: "restart record refused"}, "stats restarted"},
	} {
		if got := restartText(c.r); !strings.Contains(got, c.want) {
			t.Errorf("%+v: %q lacks %q", c.r, got, c.want)
		}
	}
}

// The tokens-saved headline names its window when the figures began less
// than an hour ago (a start that carried nothing, a reset), and says "the
// last hour" once they span it, as after a restart that carried them.
func TestHeaderTokensWindowSaysWhenFiguresBegan(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	pc := &programContext{}
	for _, c := range []struct {
		since, reset time.Time
		want         string
	}{
		{t0.Add(-12 * time.Minute), time.Time{}, "the start"},
		{t0.Add(-5 * time.Minute), t0.Add(-5 * time.Minute), "the reset"},
		{t0.Add(-3 * time.Hour), time.Time{}, ""},
	} {
		pc.snap = engine.Snapshot{Taken: t0, Stats: engine.StatsWindow{Since: c.since, ResetAt: c.reset}}
		if what, _ := pc.statsBegan(); what != c.want {
			t.Errorf("since %v reset %v: %q, want %q", c.since, c.reset, what, c.want)
		}
	}
}
