package settings_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"kvdock/assets"
	"kvdock/settings"
)

// dashboardEdit sets key in c and marks it as set in the dashboard, as the
// dashboard's pending sources do.
func dashboardEdit(t *testing.T, c *settings.Config, src map[string]settings.Source, key, val string) {
	t.Helper()
	if err := settings.Set(c, key, val); err != nil {
		t.Fatal(err)
	}
	src[key] = settings.Source{Kind: settings.SourceDashboard}
}

func fileMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The case: a file from `config init` (0600) with an operator's
// comment and order, a token and the port by flag, the pool size by env,
// two keys edited in the dashboard. Only those two lines change.
func TestSaveWritesOnlyDashboardEditsAndKeepsTheFile(t *testing.T) {
	orig := strings.Replace(string(assets.DefaultConfig()), "  port: 5555\n", "  port: 5555 # the port our workers use\n", 1)
	orig = strings.Replace(orig, "eviction:\n", "# operator: tuned for the 70B model\neviction:\n", 1)
	path := writeFile(t, orig)
	l := mustLoad(t, settings.LoadOptions{
		ConfigPath: path,
		Flags:      flags(t, "--http-token", "s3cret-flag", "--port", "5591"),
		Environ:    []string{"KVDOCK_L1_SIZE_GB=2", "KVDOCK_LOG_FILE=/tmp/from-env.log"},
	})
	c, src := l.Config, l.Sources
	dashboardEdit(t, &c, src, "eviction.ratio", "0.3")
	dashboardEdit(t, &c, src, "log.level", "debug")

	res, err := settings.SaveFile(path, c, src)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(res.Keys, []string{"eviction.ratio", "log.level"}) || res.Created {
		t.Fatalf("result %+v", res)
	}
	got := readFile(t, path)
	want := strings.Replace(orig, "  ratio: 0.2\n", "  ratio: 0.3\n", 1)
	want = strings.Replace(want, "  level: info\n", "  level: debug\n", 1)
	if got != want {
		t.Fatalf("saved file is not the original with two values changed:\n%s", lineDiff(want, got))
	}
	for _, leak := range []string{"s3cret", "5591", "size_gb: 2", "from-env"} {
		if strings.Contains(got, leak) {
			t.Errorf("a value from flags or env reached the file: %q", leak)
		}
	}
	if m := fileMode(t, path); m != 0o600 {
		t.Errorf("mode %v, want the file's 0600", m)
	}
	back := mustLoad(t, settings.LoadOptions{ConfigPath: path})
	if back.Config.Eviction.Ratio != 0.3 || back.Config.Log.Level != "debug" || back.Config.Server.Port != 5555 || back.Config.HTTP.Token != "" {
		t.Fatalf("file reads back as %+v", back.Config)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*")); len(leftovers) != 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
}

// A 0644 file keeps 0644 when no secret is written.
func TestSaveKeepsTheFileMode(t *testing.T) {
	path := writeFile(t, "server:\n  port: 5600\n")
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	c, src := settings.Default(), map[string]settings.Source{}
	dashboardEdit(t, &c, src, "server.host", "0.0.0.0")
	if _, err := settings.SaveFile(path, c, src); err != nil {
		t.Fatal(err)
	}
	if m := fileMode(t, path); m != 0o644 {
		t.Fatalf("mode %v, want 0644 kept", m)
	}
	if got := readFile(t, path); got != "server:\n  host: 0.0.0.0\n  port: 5600\n" {
		t.Fatalf("file:\n%s", got)
	}
}

// A secret from env or a flag never reaches the file, whatever else is
// saved; one edited in the dashboard does, and the file becomes 0600.
func TestSaveSecrets(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flags   []string
		environ []string
	}{
		{"flag", []string{"--http-token", "s3cret"}, nil},
		{"env", nil, []string{"KVDOCK_HTTP_TOKEN=s3cret"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, "http:\n  port: 8081\n")
			l := mustLoad(t, settings.LoadOptions{ConfigPath: path, Flags: flags(t, tc.flags...), Environ: tc.environ})
			if l.Config.HTTP.Token != "s3cret" {
				t.Fatalf("token not loaded: %+v", l.Config.HTTP)
			}
			c, src := l.Config, l.Sources
			dashboardEdit(t, &c, src, "http.host", "0.0.0.0")
			if _, err := settings.SaveFile(path, c, src); err != nil {
				t.Fatal(err)
			}
			if got := readFile(t, path); strings.Contains(got, "s3cret") || strings.Contains(got, "token") {
				t.Fatalf("a secret from %s reached the file:\n%s", tc.name, got)
			}
		})
	}

	path := writeFile(t, "# ours\nhttp:\n  port: 8081\n")
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	c, src := settings.Default(), map[string]settings.Source{}
	dashboardEdit(t, &c, src, "http.token", "typed-in-dashboard")
	res, err := settings.SaveFile(path, c, src)
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, path); got != "# ours\nhttp:\n  port: 8081\n  token: typed-in-dashboard\n" {
		t.Fatalf("file:\n%s", got)
	}
	if m := fileMode(t, path); m != 0o600 || res.Mode != 0o600 {
		t.Fatalf("a file holding a secret has mode %v (result %v), want 0600", m, res.Mode)
	}
}

// Point 3: with no file yet, save creates the default path's directory
// (0700) and the file (0600), and the next start reads it.
func TestSaveCreatesTheDefaultFile(t *testing.T) {
	xdg := filepath.Join(t.TempDir(), "xdg")
	environ := []string{"XDG_CONFIG_HOME=" + xdg}
	path, err := settings.DefaultPath(environ)
	if err != nil {
		t.Fatal(err)
	}
	c, src := settings.Default(), map[string]settings.Source{}
	dashboardEdit(t, &c, src, "server.port", "5601")
	res, err := settings.SaveFile(path, c, src)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Created || res.Path != path {
		t.Fatalf("result %+v", res)
	}
	if m := fileMode(t, path); m != 0o600 {
		t.Errorf("new file mode %v, want 0600", m)
	}
	if m := fileMode(t, filepath.Dir(path)); m != 0o700 {
		t.Errorf("new directory mode %v, want 0700", m)
	}
	l := mustLoad(t, settings.LoadOptions{Environ: environ})
	if l.File != path || l.Config.Server.Port != 5601 {
		t.Fatalf("next start reads %q port %d", l.File, l.Config.Server.Port)
	}
}

// Root saving a user's file leaves it the user's.
func TestSaveKeepsTheOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to own a file as someone else")
	}
	path := writeFile(t, "server:\n  port: 5600\n")
	if err := os.Chown(path, 4321, 4322); err != nil {
		t.Fatal(err)
	}
	c, src := settings.Default(), map[string]settings.Source{}
	dashboardEdit(t, &c, src, "server.port", "5601")
	if _, err := settings.SaveFile(path, c, src); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 4321 || st.Gid != 4322 {
		t.Fatalf("owner %d:%d after save, want 4321:4322", st.Uid, st.Gid)
	}
}

// Nothing set in the dashboard: nothing is written, not even a new file.
func TestSaveNothingWritesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "none", "config.yaml")
	l := mustLoad(t, settings.LoadOptions{Environ: []string{"KVDOCK_PORT=5591"}})
	res, err := settings.SaveFile(path, l.Config, l.Sources)
	if err != nil || len(res.Keys) != 0 {
		t.Fatalf("res %+v err %v", res, err)
	}
	if _, err := os.Stat(filepath.Dir(path)); !os.IsNotExist(err) {
		t.Fatalf("save with nothing to write created %s", filepath.Dir(path))
	}
}

// A symlinked settings file (dotfiles) stays a link; its target is edited.
func TestSaveThroughSymlink(t *testing.T) {
	target := writeFile(t, "l1:\n  size_gb: 2\n")
	link := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	c, src := settings.Default(), map[string]settings.Source{}
	dashboardEdit(t, &c, src, "l1.prefault", "false")
	res, err := settings.SaveFile(link, c, src)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the link was replaced: %v %v", fi, err)
	}
	if res.Path != target || readFile(t, target) != "l1:\n  size_gb: 2\n  prefault: false\n" {
		t.Fatalf("res %+v target:\n%s", res, readFile(t, target))
	}
}

// UpdateFile on the shapes a hand-written file takes; every result must
// read back to the edited values.
func TestUpdateFileShapes(t *testing.T) {
	c := settings.Default()
	set := func(key, val string) {
		if err := settings.Set(&c, key, val); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, in, want string
		keys           []string
		edit           map[string]string
	}{
		{name: "empty file", in: "", keys: []string{"server.port"}, edit: map[string]string{"server.port": "6000"},
			want: "server:\n  port: 6000\n"},
		{name: "only comments", in: "# written by hand\n# keep me", keys: []string{"server.port"}, edit: map[string]string{"server.port": "6000"},
			want: "# written by hand\n# keep me\nserver:\n  port: 6000\n"},
		{name: "null root", in: "~\n", keys: []string{"log.level"}, edit: map[string]string{"log.level": "warn"},
			want: "log:\n  level: warn\n"},
		{name: "null group", in: "http:\nlog:\n  format: json\n", keys: []string{"http.port"}, edit: map[string]string{"http.port": "0"},
			want: "http:\n  port: 0\nlog:\n  format: json\n"},
		{name: "flow group", in: "http: {port: 9}\n", keys: []string{"http.host"}, edit: map[string]string{"http.host": "::1"},
			want: "http: {host: '::1', port: 9}\n"},
		{name: "groups and keys in file order, blank lines kept", in: "log:\n  level: info\n\nserver:\n  port: 1\n  # tokens\n  chunk_size: 16\n",
			keys: []string{"server.host", "server.max_workers", "eviction.policy", "ui.refresh"},
			edit: map[string]string{"server.host": "h", "server.max_workers": "4", "eviction.policy": "noop", "ui.refresh": "2s"},
			want: "log:\n  level: info\n\nserver:\n  host: h\n  port: 1\n  # tokens\n  chunk_size: 16\n  max_workers: 4\n\neviction:\n  policy: noop\n\nui:\n  refresh: 2s\n"},
		{name: "strings that need quotes", in: "http:\n  host: a\n  token: b\n",
			keys: []string{"http.host", "http.token", "log.file", "server.host"},
			edit: map[string]string{"http.host": "0x1F", "http.token": "x # y", "log.file": "true", "server.host": " sp "},
			want: "server:\n  host: ' sp '\nhttp:\n  host: \"0x1F\"\n  token: 'x # y'\nlog:\n  file: \"true\"\n"},
		{name: "quoting style kept, line comment kept", in: "log:\n  file: \"/a.log\" # where\n", keys: []string{"log.file"},
			edit: map[string]string{"log.file": "/b.log"}, want: "log:\n  file: \"/b.log\" # where\n"},
		{name: "empty string", in: "server:\n  shm_name: seg\n", keys: []string{"server.shm_name"},
			edit: map[string]string{"server.shm_name": ""}, want: "server:\n  shm_name: \"\"\n"},
		{name: "auto removes the key, its comment stays", in: "server:\n  # our segment\n  shm_name: seg\n  port: 2\n",
			keys: []string{"server.shm_name"}, edit: map[string]string{"server.shm_name": settings.AutoText},
			want: "server:\n  # our segment\n  port: 2\n"},
		{name: "auto removes the last key under a comment", in: "server:\n  port: 2\n  # our segment\n  shm_name: seg\nl1:\n  size_gb: 2\n",
			keys: []string{"server.shm_name"}, edit: map[string]string{"server.shm_name": settings.AutoText},
			want: "server:\n  port: 2\n  # our segment\nl1:\n  size_gb: 2\n"},
		{name: "auto removes a group left empty, its comments stay", in: "# top\n\nserver:\n  # our segment\n  shm_name: seg\n\nl1:\n  size_gb: 2\n",
			keys: []string{"server.shm_name"}, edit: map[string]string{"server.shm_name": settings.AutoText},
			want: "# top\n\n# our segment\n\nl1:\n  size_gb: 2\n"},
		{name: "auto with no key writes nothing new", in: "l1:\n  size_gb: 2\n",
			keys: []string{"server.shm_name"}, edit: map[string]string{"server.shm_name": settings.AutoText},
			want: "l1:\n  size_gb: 2\n"},
		{name: "a long string stays on its line", in: "", keys: []string{"log.file"},
			edit: map[string]string{"log.file": "/var/log/" + strings.Repeat("a b ", 40) + "z.log"},
			want: "log:\n  file: /var/log/" + strings.Repeat("a b ", 40) + "z.log\n"},
		{name: "blank lines inside a group", in: "server:\n  port: 1\n\n  host: x\n", keys: []string{"server.port"},
			edit: map[string]string{"server.port": "2"}, want: "server:\n  port: 2\n\n  host: x\n"},
		{name: "a multi-line value keeps its blank line", in: "log:\n  level: info\n", keys: []string{"log.file"},
			edit: map[string]string{"log.file": "a\n\nb"}, want: "log:\n  level: info\n  file: |-\n    a\n\n    b\n"},
		{name: "CRLF file", in: "log:\r\n  level: info\r\n\r\nserver:\r\n  port: 3\r\n", keys: []string{"log.level"},
			edit: map[string]string{"log.level": "error"}, want: "log:\n  level: error\n\nserver:\n  port: 3\n"},
		{name: "an alias gets its own value; the anchor's other user keeps the old one",
			in: "server:\n  host: &h 10.0.0.1\nhttp:\n  host: *h\n", keys: []string{"server.host"},
			edit: map[string]string{"server.host": "10.0.0.2"},
			want: "server:\n  host: 10.0.0.2\nhttp:\n  host: 10.0.0.1\n"},
		{name: "editing an alias leaves the anchor", in: "server:\n  host: &h 10.0.0.1\nhttp:\n  host: *h\n",
			keys: []string{"http.host"}, edit: map[string]string{"http.host": "10.0.0.3"},
			want: "server:\n  host: &h 10.0.0.1\nhttp:\n  host: 10.0.0.3\n"},
		{name: "a shared group mapping is split", in: "server: &s {host: a, port: 1}\nhttp: *s\n",
			keys: []string{"http.port"}, edit: map[string]string{"http.port": "2"},
			want: "server: &s {host: a, port: 1}\nhttp: {host: a, port: 2}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c = settings.Default()
			for k, v := range tc.edit {
				set(k, v)
			}
			out, err := settings.UpdateFile([]byte(tc.in), c, tc.keys)
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != tc.want {
				t.Fatalf("got:\n%s\nwant:\n%s", out, tc.want)
			}
			l := mustLoad(t, settings.LoadOptions{ConfigPath: writeFile(t, string(out))})
			for _, k := range tc.keys {
				got, _ := settings.Get(l.Config, k)
				want, _ := settings.Get(c, k)
				if got != want {
					t.Errorf("%s reads back as %q, want %q", k, got, want)
				}
			}
		})
	}
}

// Files UpdateFile will not rewrite: it says why and changes nothing.
func TestUpdateFileRefuses(t *testing.T) {
	c := settings.Default()
	for _, tc := range []struct{ name, in, why string }{
		{"invalid YAML", "server:\n  port: [1\n", "line"},
		{"two documents", "server:\n  port: 1\n---\nserver:\n  port: 2\n", "2 YAML documents"},
		{"unknown key", "server:\n  prot: 1\n", "unknown key"},
		{"a list at the top", "- a\n", "must be a mapping"},
		{"too large", "# " + strings.Repeat("x", 2<<20) + "\n", "more than a settings file holds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := settings.UpdateFile([]byte(tc.in), c, []string{"server.port"})
			if err == nil || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("err %v, want one saying %q", err, tc.why)
			}
		})
	}
	if _, err := settings.UpdateFile(nil, c, []string{"server.nope"}); err == nil {
		t.Fatal("an unknown key was accepted")
	}
}

// Every key, edited to a value off its default, is written and reads back,
// starting from the annotated default file.
func TestUpdateFileEveryKey(t *testing.T) {
	c := settings.Default()
	for key, val := range map[string]string{
		"server.host": "0.0.0.0", "server.port": "5591", "server.chunk_size": "16", "server.max_workers": "3",
		"server.max_gpu_workers": "2", "server.max_cpu_workers": "5", "server.shm_name": "/seg.x",
		"server.protocol": "nongpu-v2", "server.max_message_bytes": "2097152", "server.max_instances": "7",
		"server.max_tokens_per_request": "4096", "server.queued_request_bytes": "3145728",
		"server.queued_reply_bytes_per_peer": "4194304", "l1.size_gb": "0.0625", "l1.use_lazy": "true",
		"l1.align_bytes": "512", "l1.write_ttl_seconds": "9", "l1.read_ttl_seconds": "8", "l1.prefault": "false",
		"l1.max_locked_share_per_instance": "0.25", "l1.max_locked_share": "1", "eviction.policy": "noop",
		"eviction.trigger_watermark": "0.95", "eviction.ratio": "0.3333333333333333", "http.host": "::1",
		"http.port": "0", "http.token": "t0k: en", "log.level": "warn", "log.format": "json",
		"log.file": "/var/log/kv dock.log", "ui.headless": "true", "ui.refresh": "1m30s",
	} {
		if err := settings.Set(&c, key, val); err != nil {
			t.Fatal(err)
		}
	}
	orig := assets.DefaultConfig()
	var editable []string
	for _, k := range settings.Keys() {
		if !k.ReadOnly {
			editable = append(editable, k.Key)
		}
	}
	out, err := settings.UpdateFile(orig, c, editable)
	if err != nil {
		t.Fatal(err)
	}
	l := mustLoad(t, settings.LoadOptions{ConfigPath: writeFile(t, string(out))})
	if !reflect.DeepEqual(l.Config, c) {
		t.Fatalf("read back %+v\nwant %+v\n%s", l.Config, c, out)
	}
	// Every comment line of the original is still there, in order.
	var comments []string
	for _, line := range strings.Split(string(orig), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			comments = append(comments, strings.TrimSpace(line))
		}
	}
	rest := string(out)
	for _, cl := range comments {
		i := strings.Index(rest, cl)
		if i < 0 {
			t.Fatalf("comment %q lost or out of order:\n%s", cl, out)
		}
		rest = rest[i+len(cl):]
	}
	// Unchanged, the default file comes back byte for byte.
	same, err := settings.UpdateFile(orig, settings.Default(), []string{"server.port"})
	if err != nil || string(same) != string(orig) {
		t.Fatalf("rewriting a value to itself changed the file (err %v):\n%s", err, lineDiff(string(orig), string(same)))
	}
}

// lineDiff shows the lines that differ, for failure messages.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < max(len(w), len(g)); i++ {
		var a, c string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			c = g[i]
		}
		if a != c {
			b.WriteString("line " + strconv.Itoa(i+1) + ":\n  want " + a + "\n  got  " + c + "\n")
		}
	}
	return b.String()
}

// FuzzUpdateFile feeds arbitrary file bytes and one edit to UpdateFile. It
// must never panic; when it writes a file, that file loads, the edited key
// has its new value and every other key keeps the value it had.
func FuzzUpdateFile(f *testing.F) {
	f.Add([]byte("server:\n  port: 5556\n  shm_name: \"\"\nl1:\n  size_gb: 0.5\n"), "server.shm_name", settings.AutoText)
	f.Add([]byte("# c\nhttp: &h {host: a}\nlog:\n  file: *h\n"), "http.host", "b # c")
	f.Add(assets.DefaultConfig(), "ui.refresh", "2s")
	f.Add([]byte("server:\n  host: &x h\n  port: 1\nhttp:\n  host: *x\n"), "server.host", "0x10")
	f.Fuzz(func(t *testing.T, data []byte, key, val string) {
		c := settings.Default()
		if _, ok := settings.LookupKey(key); !ok || settings.Set(&c, key, val) != nil {
			return
		}
		dir := t.TempDir()
		before, err := settings.Load(settings.LoadOptions{ConfigPath: writeAt(t, dir, "before.yaml", data)})
		if err != nil {
			return // a file Load refuses is not one to edit
		}
		out, err := settings.UpdateFile(data, c, []string{key})
		if err != nil {
			return
		}
		after, err := settings.Load(settings.LoadOptions{ConfigPath: writeAt(t, dir, "after.yaml", out)})
		if err != nil {
			// The edited value may break a rule across keys (a pool
			// smaller than its alignment); anything else is a bug.
			if strings.Contains(err.Error(), key) {
				return
			}
			t.Fatalf("edited file does not load: %v\n%s", err, out)
		}
		for _, k := range settings.KeyNames() {
			want, _ := settings.Get(before.Config, k)
			if k == key {
				want, _ = settings.Get(c, k)
			}
			if got, _ := settings.Get(after.Config, k); got != want {
				t.Fatalf("%s = %q after editing %s, want %q\nin:\n%s\nout:\n%s", k, got, key, want, data, out)
			}
		}
	})
}

func writeAt(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Paths that cannot be written give an error naming the path and change
// nothing.
func TestSaveUnwritablePaths(t *testing.T) {
	c, src := settings.Default(), map[string]settings.Source{}
	dashboardEdit(t, &c, src, "server.port", "5601")
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, filepath.Join(notDir, "config.yaml")} {
		if _, err := settings.SaveFile(p, c, src); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("save to %s: err %v, want one naming it", p, err)
		}
	}
	if got := readFile(t, notDir); got != "x" {
		t.Fatalf("%s changed: %q", notDir, got)
	}
}
