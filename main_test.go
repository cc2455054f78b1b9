package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"

	"kvdock/core/engine"
	"kvdock/settings"
)

type countingWriter struct {
	mu sync.Mutex
	n  int64
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.n += int64(len(p))
	w.mu.Unlock()
	return len(p), nil
}

func (w *countingWriter) bytes() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// TestLoggerBoundsAFloodOfHugeErrors: the logger both faces use cuts peer
// strings and rate-limits, so 10,000 errors carrying an 8 MiB model name
// write a bounded log (the bug: +96 MiB of log per 8 MiB name).
func TestLoggerBoundsAFloodOfHugeErrors(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		w := &countingWriter{}
		logger, closeLog, err := newLogger(settings.LogConfig{Level: "info", Format: format}, new(slog.LevelVar), w)
		if err != nil {
			t.Fatal(err)
		}
		huge := strings.Repeat("M", 8<<20)
		bad := errors.New("register: model " + huge + " refused")
		const bound = 1 << 20
		for i := range 10000 {
			logger.With("component", "nongpu").Error("bad request", "model", huge, "err", bad)
			if w.bytes() > bound {
				t.Fatalf("%s: after %d errors the log holds %d bytes, bound %d", format, i+1, w.bytes(), bound)
			}
		}
		closeLog()
		t.Logf("%s: 10,000 errors with 8 MiB strings wrote %d bytes", format, w.bytes())
	}
}

// TestSIGHUPLogsNoSecret: a reload that changes http.token logs the change
// without either value.
func TestSIGHUPLogsNoSecret(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvdock.yaml")
	write := func(token string) {
		if err := os.WriteFile(path, []byte("http:\n  token: "+token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("old-s3cret-value")
	opts := settings.LoadOptions{ConfigPath: path}
	loaded, err := settings.Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(loaded.Config, engine.Options{Sources: loaded.Sources})
	write("new-s3cret-value")
	var buf bytes.Buffer
	reload(context.Background(), eng, opts, slog.New(slog.NewTextHandler(&buf, nil)))
	out := buf.String()
	if !strings.Contains(out, "http.token") || !strings.Contains(out, settings.Redacted) {
		t.Fatalf("the reload does not log the token change: %s", out)
	}
	if strings.Contains(out, "s3cret") {
		t.Fatalf("the reload logged a secret: %s", out)
	}
}

// TestSIGHUPNextStartKeysWarn: a reload that changes keys read once at start
// (the key table's next-start class) says they wait for a restart and does
// not log them as applied.
func TestSIGHUPNextStartKeysWarn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvdock.yaml")
	if err := os.WriteFile(path, []byte("log:\n  format: text\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := settings.LoadOptions{ConfigPath: path}
	loaded, err := settings.Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(loaded.Config, engine.Options{Sources: loaded.Sources})
	if err := os.WriteFile(path, []byte("log:\n  format: json\n  level: debug\nui:\n  headless: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	reload(context.Background(), eng, opts, slog.New(slog.NewTextHandler(&buf, nil)))
	var later, applied []string
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		switch {
		case strings.Contains(l, "takes effect when kvdock restarts"):
			later = append(later, l)
		case strings.Contains(l, "SIGHUP: applied"):
			applied = append(applied, l)
		}
	}
	if len(later) != 2 || !strings.Contains(strings.Join(later, "\n"), "key=log.format") || !strings.Contains(strings.Join(later, "\n"), "key=ui.headless") {
		t.Fatalf("next-start lines %q in:\n%s", later, buf.String())
	}
	if len(applied) != 1 || !strings.Contains(applied[0], "key=log.level") {
		t.Fatalf("applied lines %q in:\n%s", applied, buf.String())
	}
}

// TestVersionTextNamesTheCommit: with the build's own stamps (task build),
// the version says them; else with the toolchain's VCS stamps it says the
// revision, its date and whether the tree was modified; without either it
// says so and how to get them.
func TestVersionTextNamesTheCommit(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26", Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
		{Key: "vcs.time", Value: "2026-11-30T10:00:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}}
	out := versionText(stamps{}, bi)
	for _, want := range []string{"kvdock dev-0123456789ab\n", "revision  0123456789abcdef0123456789abcdef01234567\n",
		"date      2026-11-30T10:00:00Z\n", "modified  yes", "go        go1.26\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("version text lacks %q:\n%s", want, out)
		}
	}
	bi.Settings[2].Value = "false"
	if out := versionText(stamps{version: "v1.2.3"}, bi); !strings.Contains(out, "modified  no\n") || !strings.HasPrefix(out, "kvdock v1.2.3\n") {
		t.Errorf("clean tree:\n%s", out)
	}
	// -buildvcs=false: the build's stamps alone.
	noVCS := &debug.BuildInfo{GoVersion: "go1.26"}
	out = versionText(stamps{version: "365b08b1234a-dirty", revision: "365b08b1234abcdef", date: "2026-12-01T10:00:00+00:00"}, noVCS)
	if out != "kvdock 365b08b1234a-dirty\nrevision  365b08b1234abcdef\ndate      2026-12-01T10:00:00+00:00\ngo        go1.26\n" {
		t.Errorf("stamped build:\n%s", out)
	}
	out = versionText(stamps{}, noVCS)
	if !strings.HasPrefix(out, "kvdock dev (no version stamped: a plain go build; task build stamps one from git)\n") ||
		!strings.Contains(out, "revision  unknown: this binary carries no build stamps") {
		t.Errorf("no stamps:\n%s", out)
	}
}
