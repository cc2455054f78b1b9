package logcap

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"kvdock/core/testkit/fakeclock"
)

// countingWriter counts bytes and keeps only the tail of what was written.
type countingWriter struct {
	mu   sync.Mutex
	n    int64
	tail bytes.Buffer
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n += int64(len(p))
	if w.tail.Len() > 1<<20 {
		w.tail.Reset()
	}
	w.tail.Write(p[:min(len(p), 4096)])
	return len(p), nil
}

func (w *countingWriter) bytes() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

func TestTruncate(t *testing.T) {
	if got := Truncate("short", 512); got != "short" {
		t.Fatalf("short string changed: %q", got)
	}
	s := strings.Repeat("é", 300) // 600 bytes, 2-byte runes
	got := Truncate(s, 511)
	if !strings.HasSuffix(got, "…(600 bytes)") || !strings.HasPrefix(got, strings.Repeat("é", 255)+"…") {
		t.Fatalf("cut on a rune boundary with the length: %q", got)
	}
}

// TestFloodOfHugeErrorsIsBounded: 10,000 error lines each carrying an 8 MiB
// peer string (as a value, inside an error and in the message) write a
// bounded number of bytes, and the line after the flood says how many were
// suppressed.
func TestFloodOfHugeErrorsIsBounded(t *testing.T) {
	huge := strings.Repeat("m", 8<<20)
	w := &countingWriter{}
	clk := fakeclock.At(time.Unix(1e9, 0))
	log := slog.New(NewHandler(slog.NewTextHandler(w, nil), Options{Now: clk.Now})).With("component", "nongpu")
	const bound = 256 << 10
	msg, err := "register refused: model "+huge, errors.New("bad model "+huge)
	for i := range 10000 {
		log.Error(msg, "model", huge, "err", err)
		if w.bytes() > bound {
			t.Fatalf("after %d lines the log holds %d bytes, bound %d", i+1, w.bytes(), bound)
		}
	}
	flood := w.bytes()
	clk.Advance(time.Second)
	log.Error("next")
	out := w.tail.String()
	if !strings.Contains(out, "9900 similar log lines suppressed") || !strings.Contains(out, "suppressed=9900") {
		t.Fatalf("no suppression line after the flood: %q", out[max(0, len(out)-600):])
	}
	t.Logf("10,000 errors × 8 MiB strings: %d bytes of log (unbounded: %d)", flood, int64(10000)*3*(8<<20))
}

func TestLevelsDoNotSilenceEachOther(t *testing.T) {
	var buf bytes.Buffer
	clk := fakeclock.At(time.Unix(1e9, 0))
	log := slog.New(NewHandler(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}), Options{Now: clk.Now}))
	for range 1000 {
		log.Debug("request")
	}
	log.Info("SIGHUP: applied")
	for range 1000 {
		log.Info("registered")
	}
	log.Error("the one that matters")
	if !strings.Contains(buf.String(), "the one that matters") || !strings.Contains(buf.String(), "SIGHUP: applied") {
		t.Fatalf("a flood at one level silenced another:\n%s", buf.String()[max(0, buf.Len()-500):])
	}
}

func TestAttrsGroupsAndStringersAreCut(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewHandler(slog.NewJSONHandler(&buf, nil), Options{MaxString: 16}))
	long := strings.Repeat("x", 100)
	log.With("peer", long).WithGroup("g").Warn("m", slog.Group("inner", "v", long), "b", []byte(long), "s", stringer(long))
	out := buf.String()
	if strings.Contains(out, strings.Repeat("x", 17)) {
		t.Fatalf("a string longer than the limit got through: %s", out)
	}
	if strings.Count(out, "…(100 bytes)") != 4 {
		t.Fatalf("want 4 cut values with their length: %s", out)
	}
}

type stringer string

func (s stringer) String() string { return string(s) }

func TestConcurrentLoggersShareTheLimit(t *testing.T) {
	w := &countingWriter{}
	clk := fakeclock.At(time.Unix(1e9, 0))
	base := slog.New(NewHandler(slog.NewTextHandler(w, nil), Options{Now: clk.Now}))
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := base.With("worker", i)
			for range 1000 {
				l.ErrorContext(context.Background(), "x")
			}
		}()
	}
	wg.Wait()
	lines := strings.Count(w.tail.String(), "\n")
	if lines != DefaultBurst {
		t.Fatalf("8 loggers × 1000 errors at one instant wrote %d lines, want the burst %d", lines, DefaultBurst)
	}
}
