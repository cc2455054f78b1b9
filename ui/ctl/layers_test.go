package ctl_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"kvdock/ui/ctl"
)

// TestFlagErrorsArePrinted: a flag pflag refuses is printed with the usage
// line, exit 2 (pflag with ContinueOnError prints nothing by itself).
func TestFlagErrorsArePrinted(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--timeout", "1", "ping"}, []string{`invalid argument "1" for "--timeout"`, "usage: kvdock ctl"}},
		{[]string{"--port", "abc", "ping"}, []string{`invalid argument "abc" for "--port"`, "usage: kvdock ctl"}},
		{[]string{"--prot", "5591", "ping"}, []string{"unknown flag: --prot; did you mean --port or --protocol?", "usage: kvdock ctl"}},
		{[]string{"pnig"}, []string{`unknown command "pnig"; did you mean ping?`}},
		{[]string{"status", "--htp-port", "1"}, []string{"did you mean --http-port?", "usage: kvdock ctl status"}},
		{[]string{}, []string{"no command", "usage: kvdock ctl"}},
		{[]string{"bogus"}, []string{`unknown command "bogus"`, "usage: kvdock ctl"}},
		{[]string{"--json", "ping"}, []string{"--json applies only to status"}},
		{[]string{"status", "--http-port", "x"}, []string{`invalid argument "x"`, "usage: kvdock ctl status"}},
		{[]string{"status", "--bogus"}, []string{"unknown flag: --bogus", "usage: kvdock ctl status"}},
	} {
		code, out, errs := run(tc.args...)
		if code != 2 || out != "" {
			t.Errorf("%q: exit %d, stdout %q", tc.args, code, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(errs, w) {
				t.Errorf("%q: stderr lacks %q:\n%s", tc.args, w, errs)
			}
		}
	}
	// --help is not an error: it goes to stdout, exit 0.
	for _, args := range [][]string{{"--help"}, {"status", "--help"}} {
		if code, out, errs := run(args...); code != 0 || out == "" || errs != "" {
			t.Errorf("%q: exit %d, stdout %d bytes, stderr %q", args, code, len(out), errs)
		}
	}
}

// TestSettingsLayers: ctl finds the server as serve would: the settings
// file < KVDOCK_* < flags; problems with keys ctl does not read do not stop
// it, problems with its own keys do, naming their source.
func TestSettingsLayers(t *testing.T) {
	port, _ := serve(t)
	ps := strconv.Itoa(port)
	wrong := strconv.Itoa(statusFreePort(t)) // nothing listens there
	file := filepath.Join(t.TempDir(), "kvdock.yaml")
	if err := os.WriteFile(file, []byte("server:\n  port: "+ps+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := func(env []string, args ...string) {
		t.Helper()
		code, out, errs := runEnv(ctl.Env{Environ: env}, append(args, "--timeout", "2s", "ping")...)
		if code != 0 || out != "true\n" {
			t.Errorf("env %q args %q: exit %d, %q %q", env, args, code, out, errs)
		}
	}
	ok([]string{"KVDOCK_PORT=" + ps})
	ok(nil, "--config", file)
	ok([]string{"KVDOCK_CONFIG=" + file})
	ok([]string{"KVDOCK_PORT=" + wrong}, "--port", ps)                                // a flag beats the env
	ok([]string{"KVDOCK_CONFIG=" + file, "KVDOCK_EVICTION_RATIO=2", "KVDOCK_NOPE=1"}) // not ctl's keys

	code, _, errs := runEnv(ctl.Env{Environ: []string{"KVDOCK_PORT=abc"}}, "ping")
	if code != 2 || !strings.Contains(errs, "KVDOCK_PORT") {
		t.Errorf("KVDOCK_PORT=abc: exit %d, %q", code, errs)
	}
	code, _, errs = runEnv(ctl.Env{}, "--config", filepath.Join(t.TempDir(), "missing.yaml"), "ping")
	if code != 2 || !strings.Contains(errs, "missing.yaml") {
		t.Errorf("missing file: exit %d, %q", code, errs)
	}
	// A timeout names the address the layers chose.
	code, _, errs = runEnv(ctl.Env{Environ: []string{"KVDOCK_PORT=" + wrong}}, "--timeout", "300ms", "ping")
	if code != 1 || !strings.Contains(errs, "127.0.0.1:"+wrong) {
		t.Errorf("KVDOCK_PORT to nowhere: exit %d, %q", code, errs)
	}
}
