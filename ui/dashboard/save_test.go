package dashboard

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"
	"github.com/spf13/pflag"

	"kvdock/assets"
	"kvdock/settings"
)

// saveModel is a model over an engine running cfg loaded from the settings
// file at path with the given flags and environment, saving to path.
func saveModel(t *testing.T, path string, args, environ []string) (*Model, *fakeEngine) {
	t.Helper()
	fs := pflag.NewFlagSet("kvdock", pflag.ContinueOnError)
	settings.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	opts := settings.LoadOptions{Flags: fs, Environ: environ}
	if _, err := os.Stat(path); err == nil {
		opts.ConfigPath = path
	}
	l, err := settings.Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeEngine(t)
	f.cfg, f.src = l.Config, l.Sources
	f.snap.Config, f.snap.Sources = l.Config, l.Sources
	o := testOptions()
	o.ConfigPath = path
	o = o.withDefaults(f)
	m := newModel(context.Background(), f, o, o.Profile)
	m.Update(tea.WindowSizeMsg{Width: 160, Height: 40})
	return m, f
}

// editKey types val into key's editor and accepts it.
func editKey(t *testing.T, m *Model, key, val string) {
	t.Helper()
	retype(t, m, key, val)
	press(t, m, "enter")
}

// The case: a file from `config init` (0600) and --http-token on
// the command line. The token is never on screen nor in the file; the file
// keeps its comments and mode and gets only the value edited here, not
// the port from the flag nor the pool size from the environment.
func TestSaveWritesOnlyEditsAndNoSecret(t *testing.T) {
	orig := strings.Replace(string(assets.DefaultConfig()), "eviction:\n", "# ours: tuned for the 70B model\neviction:\n", 1)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(orig), 0o600); err != nil {
		t.Fatal(err)
	}
	m, f := saveModel(t, path, []string{"--http-token", "s3cret", "--port", "5591"}, []string{"KVDOCK_L1_SIZE_GB=2"})
	press(t, m, "5")
	selectKey(t, m, "http.token")
	mustContain(t, screen(m), settings.Redacted)
	mustNotContain(t, screen(m), "s3cret")

	editKey(t, m, "eviction.ratio", "0.3")
	press(t, m, "w")
	s := screen(m)
	mustContain(t, s, "OK saved eviction.ratio to "+path, "1 edit(s) saved but not applied")
	mustNotContain(t, s, "s3cret")

	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Replace(orig, "  ratio: 0.2\n", "  ratio: 0.3\n", 1); string(got) != want {
		t.Fatalf("the file is not the original with ratio changed:\n%s", got)
	}
	for _, leak := range []string{"s3cret", "5591", "size_gb: 2"} {
		if strings.Contains(string(got), leak) {
			t.Errorf("%q from flags or env reached the file", leak)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode after save: %v %v, want 0600", fi.Mode().Perm(), err)
	}

	// Applied, the edit is still the dashboard's and saves the same file.
	press(t, m, "a", "y")
	if len(f.applyCalls()) != 1 {
		t.Fatal("not applied")
	}
	press(t, m, "w")
	mustContain(t, screen(m), "OK saved eviction.ratio to "+path)
	mustNotContain(t, screen(m), "not applied", "s3cret")
	if again, _ := os.ReadFile(path); string(again) != string(got) {
		t.Fatalf("saving again changed the file:\n%s", again)
	}
	press(t, m, "4")
	mustNotContain(t, screen(m), "s3cret")
}

// Point 3: no file yet; w creates the default path's directory (0700) and
// the file (0600) and says so.
func TestSaveCreatesTheDefaultFile(t *testing.T) {
	xdg := filepath.Join(t.TempDir(), "xdg")
	path, err := settings.DefaultPath([]string{"XDG_CONFIG_HOME=" + xdg})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := saveModel(t, path, nil, []string{"KVDOCK_HTTP_TOKEN=from-env"})
	press(t, m, "5", "w")
	mustContain(t, screen(m), "nothing to save: no value was set in the dashboard")
	if _, err := os.Stat(filepath.Dir(path)); !os.IsNotExist(err) {
		t.Fatal("nothing to save still created the directory")
	}
	editKey(t, m, "server.port", "5601")
	press(t, m, "w")
	mustContain(t, screen(m), "OK created "+path+" (mode 0600) with server.port")
	for p, want := range map[string]os.FileMode{path: 0o600, filepath.Dir(path): 0o700} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != want {
			t.Fatalf("%s: %v %v, want mode %v", p, fi, err, want)
		}
	}
	if got, _ := os.ReadFile(path); string(got) != "server:\n  port: 5601\n" {
		t.Fatalf("new file:\n%s", got)
	}
}

func TestSaveRefusals(t *testing.T) {
	// No path at all: one line says what to do.
	m := newTestModel(t, newFakeEngine(t), 160, 30)
	editKey(t, m, "server.port", "5601")
	press(t, m, "5", "w")
	mustContain(t, screen(m), "nowhere to save", "--config PATH")

	// An invalid pending config is not saved.
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte("# mine\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m, _ = saveModel(t, path, nil, nil)
	press(t, m, "5")
	m.settings.pending.Server.Port = 0
	press(t, m, "w")
	mustContain(t, screen(m), "INVALID: 1 problem(s); fix them before saving", "server.port = 0")
	if got, _ := os.ReadFile(path); string(got) != "# mine\n" {
		t.Fatalf("an invalid config was saved:\n%s", got)
	}

	// A file that became invalid on disk is left alone, with the reason.
	m.settings.pending.Server.Port = 5601
	if err := os.WriteFile(path, []byte("server:\n  prot: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	press(t, m, "w")
	mustContain(t, screen(m), "SAVE FAILED", "unknown key")
	if got, _ := os.ReadFile(path); string(got) != "server:\n  prot: 1\n" {
		t.Fatalf("a broken file was rewritten:\n%s", got)
	}
}

// The editor offers what applies to the key's kind: no empty string and no
// "(auto)" for numbers, the default it puts back, "(auto)" for shm_name.
func TestEditHintsFollowTheKind(t *testing.T) {
	m := newTestModel(t, newFakeEngine(t), 160, 30)
	press(t, m, "5")
	for _, tc := range []struct {
		key      string
		want     []string
		wantNot  []string
		ctrlRVal string
	}{
		{"server.port", []string{"a whole number", "ctrl+r default 5555", "ctrl+u clear"},
			[]string{`"" = empty string`, "default (auto)", "clear (empty)"}, "5555"},
		{"eviction.ratio", []string{"a number", "ctrl+r default 0.2"}, []string{`"" = empty string`, "default (auto)"}, "0.2"},
		{"ui.refresh", []string{"a duration with a unit", "ctrl+r default 1s"}, []string{`"" = empty string`, "default (auto)"}, "1s"},
		{"l1.prefault", []string{"true or false", "ctrl+r default true"}, []string{`"" = empty string`, "default (auto)"}, "true"},
		{"log.file", []string{`empty or "" = empty string`, "ctrl+r default (empty)", "ctrl+u clear (empty)"}, []string{"(auto)"}, ""},
		{"server.shm_name", []string{`"" = SHM off`, "ctrl+r default (auto)"}, nil, settings.AutoText},
		{"eviction.policy", []string{"one of LRU, prefix, noop (any case)", "ctrl+r default prefix"}, []string{`"" = empty string`, "clear (empty)"}, "prefix"},
	} {
		selectKey(t, m, tc.key)
		press(t, m, "enter")
		s := screen(m)
		mustContain(t, s, tc.want...)
		mustNotContain(t, s, tc.wantNot...)
		press(t, m, "ctrl+u", "ctrl+r")
		if got := m.settings.edit.Value(); got != tc.ctrlRVal {
			t.Errorf("%s: ctrl+r put %q back, want %q", tc.key, got, tc.ctrlRVal)
		}
		press(t, m, "esc")
	}
	// Out of the editor, the full help names the keys without a kind.
	press(t, m, "?")
	mustNotContain(t, screen(m), "default (auto)", "default 5555")
}
