package settings_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"kvdock/settings"
)

const (
	fsFlag   = `{"type": "fs", "base_path": "/data/l2"}`
	respFlag = `{"type": "resp", "host": "redis", "port": 6379}`
)

func TestL2AdapterFlagsKeepOrderAndTypes(t *testing.T) {
	l := mustLoad(t, settings.LoadOptions{Flags: flags(t,
		"--l2-adapter", respFlag, "--l2-adapter", fsFlag,
		"--l2-store-policy", "none", "--l2-prefetch-max-in-flight", "3",
		"--l2-prefetch-load-timeout", "0.5", "--l2-queue-bytes", "2097152")})
	want := []settings.Adapter{
		{Type: "resp", RESP: settings.RESPAdapter{Host: "redis", Port: 6379}},
		{Type: "fs", FS: settings.FSAdapter{BasePath: "/data/l2"}},
	}
	if !reflect.DeepEqual(l.Config.L2.Adapters, want) {
		t.Fatalf("adapters = %#v\nwant %#v", l.Config.L2.Adapters, want)
	}
	l2 := l.Config.L2
	if l2.StorePolicy != "none" || l2.PrefetchMaxInFlight != 3 || l2.LoadTimeoutSeconds != 0.5 || l2.QueueBytes != 2<<20 {
		t.Fatalf("l2 = %+v", l2)
	}
	if s := l.Sources[settings.KeyAdapters]; s.Kind != settings.SourceFlag || s.Detail != "--l2-adapter" {
		t.Fatalf("source = %+v", s)
	}
	if c := settings.Default().L2; c.Adapters != nil || c.StorePolicy != "write-behind" || c.PrefetchMaxInFlight != 8 {
		t.Fatalf("defaults = %+v", c)
	}
}

func TestL2AdapterSourcesLayer(t *testing.T) {
	file := writeFile(t, "l2:\n  adapters:\n    - type: fs\n      base_path: /file/l2\n      max_capacity_gb: 5\n    - type: resp\n      host: r\n      port: 1\n")
	env := []string{`KVDOCK_L2_ADAPTERS=[{"type": "fs", "base_path": "/env/l2"}]`}

	l := mustLoad(t, settings.LoadOptions{ConfigPath: file})
	want := []settings.Adapter{
		{Type: "fs", FS: settings.FSAdapter{BasePath: "/file/l2", MaxCapacityGB: 5}},
		{Type: "resp", RESP: settings.RESPAdapter{Host: "r", Port: 1}},
	}
	if !reflect.DeepEqual(l.Config.L2.Adapters, want) {
		t.Fatalf("file adapters = %#v", l.Config.L2.Adapters)
	}
	if s := l.Sources[settings.KeyAdapters]; s.Kind != settings.SourceFile || !strings.HasSuffix(s.Detail, ":2") {
		t.Fatalf("file source = %+v", s)
	}

	// The env list replaces the file's as a whole, and the flags the env's.
	l = mustLoad(t, settings.LoadOptions{ConfigPath: file, Environ: env})
	if len(l.Config.L2.Adapters) != 1 || l.Config.L2.Adapters[0].FS.BasePath != "/env/l2" {
		t.Fatalf("env adapters = %#v", l.Config.L2.Adapters)
	}
	if s := l.Sources[settings.KeyAdapters]; s.Detail != "KVDOCK_L2_ADAPTERS" {
		t.Fatalf("env source = %+v", s)
	}
	l = mustLoad(t, settings.LoadOptions{ConfigPath: file, Environ: env, Flags: flags(t, "--l2-adapter", respFlag)})
	if len(l.Config.L2.Adapters) != 1 || l.Config.L2.Adapters[0].Type != "resp" {
		t.Fatalf("flag adapters = %#v", l.Config.L2.Adapters)
	}
	// An empty env array, or an empty variable, means no tiers, overriding the file.
	for _, v := range []string{"[]", "", " "} {
		l = mustLoad(t, settings.LoadOptions{ConfigPath: file, Environ: []string{"KVDOCK_L2_ADAPTERS=" + v}})
		if len(l.Config.L2.Adapters) != 0 {
			t.Fatalf("env %q: list = %#v", v, l.Config.L2.Adapters)
		}
	}
}

func TestL2AdapterProblemsFromFlagsAllAtOnce(t *testing.T) {
	cases := []struct{ json, key, reason string }{
		{`{"type": "s3", "bucket": "x"}`, "l2.adapters[0].type", "accepted"},
		{`{"type": "fs", "base_path": "/a", "bas_path": "/b"}`, "l2.adapters[1].bas_path", "unknown field"},
		{`{"type": "fs"}`, "l2.adapters[2].base_path", "required"},
		{`{"type": "resp", "host": "r", "port": "6379"}`, "l2.adapters[3].port", "whole number"},
		{`{"type": "resp", "host": "r", "port": 70000}`, "l2.adapters[4].port", "1..65535"},
		{`{"type": "resp", "cluster": true}`, "l2.adapters[5].startup_nodes", "required"},
		{`{"type": "resp", "cluster": true, "startup_nodes": ["a:1", "b"]}`, "l2.adapters[6].startup_nodes", "host:port"},
		{`{"type": "resp", "host": "r", "ca_file": "/ca.pem"}`, "l2.adapters[7].ca_file", "tls"},
		{`{"type": "resp", "host": "r", "tls": "yes"}`, "l2.adapters[8].tls", "true or false"},
		{`not json`, "l2.adapters[9]", "JSON object"},
		{`{"type": "fs", "base_path": "/a"}`, "l2.adapters[10].base_path", "already used"},
		{`{"type": "resp", "port": 1}`, "l2.adapters[11].host", "required"},
		{`{"type": "fs", "base_path": "/c", "max_capacity_gb": -1}`, "l2.adapters[12].max_capacity_gb", "> 0"},
		{`{"type": "resp", "host": "r", "num_workers": 0}`, "l2.adapters[13].num_workers", "1..1024"},
		{`[1]`, "l2.adapters[14]", "JSON object"},
	}
	var args []string
	for _, c := range cases {
		args = append(args, "--l2-adapter", c.json)
	}
	_, err := settings.Load(settings.LoadOptions{Flags: flags(t, args...)})
	probs := problems(t, err)
	if len(probs) != len(cases) {
		t.Fatalf("%d problems, want %d:\n%v", len(probs), len(cases), err)
	}
	for i, c := range cases {
		p := probs[i]
		src := fmt.Sprintf("--l2-adapter[%d]", i)
		if p.Key != c.key || !strings.Contains(p.Reason, c.reason) || p.Source.Detail != src {
			t.Errorf("case %d: got %s; want key %s, reason with %q, from %s", i, p, c.key, c.reason, src)
		}
	}
}

func TestL2AdapterProblemsNameFileLineAndEnv(t *testing.T) {
	file := writeFile(t, "l2:\n  adapters:\n    - type: fs\n      base_path: /a\n    - type: resp\n      host: r\n      port: 0\n      colour: red\n    - just text\n")
	_, err := settings.Load(settings.LoadOptions{ConfigPath: file})
	probs := problems(t, err)
	want := map[string]string{
		"l2.adapters[1].colour": file + ":8",
		"l2.adapters[1].port":   file + ":7",
		"l2.adapters[2]":        file + ":9",
	}
	if len(probs) != len(want) {
		t.Fatalf("problems: %v", err)
	}
	for _, p := range probs {
		if want[p.Key] != p.Source.Detail {
			t.Errorf("%s from %s; want %s", p.Key, p.Source.Detail, want[p.Key])
		}
	}

	for _, v := range []string{`{"type": "fs"}`, `[{"type": "fs"}`, `"x"`} {
		_, err = settings.Load(settings.LoadOptions{Environ: []string{"KVDOCK_L2_ADAPTERS=" + v}})
		probs = problems(t, err)
		if len(probs) != 1 || !strings.HasPrefix(probs[0].Source.Detail, "KVDOCK_L2_ADAPTERS") || !strings.HasPrefix(probs[0].Key, "l2.adapters") {
			t.Errorf("env %s: %v", v, err)
		}
	}
	_, err = settings.Load(settings.LoadOptions{Environ: []string{`KVDOCK_L2_ADAPTERS=[{"type": "fs"}]`}})
	if probs = problems(t, err); probs[0].Source.Detail != "KVDOCK_L2_ADAPTERS[0]" || probs[0].Key != "l2.adapters[0].base_path" {
		t.Errorf("env element problem: %v", err)
	}

	// A scalar where the list goes is a problem of the key, with its line.
	file = writeFile(t, "l2:\n  adapters: fs\n")
	_, err = settings.Load(settings.LoadOptions{ConfigPath: file})
	if probs = problems(t, err); len(probs) != 1 || probs[0].Key != "l2.adapters" || probs[0].Source.Detail != file+":2" {
		t.Errorf("scalar list: %v", err)
	}
}

func TestL2AdapterBounds(t *testing.T) {
	var args []string
	for i := 0; i < 17; i++ {
		args = append(args, "--l2-adapter", fmt.Sprintf(`{"type": "fs", "base_path": "/d%d"}`, i))
	}
	_, err := settings.Load(settings.LoadOptions{Flags: flags(t, args...)})
	if probs := problems(t, err); len(probs) != 1 || !strings.Contains(probs[0].Reason, "at most 16") {
		t.Fatalf("17 adapters: %v", err)
	}
	huge := `{"type": "fs", "base_path": "/` + strings.Repeat("a", 70<<10) + `"}`
	_, err = settings.Load(settings.LoadOptions{Flags: flags(t, "--l2-adapter", huge)})
	if probs := problems(t, err); len(probs) != 1 || !strings.Contains(probs[0].Reason, "at most") {
		t.Fatalf("huge adapter: %v", err)
	}
	deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	_, err = settings.Load(settings.LoadOptions{Environ: []string{"KVDOCK_L2_ADAPTERS=" + deep}})
	if probs := problems(t, err); len(probs) != 1 {
		t.Fatalf("deep env: %v", err)
	}
	for _, bad := range [][]string{
		{"--l2-store-policy", "write-through"}, {"--l2-prefetch-max-in-flight", "0"},
		{"--l2-prefetch-load-timeout", "0"}, {"--l2-queue-bytes", "1024"},
	} {
		_, err := settings.Load(settings.LoadOptions{Flags: flags(t, bad...)})
		if probs := problems(t, err); len(probs) != 1 || probs[0].Source.Detail != bad[0] {
			t.Errorf("%v: %v", bad, err)
		}
	}
}

func TestL2FileStringsKeepTheirText(t *testing.T) {
	file := writeFile(t, "l2:\n  adapters:\n    - type: resp\n      host: 10.0.0.1\n      password: 0123\n      username: true\n      key_prefix: 0x1F\n")
	l := mustLoad(t, settings.LoadOptions{ConfigPath: file})
	a := l.Config.L2.Adapters[0].RESP
	if a.Password != "0123" || a.Username != "true" || a.KeyPrefix == nil || *a.KeyPrefix != "0x1F" {
		t.Fatalf("adapter = %#v", a)
	}
}

func TestL2RespCredentialsFromEnv(t *testing.T) {
	two := flags(t, "--l2-adapter", respFlag, "--l2-adapter", `{"type": "resp", "host": "h", "username": "own", "password": "mine"}`,
		"--l2-adapter", fsFlag)
	l := mustLoad(t, settings.LoadOptions{Flags: two, Environ: []string{
		"LMCACHE_RESP_USERNAME=up-user", "LMCACHE_RESP_PASSWORD=up-pass", "KVDOCK_RESP_PASSWORD=kv-pass",
	}})
	a := l.Config.L2.Adapters
	if a[0].RESP.Username != "up-user" || a[0].RESP.Password != "kv-pass" {
		t.Errorf("filled = %#v", a[0])
	}
	if a[1].RESP.Username != "own" || a[1].RESP.Password != "mine" {
		t.Errorf("given credentials replaced: %#v", a[1])
	}
	if !reflect.DeepEqual(a[2].RESP, settings.RESPAdapter{}) {
		t.Errorf("fs adapter got a password: %#v", a[2])
	}
	if len(l.Warnings) != 0 {
		t.Errorf("KVDOCK_RESP_PASSWORD warned: %q", l.Warnings)
	}
}

const secret = "hunter2-s3cret"

func secretConfig(t *testing.T) (settings.Config, map[string]settings.Source) {
	t.Helper()
	l := mustLoad(t, settings.LoadOptions{Flags: flags(t, "--l2-adapter",
		`{"type": "resp", "host": "redis", "port": 6379, "username": "bob", "password": "`+secret+`"}`)})
	return l.Config, l.Sources
}

func TestL2SecretsNeverShown(t *testing.T) {
	c, src := secretConfig(t)
	if c.L2.Adapters[0].RESP.Password != secret {
		t.Fatal("password not loaded")
	}
	shown, err := settings.Shown(c, settings.KeyAdapters)
	if err != nil || strings.Contains(shown, secret) || strings.Contains(shown, "bob") || !strings.Contains(shown, "redis") {
		t.Errorf("Shown = %s, %v", shown, err)
	}
	if r := string(settings.Render(settings.Redact(c), src)); strings.Contains(r, secret) || !strings.Contains(r, settings.Redacted) {
		t.Errorf("render of redacted config:\n%s", r)
	}
	if c.L2.Adapters[0].RESP.Password != secret {
		t.Errorf("Redact changed the caller's adapters")
	}
	for _, s := range settings.AdapterTexts(c) {
		if strings.Contains(s, secret) || !strings.HasPrefix(s, `{"type": "resp"`) {
			t.Errorf("AdapterTexts: %s", s)
		}
	}

	// A password change alone is a change, shown without the value.
	other := settings.Default()
	other.L2.Adapters = []settings.Adapter{{Type: "resp", RESP: settings.RESPAdapter{Host: "redis", Port: 6379, Username: "bob", Password: "other-" + secret}}}
	for _, pair := range [][2]settings.Config{{settings.Default(), c}, {c, other}} {
		ch := settings.Diff(pair[0], pair[1])
		if len(ch) != 1 || ch[0].Key != settings.KeyAdapters || ch[0].Class != settings.Restart {
			t.Fatalf("diff = %+v", ch)
		}
		if all := fmt.Sprint(ch); strings.Contains(all, secret) {
			t.Errorf("diff shows the password: %s", all)
		}
	}

	// A bad value next to a password shows no password either.
	_, err = settings.Load(settings.LoadOptions{Flags: flags(t, "--l2-adapter",
		`{"type": "resp", "host": "r", "port": 0, "password": 12345}`)})
	if err == nil || strings.Contains(err.Error(), "12345") {
		t.Errorf("problem text: %v", err)
	}
}

func TestL2AdaptersNeverEditedOrSaved(t *testing.T) {
	c, src := secretConfig(t)
	if err := settings.Set(&c, settings.KeyAdapters, `[]`); err == nil {
		t.Error("Set l2.adapters accepted")
	}
	if err := settings.Reset(&c, settings.KeyAdapters); err == nil {
		t.Error("Reset l2.adapters accepted")
	}
	src[settings.KeyAdapters] = settings.Source{Kind: settings.SourceDashboard}
	if e := settings.Edited(src); len(e) != 0 {
		t.Errorf("edited = %v", e)
	}
	if out, err := settings.UpdateFile(nil, c, []string{settings.KeyAdapters}); err == nil || strings.Contains(string(out), secret) {
		t.Errorf("UpdateFile wrote adapters: %v\n%s", err, out)
	}
	if ki, ok := settings.LookupKey(settings.KeyAdapters); !ok || !ki.ReadOnly || ki.Class != settings.Restart || ki.Env != "KVDOCK_L2_ADAPTERS" {
		t.Errorf("key info = %+v", ki)
	}
}

func TestL2ValidateRechecksAdapters(t *testing.T) {
	c := settings.Default()
	c.L2.Adapters = []settings.Adapter{{Type: "resp", RESP: settings.RESPAdapter{Cluster: true, StartupNodes: []string{"a:1", "b:2"}}}}
	if err := settings.Validate(c, nil); err != nil {
		t.Fatalf("valid cluster: %v", err)
	}
	c.L2.Adapters = []settings.Adapter{{Type: "fs"}}
	if err := settings.Validate(c, nil); err == nil || !strings.Contains(err.Error(), "l2.adapters[0].base_path") {
		t.Fatalf("Validate = %v", err)
	}
}

// TestL2FSFieldsOfUpstream: the fs fields the tier reads are accepted, and
// upstream's fields it refuses are errors that say why.
func TestL2FSFieldsOfUpstream(t *testing.T) {
	ok := `{"type": "fs", "base_path": "/data/l2", "relative_tmp_dir": "tmp", "recover_on_start": false, "scan_on_startup": false}`
	if _, err := settings.Load(settings.LoadOptions{Flags: flags(t, "--l2-adapter", ok)}); err != nil {
		t.Fatalf("upstream's fs fields refused: %v", err)
	}
	for field, adapter := range map[string]string{
		"read_ahead_size":  `{"type": "fs", "base_path": "/d", "read_ahead_size": 4096}`,
		"use_odirect":      `{"type": "fs", "base_path": "/d", "use_odirect": true}`,
		"relative_tmp_dir": `{"type": "fs", "base_path": "/d", "relative_tmp_dir": "../x"}`,
		"scan_on_startup":  `{"type": "fs", "base_path": "/d", "recover_on_start": false, "scan_on_startup": true}`,
	} {
		_, err := settings.Load(settings.LoadOptions{Flags: flags(t, "--l2-adapter", adapter)})
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v", field, err)
		}
	}
}

// TestL2AdapterFieldChecks: each check of an adapter field, named with its
// field, and only that problem.
func TestL2AdapterFieldChecks(t *testing.T) {
	for _, c := range []struct{ json, field, reason string }{
		{`{"type": "resp", "hots": "x", "host": "h"}`, "hots", "unknown field"},
		{`{"type": "resp", "host": "a b"}`, "host", "not a host name"},
		{`{"type": "resp", "host": ""}`, "host", "empty"},
		{`{"type": "resp", "host": 5}`, "host", "string"},
		{`{"type": "resp", "host": "h", "port": 63.5}`, "port", "whole number"},
		{`{"type": "resp", "host": "h", "num_workers": 100000}`, "num_workers", "1..1024"},
		{`{"type": "resp", "host": "h", "max_capacity_gb": 0}`, "max_capacity_gb", "> 0"},
		{`{"type": "resp", "host": "h", "ttl_seconds": -1}`, "ttl_seconds", "0..315360000"},
		{`{"type": "resp", "host": "h", "ttl_seconds": 400000000}`, "ttl_seconds", "0..315360000"},
		{`{"type": "resp", "host": "h", "startup_nodes": ["a:1"]}`, "startup_nodes", `"cluster": true`},
		{`{"type": "resp", "cluster": true, "startup_nodes": []}`, "startup_nodes", "1..64"},
		{`{"type": "resp", "cluster": true, "startup_nodes": [1]}`, "startup_nodes", "host:port"},
		{`{"type": "resp", "cluster": true, "port": 7000, "startup_nodes": ["a:1"]}`, "host", "not used"},
		{`{"type": "resp", "host": "h", "password": 1234}`, "password", "string"},
		{`{"type": "resp", "host": "h", "ca_file": ""}`, "ca_file", "empty"},
		{`{"type": "fs", "base_path": " "}`, "base_path", "empty"},
		{`{"type": "fs", "base_path": 7}`, "base_path", "string"},
		{`{"type": "fs", "base_path": "/x\u0000y"}`, "base_path", "NUL"},
		{`{"type": "fs", "base_path": "/x", "max_capacity_gb": 0}`, "max_capacity_gb", "unbounded"},
		{`{"type": "fs", "base_path": "/x", "max_capacity_gb": "10"}`, "max_capacity_gb", "number"},
		{`{"type": "fs", "base_path": "/x", "max_capacity_gb": 1e300}`, "max_capacity_gb", "<= 1048576"},
		{`{"type": "fs", "base_path": "/x", "max_capacity_gb": 0.0001}`, "max_capacity_gb", "under 1 MiB"},
		{`{"type": "fs", "base_path": "/x", "relative_tmp_dir": "/abs"}`, "relative_tmp_dir", "sub-directory"},
		{`{"type": "fs", "base_path": "/x", "relative_tmp_dir": "."}`, "relative_tmp_dir", "sub-directory"},
		{`{"type": "fs", "base_path": "/x", "relative_tmp_dir": "a/../.."}`, "relative_tmp_dir", "sub-directory"},
		{`{"type": "fs", "base_path": "/x", "recover_on_start": "yes"}`, "recover_on_start", "true or false"},
	} {
		_, err := settings.Load(settings.LoadOptions{Flags: flags(t, "--l2-adapter", c.json)})
		probs := problems(t, err)
		if len(probs) != 1 || probs[0].Key != "l2.adapters[0]."+c.field || !strings.Contains(probs[0].Reason, c.reason) {
			t.Errorf("%s: %v; want one problem of %s with %q", c.json, err, c.field, c.reason)
		}
	}
}

// TestL2AdapterReportsEveryProblem: an adapter with several problems, from
// a flag, the file or a Config built in code, reports each with its source.
func TestL2AdapterReportsEveryProblem(t *testing.T) {
	_, err := settings.Load(settings.LoadOptions{Flags: flags(t, "--l2-adapter", `{"type": "resp", "host": "redis", "port": 0, "num_workers": 0}`)})
	probs := problems(t, err)
	if len(probs) != 2 || probs[0].Key != "l2.adapters[0].num_workers" || probs[1].Key != "l2.adapters[0].port" ||
		probs[0].Value != "0" || probs[1].Source.Detail != "--l2-adapter[0]" {
		t.Fatalf("two problems: %v", err)
	}

	file := writeFile(t, "l2:\n  adapters:\n    - type: resp\n      cluster: true\n      tls: 1\n      ca_file: /ca.pem\n      password: [x]\n")
	_, err = settings.Load(settings.LoadOptions{ConfigPath: file})
	want := map[string]string{
		"l2.adapters[0].tls":           file + ":5",
		"l2.adapters[0].password":      file + ":7",
		"l2.adapters[0].startup_nodes": file + ":3",
		"l2.adapters[0].ca_file":       file + ":6",
	}
	if probs = problems(t, err); len(probs) != len(want) {
		t.Fatalf("file: %v", err)
	}
	for _, p := range probs {
		if want[p.Key] != p.Source.Detail {
			t.Errorf("%s from %s; want %s", p.Key, p.Source.Detail, want[p.Key])
		}
	}

	c := settings.Default()
	c.L2.Adapters = []settings.Adapter{{Type: "resp", RESP: settings.RESPAdapter{Host: "h", Port: 70000, NumWorkers: -1}}, {Type: "s3"}}
	err = settings.Validate(c, map[string]settings.Source{settings.KeyAdapters: {Kind: settings.SourceFlag, Detail: "--l2-adapter"}})
	if probs = problems(t, err); len(probs) != 3 || probs[2].Key != "l2.adapters[1].type" || probs[0].Source.Detail != "--l2-adapter" {
		t.Fatalf("Validate: %v", err)
	}
}

// TestL2AdaptersRenderLoadsBack: values that differ from the defaults only
// by being given (an empty key_prefix, recover_on_start false) survive the
// rendered file.
func TestL2AdaptersRenderLoadsBack(t *testing.T) {
	l := mustLoad(t, settings.LoadOptions{Flags: flags(t,
		"--l2-adapter", `{"type": "fs", "base_path": "/d", "scan_on_startup": false, "max_capacity_gb": 2.5}`,
		"--l2-adapter", `{"type": "resp", "host": "h", "key_prefix": "", "tls": true, "ttl_seconds": 0}`)})
	if a := l.Config.L2.Adapters; *a[0].FS.RecoverOnStart || *a[1].RESP.KeyPrefix != "" {
		t.Fatalf("adapters = %+v", a)
	}
	again := writeFile(t, string(settings.Render(l.Config, l.Sources)))
	l2 := mustLoad(t, settings.LoadOptions{ConfigPath: again})
	if !reflect.DeepEqual(l.Config.L2.Adapters, l2.Config.L2.Adapters) {
		t.Fatalf("round trip: %+v\n%+v", l.Config.L2.Adapters, l2.Config.L2.Adapters)
	}
	want := []string{`{"type": "fs", "base_path": "/d", "max_capacity_gb": 2.5, "recover_on_start": false}`,
		`{"type": "resp", "host": "h", "key_prefix": "", "tls": true}`}
	if got := settings.AdapterTexts(l.Config); !reflect.DeepEqual(got, want) {
		t.Fatalf("AdapterTexts = %q", got)
	}
}

// TestHostileKVEventsMediumRefused: an adapter's kv_events_medium is shown
// to routers as it is given, so anything but 1..64 printable ASCII bytes
// is refused with the reason; none given is STORAGE.
func TestHostileKVEventsMediumRefused(t *testing.T) {
	for _, bad := range []string{`""`, `"two words"`, `"` + strings.Repeat("x", 65) + `"`, `"caf\u00e9"`, `"a\nb"`, `7`} {
		_, err := settings.Load(settings.LoadOptions{Flags: flags(t, "--l2-adapter", `{"type": "fs", "base_path": "/a", "kv_events_medium": `+bad+`}`)})
		probs := problems(t, err)
		if len(probs) != 1 || probs[0].Key != "l2.adapters[0].kv_events_medium" {
			t.Errorf("medium %s: problems %v", bad, err)
		}
	}
	l := mustLoad(t, settings.LoadOptions{Flags: flags(t, "--l2-adapter", `{"type": "fs", "base_path": "/a"}`,
		"--l2-adapter", `{"type": "resp", "host": "r", "kv_events_medium": "REDIS"}`)})
	if a := l.Config.L2.Adapters; a[0].KVEventsMedium() != "STORAGE" || a[1].KVEventsMedium() != "REDIS" {
		t.Fatalf("media %q %q", a[0].KVEventsMedium(), a[1].KVEventsMedium())
	}
}
