package settings_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"kvdock/assets"
	"kvdock/settings"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func flags(t *testing.T, args ...string) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("kvdock", pflag.ContinueOnError)
	settings.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	return fs
}

func mustLoad(t *testing.T, opts settings.LoadOptions) *settings.Loaded {
	t.Helper()
	l, err := settings.Load(opts)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return l
}

func problems(t *testing.T, err error) []settings.Problem {
	t.Helper()
	var ve *settings.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("want *ValidationError, got %T: %v", err, err)
	}
	return ve.Problems
}

func TestLoadDefaultsWhenToldNothing(t *testing.T) {
	l := mustLoad(t, settings.LoadOptions{})
	if !reflect.DeepEqual(l.Config, settings.Default()) {
		t.Fatalf("config = %+v, want defaults", l.Config)
	}
	if l.File != "" {
		t.Fatalf("File = %q, want none", l.File)
	}
	for _, k := range settings.KeyNames() {
		if s := l.Sources[k]; s.Kind != settings.SourceDefault || s.String() != "default" {
			t.Errorf("source of %s = %v, want default", k, s)
		}
	}
}

func TestLayersOverrideInOrder(t *testing.T) {
	file := writeFile(t, `
server:
  port: 6001
  host: filehost
l1:
  size_gb: 2.5
eviction:
  policy: noop
http:
  token: from-file
ui:
  refresh: 2s
`)
	type want struct {
		key, val string
		kind     settings.SourceKind
		detail   string
	}
	cases := []struct {
		name    string
		environ []string
		args    []string
		want    []want
	}{
		{name: "file over defaults", want: []want{
			{"server.port", "6001", settings.SourceFile, file + ":3"},
			{"server.host", "filehost", settings.SourceFile, file + ":4"},
			{"l1.size_gb", "2.5", settings.SourceFile, file + ":6"},
			{"eviction.policy", "noop", settings.SourceFile, file + ":8"},
			{"ui.refresh", "2s", settings.SourceFile, file + ":12"},
			{"server.chunk_size", "256", settings.SourceDefault, ""},
		}},
		{name: "env over file", environ: []string{"KVDOCK_PORT=7001", "KVDOCK_L1_SIZE_GB=3", "KVDOCK_EVICTION_POLICY=LRU", "KVDOCK_HTTP_TOKEN=from-env", "HOME=/nonexistent"},
			want: []want{
				{"server.port", "7001", settings.SourceEnv, "KVDOCK_PORT"},
				{"l1.size_gb", "3", settings.SourceEnv, "KVDOCK_L1_SIZE_GB"},
				{"eviction.policy", "LRU", settings.SourceEnv, "KVDOCK_EVICTION_POLICY"},
				{"http.token", "from-env", settings.SourceEnv, "KVDOCK_HTTP_TOKEN"},
				{"server.host", "filehost", settings.SourceFile, file + ":4"},
			}},
		{name: "flags over env", environ: []string{"KVDOCK_PORT=7001", "KVDOCK_L1_SIZE_GB=3", "KVDOCK_HTTP_TOKEN=from-env"},
			args: []string{"--port", "8001", "--l1-size-gb=4", "--http-token", "from-flag", "--refresh", "250ms"},
			want: []want{
				{"server.port", "8001", settings.SourceFlag, "--port"},
				{"l1.size_gb", "4", settings.SourceFlag, "--l1-size-gb"},
				{"http.token", "from-flag", settings.SourceFlag, "--http-token"},
				{"ui.refresh", "250ms", settings.SourceFlag, "--refresh"},
				{"eviction.policy", "noop", settings.SourceFile, file + ":8"},
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := mustLoad(t, settings.LoadOptions{ConfigPath: file, Environ: tc.environ, Flags: flags(t, tc.args...)})
			for _, w := range tc.want {
				got, err := settings.Get(l.Config, w.key)
				if err != nil {
					t.Fatal(err)
				}
				if got != w.val {
					t.Errorf("%s = %q, want %q", w.key, got, w.val)
				}
				if s := l.Sources[w.key]; s.Kind != w.kind || s.Detail != w.detail {
					t.Errorf("source of %s = %+v, want %v %q", w.key, s, w.kind, w.detail)
				}
			}
		})
	}
}

func TestUnsetFlagDoesNotOverrideFile(t *testing.T) {
	file := writeFile(t, "server:\n  port: 6002\nl1:\n  prefault: false\n")
	// --host given, --port and --l1-prefault not: their flag defaults (5555,
	// true) must not win over the file.
	l := mustLoad(t, settings.LoadOptions{ConfigPath: file, Flags: flags(t, "--host", "0.0.0.0")})
	if l.Config.Server.Port != 6002 || l.Config.L1.Prefault {
		t.Fatalf("port=%d prefault=%v, want the file's 6002/false", l.Config.Server.Port, l.Config.L1.Prefault)
	}
	if l.Config.Server.Host != "0.0.0.0" {
		t.Fatalf("host = %q, want the flag's", l.Config.Server.Host)
	}
}

func TestShmNameTriState(t *testing.T) {
	named := writeFile(t, "server:\n  shm_name: /mypool\n")
	cases := []struct {
		name    string
		file    string
		environ []string
		args    []string
		want    *string
		source  string
	}{
		{name: "absent is auto", want: nil, source: "default"},
		{name: "file empty", file: "server:\n  shm_name: \"\"\n", want: ptr(""), source: ":2"},
		{name: "env set but empty", environ: []string{"KVDOCK_SHM_NAME="}, want: ptr(""), source: "KVDOCK_SHM_NAME"},
		{name: "flag empty", args: []string{"--shm-name", ""}, want: ptr(""), source: "--shm-name"},
		{name: "flag empty with =", args: []string{"--shm-name="}, want: ptr(""), source: "--shm-name"},
		{name: "file null is auto", file: "server:\n  shm_name: ~\n", want: nil, source: ":2"},
		{name: "env empty over file name", file: "@named", environ: []string{"KVDOCK_SHM_NAME="}, want: ptr(""), source: "KVDOCK_SHM_NAME"},
		{name: "name", args: []string{"--shm-name", "pool1"}, want: ptr("pool1"), source: "--shm-name"},
		{name: "file name", file: "@named", want: ptr("/mypool"), source: ":2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := settings.LoadOptions{Environ: tc.environ, Flags: flags(t, tc.args...)}
			switch {
			case tc.file == "@named":
				opts.ConfigPath = named
			case tc.file != "":
				opts.ConfigPath = writeFile(t, tc.file)
			}
			l := mustLoad(t, opts)
			got := l.Config.Server.ShmName
			if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Fatalf("shm_name = %s, want %s", show(got), show(tc.want))
			}
			if s := l.Sources["server.shm_name"].String(); !strings.HasSuffix(s, tc.source) {
				t.Fatalf("source = %q, want suffix %q", s, tc.source)
			}
		})
	}
}

func ptr(s string) *string { return &s }

func show(p *string) string {
	if p == nil {
		return "nil"
	}
	return `"` + *p + `"`
}

func TestValidationListsEveryProblemWithItsSource(t *testing.T) {
	file := writeFile(t, "server:\n  port: 70000\n  protocol: nongpu-v9\nlog:\n  level: loud\n")
	_, err := settings.Load(settings.LoadOptions{
		ConfigPath: file,
		Environ:    []string{"KVDOCK_L1_SIZE_GB=-2", "KVDOCK_REFRESH=10ms"},
		Flags:      flags(t, "--eviction-ratio", "1.5", "--hash-algorithm", "md5", "--transfer-mode", "gpu", "--l1-align-bytes", "3000"),
	})
	got := problems(t, err)
	want := []string{
		"server.port = 70000 (from " + file + ":2): must be in 1..65535",
		`server.protocol = "nongpu-v9" (from ` + file + ":3): accepted: nongpu-v1, nongpu-v2, engine-driven, engine-driven-v2-early, engine-driven-v2, rpc-messages, auto",
		"log.level = \"loud\" (from " + file + ":5): accepted: debug, info, warn, error",
		"l1.size_gb = -2 (from KVDOCK_L1_SIZE_GB): must be > 0",
		"ui.refresh = 10ms (from KVDOCK_REFRESH): must be a duration >= 100ms",
		"eviction.ratio = 1.5 (from --eviction-ratio): must be in (0, 1]",
		`server.hash_algorithm = "md5" (from --hash-algorithm): only "blake3" is supported`,
		`server.transfer_mode = "gpu" (from --transfer-mode): CUDA IPC transfer is not served by kvdock; run LMCache's own server for CUDA workers`,
		"l1.align_bytes = 3000 (from --l1-align-bytes): must be a power of two >= 1",
	}
	if len(got) != len(want) {
		t.Errorf("got %d problems, want %d:\n%v", len(got), len(want), err)
	}
	msg := err.Error()
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("error lacks %q:\n%s", w, msg)
		}
	}
}

func TestValidateRules(t *testing.T) {
	cases := []struct {
		key, value string
		ok         bool
	}{
		{"server.port", "0", false}, {"server.port", "65535", true},
		{"http.port", "0", true}, {"http.port", "65536", false},
		{"server.chunk_size", "0", false},
		{"server.max_workers", "0", false}, {"server.max_gpu_workers", "0", true}, {"server.max_cpu_workers", "-1", false},
		{"server.hash_algorithm", "sha256", false},
		{"server.transfer_mode", "gpu", false}, {"server.transfer_mode", "non_gpu", true},
		{"server.protocol", "engine-driven", true}, {"server.protocol", "nongpu-v3", false},
		{"server.protocol", "auto", true}, {"server.protocol", "rpc-messages", true},
		{"server.protocol_auto_default", "engine-driven", true}, {"server.protocol_auto_default", "auto", false},
		{"server.max_message_bytes", "1048575", false}, {"server.max_message_bytes", "1048576", true},
		{"server.max_instances", "0", false}, {"server.max_instances", "1", true}, {"server.max_instances", "1048577", false},
		{"server.worker_reap_timeout_seconds", "0", true}, {"server.worker_reap_timeout_seconds", "0.5", false},
		{"server.worker_reap_timeout_seconds", "-1", false}, {"server.worker_reap_timeout_seconds", "30", true},
		{"server.worker_registration_grace_seconds", "119", false}, {"server.worker_registration_grace_seconds", "120", true},
		{"server.worker_idle_seconds", "0", true}, {"server.worker_idle_seconds", "-1", false}, {"server.worker_idle_seconds", "604801", false},
		{"server.shm_name", "", true}, {"server.shm_name", "/pool_1.a-b", true}, {"server.shm_name", "a/b", false},
		{"server.shm_name", "/", false}, {"server.shm_name", "..", false}, {"server.shm_name", strings.Repeat("a", 201), false},
		{"server.shm_name", settings.AutoText, true}, {"server.host", "", false},
		{"l1.size_gb", "0", false}, {"l1.size_gb", "0.25", true}, {"l1.size_gb", "2e6", false},
		{"l1.align_bytes", "1", true}, {"l1.align_bytes", "0", false}, {"l1.align_bytes", "64", true},
		{"l1.write_ttl_seconds", "0", false}, {"l1.read_ttl_seconds", "1", true},
		{"eviction.policy", "lru", true}, {"eviction.policy", "fifo", false}, {"eviction.policy", "noop", true},
		{"eviction.trigger_watermark", "0", false}, {"eviction.trigger_watermark", "1", true}, {"eviction.ratio", "1.01", false},
		{"log.level", "warn", true}, {"log.level", "trace", false},
		{"log.format", "json", true}, {"log.format", "xml", false},
		{"ui.refresh", "99ms", false}, {"ui.refresh", "100ms", true},
	}
	for _, tc := range cases {
		c := settings.Default()
		if err := settings.Set(&c, tc.key, tc.value); err != nil {
			t.Fatalf("Set %s=%q: %v", tc.key, tc.value, err)
		}
		err := settings.Validate(c, map[string]settings.Source{tc.key: {Kind: settings.SourceDashboard}})
		if (err == nil) != tc.ok {
			t.Errorf("%s = %q: err = %v, want ok=%v", tc.key, tc.value, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), tc.key+" = ") || err != nil && !strings.Contains(err.Error(), "(from dashboard)") {
			t.Errorf("%s: error does not name key and source: %v", tc.key, err)
		}
	}
	if err := settings.Validate(settings.Default(), nil); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}

func TestUnknownFileKeysNameKeyAndFile(t *testing.T) {
	file := writeFile(t, "server:\n  port: 5556\nl1:\n  sise_gb: 2\ncache:\n  x: 1\n")
	_, err := settings.Load(settings.LoadOptions{ConfigPath: file})
	got := problems(t, err)
	if len(got) != 2 {
		t.Fatalf("want 2 problems, got %v", err)
	}
	msg := err.Error()
	for _, w := range []string{"l1.sise_gb (from " + file + ":4): unknown key; l1 accepts: size_gb", "cache (from " + file + ":5): unknown group"} {
		if !strings.Contains(msg, w) {
			t.Errorf("error lacks %q:\n%s", w, msg)
		}
	}
}

func TestMisshapenFile(t *testing.T) {
	cases := map[string]string{
		"list at top":       "- a\n- b\n",
		"group not mapping": "server: 5\n",
		"value is a list":   "server:\n  port: [1, 2]\n",
		"key twice":         "server:\n  port: 1\n  port: 2\n",
		"merge key":         "base: &b\n  port: 1\nserver:\n  <<: *b\n",
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			file := writeFile(t, body)
			_, err := settings.Load(settings.LoadOptions{ConfigPath: file})
			for _, p := range problems(t, err) {
				if !strings.HasPrefix(p.Source.String(), file+":") {
					t.Errorf("problem %q does not name the file line", p)
				}
			}
		})
	}
}

func TestInvalidYAMLGivesLine(t *testing.T) {
	file := writeFile(t, "server:\n  port: 1\n  host: [unclosed\nl1:\n")
	_, err := settings.Load(settings.LoadOptions{ConfigPath: file})
	if err == nil || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "line ") {
		t.Fatalf("err = %v, want the file and a line", err)
	}
}

func TestWrongTypesNameKeyAndSource(t *testing.T) {
	file := writeFile(t, "server:\n  port: abc\nui:\n  refresh: 5\n  headless: maybe\n")
	_, err := settings.Load(settings.LoadOptions{ConfigPath: file, Environ: []string{"KVDOCK_CHUNK_SIZE=12x", "KVDOCK_L1_SIZE_GB=NaN"}})
	got := problems(t, err)
	want := []string{
		`server.port = "abc" (from ` + file + ":2): must be an integer",
		"ui.refresh = 5 (from " + file + ":4): must be a duration with a unit",
		`ui.headless = "maybe" (from ` + file + ":5): must be true or false",
		`server.chunk_size = "12x" (from KVDOCK_CHUNK_SIZE): must be an integer`,
		`l1.size_gb = "NaN" (from KVDOCK_L1_SIZE_GB): must be a finite number`,
	}
	if len(got) != len(want) {
		t.Errorf("got %d problems, want %d: %v", len(got), len(want), err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
}

func TestNegativeSizeFlagNamesFlag(t *testing.T) {
	_, err := settings.Load(settings.LoadOptions{Flags: flags(t, "--l1-size-gb", "-1")})
	if err == nil || !strings.Contains(err.Error(), "l1.size_gb = -1 (from --l1-size-gb): must be > 0") {
		t.Fatalf("err = %v", err)
	}
}

func TestNegatableFlags(t *testing.T) {
	file := writeFile(t, "l1:\n  use_lazy: true\n")
	l := mustLoad(t, settings.LoadOptions{ConfigPath: file, Flags: flags(t, "--no-l1-use-lazy", "--no-l1-prefault")})
	if l.Config.L1.UseLazy || l.Config.L1.Prefault {
		t.Fatalf("use_lazy=%v prefault=%v, want both false", l.Config.L1.UseLazy, l.Config.L1.Prefault)
	}
	if s := l.Sources["l1.use_lazy"].String(); s != "--no-l1-use-lazy" {
		t.Fatalf("source = %q", s)
	}
	_, err := settings.Load(settings.LoadOptions{Flags: flags(t, "--l1-use-lazy", "--no-l1-use-lazy")})
	if err == nil || !strings.Contains(err.Error(), "conflicts with") {
		t.Fatalf("both spellings: err = %v", err)
	}
}

func TestConfigPathResolution(t *testing.T) {
	xdg := t.TempDir()
	xdgFile := filepath.Join(xdg, "kvdock", "config.yaml")
	if err := os.MkdirAll(filepath.Dir(xdgFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(xdgFile, []byte("server:\n  port: 6100\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	envFile := writeFile(t, "server:\n  port: 6200\n")
	flagFile := writeFile(t, "server:\n  port: 6300\n")
	home := t.TempDir()
	homeFile := filepath.Join(home, ".config", "kvdock", "config.yaml")
	if err := os.MkdirAll(filepath.Dir(homeFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(homeFile, []byte("server:\n  port: 6400\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		environ []string
		args    []string
		port    int
		file    string
	}{
		{"xdg default", []string{"XDG_CONFIG_HOME=" + xdg, "HOME=" + home}, nil, 6100, xdgFile},
		{"home default", []string{"HOME=" + home}, nil, 6400, homeFile},
		{"no default file", []string{"HOME=" + t.TempDir()}, nil, 5555, ""},
		{"env path", []string{"XDG_CONFIG_HOME=" + xdg, "KVDOCK_CONFIG=" + envFile}, nil, 6200, envFile},
		{"flag path", []string{"KVDOCK_CONFIG=" + envFile}, []string{"--config", flagFile}, 6300, flagFile},
		{"empty flag means none", []string{"XDG_CONFIG_HOME=" + xdg}, []string{"--config="}, 5555, ""},
		{"empty env means none", []string{"XDG_CONFIG_HOME=" + xdg, "KVDOCK_CONFIG="}, nil, 5555, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := mustLoad(t, settings.LoadOptions{Environ: tc.environ, Flags: flags(t, tc.args...)})
			if l.Config.Server.Port != tc.port || l.File != tc.file {
				t.Fatalf("port=%d file=%q, want %d %q", l.Config.Server.Port, l.File, tc.port, tc.file)
			}
		})
	}
	_, err := settings.Load(settings.LoadOptions{Environ: []string{"KVDOCK_CONFIG=/nonexistent/k.yaml"}})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/k.yaml (from KVDOCK_CONFIG)") {
		t.Fatalf("missing explicit file: err = %v", err)
	}
}

func TestUnknownEnvVarWarns(t *testing.T) {
	l := mustLoad(t, settings.LoadOptions{Environ: []string{"KVDOCK_L1_SIZE=2", "KVDOCK_CONFIG=", "OTHER=1"}})
	if len(l.Warnings) != 1 || !strings.Contains(l.Warnings[0], "KVDOCK_L1_SIZE") {
		t.Fatalf("warnings = %q", l.Warnings)
	}
}

func TestEmbeddedDefaultConfigLoadsAsDefault(t *testing.T) {
	file := writeFile(t, string(assets.DefaultConfig()))
	l := mustLoad(t, settings.LoadOptions{ConfigPath: file})
	if !reflect.DeepEqual(l.Config, settings.Default()) {
		t.Fatalf("embedded config = %+v\nwant %+v", l.Config, settings.Default())
	}
	for _, k := range settings.KeyNames() {
		kind := l.Sources[k].Kind
		if k == "server.shm_name" {
			if kind != settings.SourceDefault {
				t.Errorf("shm_name must be commented out (auto) in the embedded file")
			}
			continue
		}
		if kind != settings.SourceFile {
			t.Errorf("embedded file does not set %s", k)
		}
	}
	if !strings.Contains(string(assets.DefaultConfig()), "# shm_name:") {
		t.Errorf("embedded file does not show shm_name commented out")
	}
}

func TestRenderRoundTrips(t *testing.T) {
	c := settings.Default()
	for key, val := range map[string]string{
		"server.host": "yes", "server.shm_name": "", "http.token": "a: b # c", "log.file": "/var/log/kv dock.log",
		"l1.size_gb": "0.125", "ui.refresh": "1m30s", "l1.use_lazy": "true", "eviction.ratio": "0.3333333333333333",
	} {
		if err := settings.Set(&c, key, val); err != nil {
			t.Fatal(err)
		}
	}
	for _, cfg := range []settings.Config{settings.Default(), c} {
		out := settings.Render(cfg, nil)
		l := mustLoad(t, settings.LoadOptions{ConfigPath: writeFile(t, string(out))})
		if !reflect.DeepEqual(l.Config, cfg) {
			t.Fatalf("round trip of\n%s\ngave %+v\nwant %+v", out, l.Config, cfg)
		}
	}
	src := map[string]settings.Source{"server.port": {Kind: settings.SourceEnv, Detail: "KVDOCK_PORT"}}
	out := string(settings.Render(settings.Default(), src))
	for _, w := range []string{"  port: 5555  # from KVDOCK_PORT\n", "  host: localhost  # default\n", "  # shm_name: not set"} {
		if !strings.Contains(out, w) {
			t.Errorf("render lacks %q:\n%s", w, out)
		}
	}
}

func TestKeysGetSet(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	settings.RegisterFlags(fs)
	keys := settings.Keys()
	if len(keys) != len(settings.KeyNames()) || len(keys) != 58 {
		t.Fatalf("%d keys", len(keys))
	}
	def := settings.Default()
	for _, k := range keys {
		f := fs.Lookup(k.Flag)
		if f == nil {
			t.Fatalf("no flag --%s for %s", k.Flag, k.Key)
		}
		if !strings.Contains(f.Usage, k.Env) || k.Help == "" {
			t.Errorf("--%s help %q does not name %s", k.Flag, f.Usage, k.Env)
		}
		if k.NoFlag != "" && fs.Lookup(k.NoFlag) == nil {
			t.Errorf("no flag --%s", k.NoFlag)
		}
		got, err := settings.Get(def, k.Key)
		if err != nil || got != k.Default {
			t.Errorf("Get(%s) = %q, %v; Default %q", k.Key, got, err, k.Default)
		}
		c := def
		if k.ReadOnly {
			if err := settings.Set(&c, k.Key, got); err == nil {
				t.Errorf("Set(%s) of a read-only key accepted", k.Key)
			}
			continue
		}
		if err := settings.Set(&c, k.Key, got); err != nil || !reflect.DeepEqual(c, def) {
			t.Errorf("Set(Get(%s)) changed the config: %v", k.Key, err)
		}
	}
	c := settings.Default()
	if err := settings.Set(&c, "server.port", "http"); err == nil || !strings.Contains(err.Error(), "server.port") {
		t.Errorf("Set bad int: %v", err)
	}
	if err := settings.Set(&c, "nope.key", "1"); err == nil {
		t.Errorf("Set unknown key succeeded")
	}
	if err := settings.Set(&c, "server.shm_name", "p"); err != nil || *c.Server.ShmName != "p" {
		t.Fatalf("Set shm: %v", err)
	}
	if err := settings.Reset(&c, "server.shm_name"); err != nil || c.Server.ShmName != nil {
		t.Fatalf("Reset shm: %v %v", err, c.Server.ShmName)
	}
	if err := settings.Set(&c, "ui.refresh", "2s"); err != nil || c.UI.Refresh != 2*time.Second {
		t.Fatalf("Set refresh: %v", err)
	}
	if ki, ok := settings.LookupKey("l1.size_gb"); !ok || ki.Env != "KVDOCK_L1_SIZE_GB" || ki.Flag != "l1-size-gb" || ki.Class != settings.Rebuild || ki.Kind != "float" {
		t.Fatalf("LookupKey = %+v", ki)
	}
	if ki, _ := settings.LookupKey("eviction.policy"); ki.Env != "KVDOCK_EVICTION_POLICY" {
		t.Fatalf("env = %s", ki.Env)
	}
}

func TestFileStringsKeepTheirText(t *testing.T) {
	file := writeFile(t, "http:\n  token: 0x1F\n  host: 10.0\nserver:\n  shm_name: 007\n")
	l := mustLoad(t, settings.LoadOptions{ConfigPath: file})
	if l.Config.HTTP.Token != "0x1F" || l.Config.HTTP.Host != "10.0" || *l.Config.Server.ShmName != "007" {
		t.Fatalf("token=%q host=%q shm=%q", l.Config.HTTP.Token, l.Config.HTTP.Host, *l.Config.Server.ShmName)
	}
}
