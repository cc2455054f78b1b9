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
}
