package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvdock/core/protocol"
	"kvdock/tests/harness"
	"kvdock/transfer/torchpickle"
)

// TestBadFlagsPrintTheErrorAndUsage: a flag error on any command is
// printed with one usage line on stderr, exit 2 (the bug: nothing printed,
// only the exit code; launched from a tmux pane, the pane just vanished).
func TestBadFlagsPrintTheErrorAndUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--prot", "5591"}, []string{"unknown flag: --prot", "usage: kvdock [serve]"}},
		{[]string{"--port", "abc"}, []string{`invalid argument "abc" for "--port"`, "usage: kvdock [serve]"}},
		{[]string{"serve", "--headless", "stray"}, []string{"unexpected arguments", "usage: kvdock [serve]"}},
		{[]string{"ctl", "--timeout", "1", "ping"}, []string{`invalid argument "1" for "--timeout"`, "usage: kvdock ctl"}},
		// A flag ctl does not know is answered with the ones it may mean.
		{[]string{"ctl", "--prot", "5591", "ping"}, []string{"unknown flag: --prot; did you mean --port or --protocol?", "usage: kvdock ctl"}},
		{[]string{"ctl", "status", "--htp-port", "8155"}, []string{"did you mean --http-port?", "usage: kvdock ctl status"}},
		{[]string{"config", "check", "--l1-size-g", "1", "f.yaml"}, []string{"did you mean --l1-size-gb?", "usage: kvdock config check"}},
		{[]string{"ctl", "--bogus", "ping"}, []string{"unknown flag: --bogus", "usage: kvdock ctl"}},
		{[]string{"config", "show", "--bogus"}, []string{"unknown flag: --bogus", "usage: kvdock config show"}},
		{[]string{"config", "init", "--bogus"}, []string{"unknown flag: --bogus", "usage: kvdock config init"}},
		{[]string{"config", "check", "--bogus"}, []string{"unknown flag: --bogus", "usage: kvdock config check"}},
		{[]string{"bench", "--bogus"}, []string{"unknown flag: --bogus", "kvdock bench --help"}},
		{[]string{"version", "--bogus"}, []string{"--bogus", "usage: kvdock version"}},
		{[]string{"help", "--bogus"}, []string{"--bogus", "usage: kvdock help"}},
		{[]string{"help", "serve", "extra"}, []string{"extra", "usage: kvdock help"}},
	} {
		code, out, stderr := kvdock(t, nil, tc.args...)
		if code != 2 || out != "" {
			t.Errorf("kvdock %q: exit %d, stdout %q", tc.args, code, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("kvdock %q: stderr lacks %q:\n%s", tc.args, w, stderr)
			}
		}
	}
}

// TestInvalidSettingsSaidOnce: one "invalid settings" heading, not
// "kvdock: invalid settings:" followed by "invalid settings (1 problem):".
func TestInvalidSettingsSaidOnce(t *testing.T) {
	code, _, stderr := kvdock(t, nil, "--headless", "--l1-size-gb", "-1")
	if code != 2 || strings.Count(stderr, "invalid settings") != 1 || !strings.HasPrefix(stderr, "kvdock: invalid settings (1 problem):") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
}

// TestUsageListsEveryCtlCommand: the top-level usage names ctl status.
func TestUsageListsEveryCtlCommand(t *testing.T) {
	_, out, _ := kvdock(t, nil, "help")
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "kvdock ctl") {
			line = l
		}
	}
	for _, cmd := range []string{"ping", "noop", "chunk-size", "clear", "end-session", "status"} {
		if !strings.Contains(line, cmd) {
			t.Errorf("the ctl line of the usage lacks %s: %q", cmd, line)
		}
	}
}

// TestCtlReadsTheSettingsLayers: ctl finds the server where serve's
// settings put it: KVDOCK_PORT, the settings file, flags (the bug:
// KVDOCK_PORT=5591 kvdock ctl ping went to 5555).
func TestCtlReadsTheSettingsLayers(t *testing.T) {
	srv := harness.Start(t)
	port, httpPort := strconv.Itoa(srv.Port), strconv.Itoa(srv.HTTPPort)
	file := filepath.Join(t.TempDir(), "kvdock.yaml")
	if err := os.WriteFile(file, []byte("server:\n  port: "+port+"\nhttp:\n  port: "+httpPort+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env  []string
		args []string
	}{
		{[]string{"KVDOCK_PORT=" + port}, []string{"ctl", "ping"}},
		{nil, []string{"ctl", "--config", file, "ping"}},
		{[]string{"KVDOCK_CONFIG=" + file}, []string{"ctl", "chunk-size"}},
		{[]string{"KVDOCK_PORT=1"}, []string{"ctl", "--port", port, "noop"}},
		{[]string{"KVDOCK_HTTP_PORT=" + httpPort}, []string{"ctl", "status"}},
		{[]string{"KVDOCK_CONFIG=" + file}, []string{"ctl", "status", "--json"}},
	} {
		code, out, stderr := kvdock(t, tc.env, append(tc.args, "--timeout", "5s")...)
		if code != 0 || out == "" {
			t.Errorf("%q %q: exit %d, stdout %q, stderr %q", tc.env, tc.args, code, out, stderr)
		}
	}
	// Where the layers point at nothing, the error names that address.
	code, _, stderr := kvdock(t, []string{"KVDOCK_PORT=" + strconv.Itoa(harness.FreePort(t))}, "ctl", "--timeout", "300ms", "ping")
	if code != 1 || !strings.Contains(stderr, "no answer from") {
		t.Errorf("KVDOCK_PORT to nowhere: exit %d, %q", code, stderr)
	}
}

// storePickle stores n chunks of 16 tokens through a pickle worker and
// returns the bytes stored.
func storePickle(t *testing.T, srv *harness.Server, n int) int64 {
	t.Helper()
	const layers, hidden, chunk = 2, 4, 16
	c := srv.Dial(t, srv.Protocol)
	call := func(name string, args ...any) {
		t.Helper()
		if _, err := c.Call(context.Background(), name, args...); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	call(protocol.RegisterKVCacheNonGPUContext, protocol.RegisterPayload{InstanceID: 7, ModelName: "m",
		WorldSize: 1, BlockSize: chunk, NumLayers: layers, HiddenDimSize: hidden, DtypeStr: "float16"})
	toks := make([]uint32, n*chunk)
	for i := range toks {
		toks[i] = uint32(1000 + i)
	}
	w := 0
	k := protocol.Key{ModelName: "m", WorldSize: 1, WorkerID: &w, TokenIDs: toks, Start: 0, End: len(toks), RequestID: "fill"}
	call(protocol.PrepareStore, k, int64(7))
	ts := make([]torchpickle.Tensor, n)
	per := 2 * layers * chunk * hidden * 2
	for i := range ts {
		ts[i] = torchpickle.Tensor{Dtype: "float16", Shape: []int{2, layers, chunk, hidden}, Data: bytes.Repeat([]byte{byte(i + 1)}, per)}
	}
	data, err := torchpickle.AppendEncode(nil, ts)
	if err != nil {
		t.Fatal(err)
	}
	call(protocol.CommitStore, k, int64(7), data)
	return int64(n * per)
}

// TestCtlClearConfirmsAndSaysWhatWent: without a terminal and without
// --yes, clear refuses at once and keeps the cache; with --yes it prints
// the objects and bytes cleared, and the server's events name ctl.
func TestCtlClearConfirmsAndSaysWhatWent(t *testing.T) {
	srv := harness.Start(t, "--shm-name", "", "--chunk-size", "16")
	stored := storePickle(t, srv, 3)
	env := []string{"KVDOCK_PORT=" + strconv.Itoa(srv.Port), "KVDOCK_HTTP_PORT=" + strconv.Itoa(srv.HTTPPort)}

	start := time.Now()
	code, out, stderr := kvdock(t, env, "ctl", "clear")
	if code != 2 || out != "" || !strings.Contains(stderr, "--yes") || time.Since(start) > 10*time.Second {
		t.Fatalf("clear without a terminal: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	code, out, stderr = kvdock(t, env, "ctl", "clear", "--yes")
	// The bytes are what the pool frees: each object's size rounded up to
	// the pool's alignment.
	var objects int
	var kib float64
	if n, err := fmt.Sscanf(out, "cleared %d objects (%f KiB)\n", &objects, &kib); code != 0 || n != 2 || err != nil ||
		objects != 3 || kib*1024 < float64(stored) {
		t.Fatalf("clear --yes: exit %d, stdout %q (want 3 objects, at least %d bytes), stderr %q", code, out, stored, stderr)
	}
	code, out, _ = kvdock(t, env, "ctl", "status", "--json")
	var st struct {
		Events []struct {
			Message string `json:"message"`
		} `json:"events"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("status --json: exit %d", code)
	}
	found := false
	for _, ev := range st.Events {
		found = found || strings.Contains(ev.Message, "cache cleared by kvdock ctl: 3 objects")
	}
	if !found && !strings.Contains(srv.Output(), "by=\"kvdock ctl\"") {
		t.Fatalf("neither the events nor the log say ctl cleared:\n%s\n%s", out, srv.Output())
	}
}

// TestExitLineSaysWhatRanHowLongAndWhereTheLogIs: on exit kvdock prints one
// line on stderr, after the log.
func TestExitLineSaysWhatRanHowLongAndWhereTheLogIs(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "kvdock.log")
	srv := harness.Start(t, "--log-file", logFile)
	srv.Stop(t) // SIGTERM
	out := srv.Output()
	want := "kvdock: headless on tcp://"
	if !strings.Contains(out, want) || !strings.Contains(out, "stopped by SIGTERM, exit 0; log: "+logFile) {
		t.Fatalf("no exit line %q…%q:\n%s", want, logFile, out)
	}
	if strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Fatalf("with the log in a file, stderr holds more than the exit line:\n%s", out)
	}
	// With the log on stderr, the line names it; with JSON logs it is a JSON record.
	srv = harness.Start(t)
	srv.Stop(t)
	if lines := strings.Split(strings.TrimSpace(srv.Output()), "\n"); !strings.HasSuffix(lines[len(lines)-1], "exit 0; log: stderr (above)") {
		t.Fatalf("last line %q", lines[len(lines)-1])
	}
	srv = harness.Start(t, "--log-format", "json")
	srv.Stop(t)
	for _, l := range strings.Split(strings.TrimSpace(srv.Output()), "\n") {
		if !json.Valid([]byte(l)) {
			t.Fatalf("a line of the JSON log is not JSON: %q", l)
		}
	}
	if !strings.Contains(srv.Output(), `"msg":"kvdock exited"`) {
		t.Fatalf("no exit record in the JSON log:\n%s", srv.Output())
	}
}

// TestSIGHUPLogsPlainValues: a reloaded string is logged as old=LRU, not
// old="\"LRU\"" (the handler quotes where it must; the diff's quotes came
// on top).
func TestSIGHUPLogsPlainValues(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kvdock.yaml")
	write := func(policy, format string) {
		if err := os.WriteFile(file, []byte("eviction:\n  policy: "+policy+"\nlog:\n  format: "+format+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("LRU", "text")
	srv := harness.Start(t, "--config", file)
	write("noop", "json")
	if err := syscall.Kill(srv.PID(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second) // bounds a failure only
	for time.Now().Before(deadline) && !strings.Contains(srv.Output(), "SIGHUP: takes effect") {
		time.Sleep(50 * time.Millisecond)
	}
	out := srv.Output()
	for _, want := range []string{"key=eviction.policy old=LRU new=noop", "key=log.format old=text new=json"} {
		if !strings.Contains(out, want) {
			t.Errorf("the SIGHUP log lacks %q:\n%s", want, out)
		}
	}
}
