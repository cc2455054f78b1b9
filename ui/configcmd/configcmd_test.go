package configcmd_test

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"kvdock/assets"
	"kvdock/settings"
	"kvdock/ui/configcmd"
)

func run(environ []string, args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = configcmd.Run(args, &out, &errb, environ)
	return code, out.String(), errb.String()
}

func TestInit(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a", "b", "kvdock.yaml")
	code, out, errs := run(nil, "init", path)
	if code != 0 || !strings.Contains(out, path) {
		t.Fatalf("init: %d %q %q", code, out, errs)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	checkInitFile(t, path, got)
	if err := os.WriteFile(path, []byte("mine\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errs = run(nil, "init", path)
	if code != 1 || !strings.Contains(errs, "already exists") || !strings.Contains(errs, "--force") {
		t.Fatalf("init over a file: %d %q", code, errs)
	}
	if got, _ := os.ReadFile(path); string(got) != "mine\n" {
		t.Fatalf("existing file overwritten without --force")
	}
	if code, _, errs = run(nil, "init", "--force", path); code != 0 {
		t.Fatalf("init --force: %d %q", code, errs)
	}
	if again, _ := os.ReadFile(path); !bytes.Equal(again, got) {
		t.Fatalf("--force did not overwrite")
	}
}

// checkInitFile: the file init wrote sets nothing (every value reads as a
// default, so a later release's new default is not pinned by it), names
// each key commented out at its default with its flag and environment
// variable, and each line uncommented sets exactly that key to its default.
func checkInitFile(t *testing.T, path string, body []byte) {
	t.Helper()
	l, err := settings.Load(settings.LoadOptions{ConfigPath: path})
	if err != nil {
		t.Fatalf("the written file does not load: %v\n%s", err, body)
	}
	for k, src := range l.Sources {
		if src.Kind != settings.SourceDefault {
			t.Errorf("%s comes from %s, want the default", k, src)
		}
	}
	for _, ki := range settings.Keys() {
		_, name, _ := strings.Cut(ki.Key, ".")
		var line string
		for _, l := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(l, "  # "+name+": ") && strings.Contains(l, "# --"+ki.Flag) {
				line = l
			}
		}
		if line == "" || !strings.HasSuffix(line, ", "+ki.Env) {
			t.Errorf("no commented line for %s with --%s and %s in:\n%s", ki.Key, ki.Flag, ki.Env, body)
			continue
		}
		if ki.NoFlag != "" && !strings.Contains(line, "--"+ki.NoFlag) {
			t.Errorf("%s: %q lacks --%s", ki.Key, line, ki.NoFlag)
		}
		one := filepath.Join(t.TempDir(), "one.yaml")
		if err := os.WriteFile(one, []byte(strings.Replace(string(body), line, "  "+strings.TrimPrefix(line, "  # "), 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		l, err := settings.Load(settings.LoadOptions{ConfigPath: one})
		if err != nil {
			t.Errorf("%s uncommented: %v", ki.Key, err)
			continue
		}
		if !reflect.DeepEqual(l.Config, settings.Default()) {
			t.Errorf("%s uncommented changes the settings", ki.Key)
		}
		for k, src := range l.Sources {
			if fromFile := src.Kind == settings.SourceFile; fromFile != (k == ki.Key) {
				t.Errorf("%s uncommented: %s comes from %s", ki.Key, k, src)
			}
		}
	}
}

func TestInitDefaultPath(t *testing.T) {
	xdg := t.TempDir()
	code, out, errs := run([]string{"XDG_CONFIG_HOME=" + xdg}, "init")
	want := filepath.Join(xdg, "kvdock", "config.yaml")
	if code != 0 || !strings.Contains(out, want) {
		t.Fatalf("init: %d %q %q", code, out, errs)
	}
	if _, err := os.Stat(want); err != nil {
		t.Fatal(err)
	}
	// kvdock now finds it by default: show names it.
	code, out, _ = run([]string{"XDG_CONFIG_HOME=" + xdg}, "show")
	if code != 0 || !strings.Contains(out, want) {
		t.Fatalf("show after init: %d %q", code, out)
	}
	if code, _, errs = run(nil, "init"); code != 2 || !strings.Contains(errs, "PATH") {
		t.Fatalf("init without HOME: %d %q", code, errs)
	}
}

func TestShowSourcesFromFileEnvAndFlag(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte("server:\n  chunk_size: 512\nl1:\n  size_gb: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := run([]string{"KVDOCK_EVICTION_POLICY=noop", "KVDOCK_L1_SIZE_GB=3"},
		"show", "--sources", "--config", file, "--port", "6000", "--shm-name", "")
	if code != 0 {
		t.Fatalf("show: %d %q", code, errs)
	}
	for _, w := range []string{
		"  chunk_size: 512  # from " + file + ":2\n",
		"  size_gb: 3  # from KVDOCK_L1_SIZE_GB\n",
		"  policy: noop  # from KVDOCK_EVICTION_POLICY\n",
		"  port: 6000  # from --port\n",
		"  shm_name: \"\"  # from --shm-name\n",
		"  host: localhost  # default\n",
		"file " + file + " (from --config)",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("show lacks %q:\n%s", w, out)
		}
	}
	// Without --sources the output is a settings file that loads to the same config.
	code, plain, _ := run([]string{"KVDOCK_EVICTION_POLICY=noop"}, "show", "--config", file, "--port", "6000")
	if code != 0 || strings.Contains(plain, "# from") {
		t.Fatalf("plain show: %d\n%s", code, plain)
	}
	again := filepath.Join(t.TempDir(), "again.yaml")
	if err := os.WriteFile(again, []byte(plain), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := settings.Load(settings.LoadOptions{ConfigPath: again})
	if err != nil || l.Config.Server.Port != 6000 || l.Config.Eviction.Policy != "noop" || l.Config.Server.ChunkSize != 512 {
		t.Fatalf("shown config does not load back: %v %+v", err, l)
	}
}

func TestShowInvalidNamesSources(t *testing.T) {
	code, out, errs := run([]string{"KVDOCK_EVICTION_RATIO=2"}, "show", "--l1-size-gb", "-1")
	if code != 2 || out != "" {
		t.Fatalf("show invalid: %d %q", code, out)
	}
	for _, w := range []string{"l1.size_gb = -1 (from --l1-size-gb): must be > 0", "eviction.ratio = 2 (from KVDOCK_EVICTION_RATIO)"} {
		if !strings.Contains(errs, w) {
			t.Errorf("stderr lacks %q:\n%s", w, errs)
		}
	}
	code, _, errs = run(nil, "show", "--port", "abc")
	if code != 2 || !strings.Contains(errs, "--port") {
		t.Fatalf("bad flag type: %d %q", code, errs)
	}
	code, _, errs = run([]string{"KVDOCK_CONFIG=/nonexistent/x.yaml"}, "show")
	if code != 1 || !strings.Contains(errs, "KVDOCK_CONFIG") {
		t.Fatalf("missing file: %d %q", code, errs)
	}
}

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, assets.DefaultConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := run(nil, "check", good)
	if code != 0 || !strings.Contains(out, "ok") {
		t.Fatalf("check good: %d %q %q", code, out, errs)
	}
	// The environment and the flags apply as they do to serve.
	code, out, errs = run([]string{"KVDOCK_PORT=0"}, "check", good)
	if code != 2 || out != "" || !strings.Contains(errs, "server.port = 0 (from KVDOCK_PORT)") {
		t.Fatalf("check good under KVDOCK_PORT=0: %d %q %q", code, out, errs)
	}
	code, out, errs = run([]string{"KVDOCK_PORT=0"}, "check", "--port", "5555", good)
	if code != 0 || !strings.Contains(out, "ok") {
		t.Fatalf("check good, --port over KVDOCK_PORT=0: %d %q %q", code, out, errs)
	}
	code, _, errs = run(nil, "check", "--eviction-ratio", "2", good)
	if code != 2 || !strings.Contains(errs, "eviction.ratio = 2 (from --eviction-ratio)") {
		t.Fatalf("check good --eviction-ratio 2: %d %q", code, errs)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("server:\n  port: 0\n  hash_algorithm: md5\nl1:\n  size: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs = run(nil, "check", bad)
	if code != 2 || out != "" {
		t.Fatalf("check bad: %d %q", code, out)
	}
	for _, w := range []string{bad + ":2", bad + ":3", "l1.size (from " + bad + ":5): unknown key", "3 problems"} {
		if !strings.Contains(errs, w) {
			t.Errorf("stderr lacks %q:\n%s", w, errs)
		}
	}
	broken := filepath.Join(dir, "broken.yaml")
	if err := os.WriteFile(broken, []byte("server:\n  port: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errs = run(nil, "check", broken); code != 2 || !strings.Contains(errs, "line") {
		t.Fatalf("check broken: %d %q", code, errs)
	}
	if code, _, _ = run(nil, "check", filepath.Join(dir, "missing.yaml")); code != 1 {
		t.Fatalf("check missing: %d", code)
	}
	if code, _, _ = run(nil, "check"); code != 2 {
		t.Fatalf("check without PATH: %d", code)
	}
}

func TestHelpAndUsage(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"init", "--help"}, {"show", "-h"}, {"check", "--help"}} {
		code, out, _ := run(nil, args...)
		if code != 0 || !strings.Contains(out, "Usage: kvdock config") {
			t.Errorf("%q: %d %q", args, code, out)
		}
	}
	if _, out, _ := run(nil, "show", "--help"); !strings.Contains(out, "--l1-size-gb") || !strings.Contains(out, "KVDOCK_L1_SIZE_GB") {
		t.Errorf("show help lacks setting flags:\n%s", out)
	}
	for _, args := range [][]string{{}, {"frob"}, {"show", "extra"}, {"init", "--bogus"}} {
		if code, _, errs := run(nil, args...); code != 2 || errs == "" {
			t.Errorf("%q: %d %q", args, code, errs)
		}
	}
}

func TestShowRedactsToken(t *testing.T) {
	var out, errb bytes.Buffer
	code := configcmd.Run([]string{"show", "--config", ""}, &out, &errb, []string{"KVDOCK_HTTP_TOKEN=s3cret"})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if strings.Contains(out.String(), "s3cret") || !strings.Contains(out.String(), "redacted") {
		t.Fatalf("token shown:\n%s", out.String())
	}
}

func TestShowAdaptersLoadBackAndRedactCredentials(t *testing.T) {
	const pass = "v3ry-s3cret-pw"
	code, out, errs := run([]string{"LMCACHE_RESP_PASSWORD=" + pass}, "show", "--sources", "--config", "",
		"--l2-adapter", `{"type": "fs", "base_path": "/data/l2"}`,
		"--l2-adapter", `{"type": "resp", "host": "redis", "port": 6379, "username": "kv"}`)
	if code != 0 {
		t.Fatalf("show: %d %q", code, errs)
	}
	if strings.Contains(out, pass) || strings.Contains(out, `"kv"`) || !strings.Contains(out, settings.Redacted) ||
		!strings.Contains(out, "# from --l2-adapter") || !strings.Contains(out, `"base_path": "/data/l2"`) {
		t.Fatalf("show:\n%s", out)
	}

	// Without credentials the output loads back to the same adapters.
	code, plain, _ := run(nil, "show", "--config", "", "--l2-adapter", `{"type": "fs", "base_path": "/data/l2", "max_capacity_gb": 2.5}`)
	again := filepath.Join(t.TempDir(), "again.yaml")
	if err := os.WriteFile(again, []byte(plain), 0o600); code != 0 || err != nil {
		t.Fatalf("show: %d %v", code, err)
	}
	l, err := settings.Load(settings.LoadOptions{ConfigPath: again})
	if err != nil || len(l.Config.L2.Adapters) != 1 || l.Config.L2.Adapters[0].FS.MaxCapacityGB != 2.5 {
		t.Fatalf("shown adapters do not load back: %v\n%s", err, plain)
	}

	// A bad adapter exits 2 naming the flag and the field.
	code, _, errs = run(nil, "show", "--config", "", "--l2-adapter", `{"type": "fs", "base_path": "/x", "size": 1}`)
	if code != 2 || !strings.Contains(errs, "l2.adapters[0].size") || !strings.Contains(errs, "--l2-adapter[0]") {
		t.Fatalf("bad adapter: %d %q", code, errs)
	}
}
