package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestHelpListsTheFlagsPeopleStartWith: kvdock --help shows, besides the
// commands, the flags a first run needs, with the defaults of the settings.
func TestHelpListsTheFlagsPeopleStartWith(t *testing.T) {
	code, out, stderr := kvdock(t, nil, "--help")
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{"--config PATH", "--host ADDR", "--port N", "(default 5555)", "--protocol NAME", "auto",
		"--shm-name NAME", "--l1-size-gb GIB", "--eviction-policy NAME", "--l2-adapter JSON", "--http-port N",
		"(default 8080; 0 = off)", "--headless", "--log-level LEVEL", `Run "kvdock serve --help" for all`} {
		if !strings.Contains(out, want) {
			t.Errorf("kvdock --help lacks %q:\n%s", want, out)
		}
	}
	// Every flag it names is one serve takes.
	_, serveHelp, _ := kvdock(t, nil, "serve", "--help")
	for _, m := range regexp.MustCompile(`(?m)^  (--[a-z0-9-]+) `).FindAllStringSubmatch(out, -1) {
		if !regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(m[1]) + `[ \[]`).MatchString(serveHelp) {
			t.Errorf("kvdock --help names %s, which serve does not take", m[1])
		}
	}
}

// TestVersionStampedByTheTaskfileBuild: the Taskfile's build line stamps
// the version, commit and date itself, so a binary built with
// GOFLAGS=-buildvcs=false (no toolchain VCS data) still says them; a plain
// go build without VCS data says it is unstamped rather than a bare "dev".
func TestVersionStampedByTheTaskfileBuild(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	taskfile, err := os.ReadFile(filepath.Join(root, "Taskfile.yml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s+- (go build -ldflags "([^"]*)" -o \{\{\.BIN\}\} \.)$`).FindSubmatch(taskfile)
	if m == nil {
		t.Fatal("no `go build -ldflags \"…\" -o {{.BIN}} .` line in Taskfile.yml")
	}
	flags := strings.NewReplacer("{{.GIT_VERSION}}", "v9.8.7-3-gabc", "{{.GIT_REVISION}}", "abc0123456789", "{{.GIT_DATE}}", "2026-12-01T10:00:00+00:00").Replace(string(m[2]))
	bin := filepath.Join(t.TempDir(), "kvdock")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-ldflags", flags, "-o", bin, ".")
	build.Dir = root
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -ldflags %q: %v\n%s", flags, err, out)
	}
	var out bytes.Buffer
	v := exec.CommandContext(ctx, bin, "--version")
	v.Stdout = &out
	if err := v.Run(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kvdock v9.8.7-3-gabc\n", "revision  abc0123456789\n", "date      2026-12-01T10:00:00+00:00\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stamped --version lacks %q:\n%s", want, out.String())
		}
	}
	// The harness's binary is a plain go build: stamped by the toolchain
	// (dev-<commit>) or, without VCS data, saying it is unstamped.
	_, plain, _ := kvdock(t, nil, "--version")
	if strings.HasPrefix(plain, "kvdock dev\n") || strings.HasPrefix(plain, "kvdock dev ") && !strings.Contains(plain, "no version stamped") {
		t.Errorf("a plain build's --version does not say what it is:\n%s", plain)
	}
}

// TestEnumValuesAnyCase: an enumerated value is taken in any case, from a
// flag or the environment, and shown in its one canonical form; a value
// that is none of them names the choices.
func TestEnumValuesAnyCase(t *testing.T) {
	code, out, stderr := kvdock(t, []string{"KVDOCK_LOG_LEVEL=WARN"}, "config", "show", "--eviction-policy", "lru", "--protocol", "Engine-Driven")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{"policy: LRU\n", "level: warn\n", "protocol: engine-driven\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("config show lacks %q:\n%s", want, out)
		}
	}
	code, _, stderr = kvdock(t, nil, "--headless", "--eviction-policy", "fifo")
	if code != 2 || !strings.Contains(stderr, `eviction.policy = "fifo" (from --eviction-policy): accepted: LRU, prefix, noop (any case)`) {
		t.Fatalf("fifo: exit %d, stderr %q", code, stderr)
	}
}
