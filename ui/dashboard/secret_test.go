package dashboard

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	tea "charm.land/bubbletea/v2"

	"kvdock/settings"
)

// TestSecretsNeverOnScreen: the HTTP token is shown redacted in the list,
// masked while edited, redacted in the apply confirmation, and a saved file
// that holds it is readable by its owner only.
func TestSecretsNeverOnScreen(t *testing.T) {
	f := newFakeEngine(t)
	f.cfg.HTTP.Token = "old-s3cret"
	f.snap.Config = f.cfg
	path := filepath.Join(t.TempDir(), "kvdock.yaml")
	opts := testOptions()
	opts.ConfigPath = path
	opts = opts.withDefaults(f)
	m := newModel(context.Background(), f, opts, opts.Profile)
	m.Update(tea.WindowSizeMsg{Width: 120, Height: 30})
	press(t, m, "5")
	selectKey(t, m, "http.token")
	s := screen(m)
	mustContain(t, s, "http.token", settings.Redacted)
	mustNotContain(t, s, "s3cret")

	press(t, m, "enter")
	mustContain(t, screen(m), "new value: ••••••••••")
	mustNotContain(t, screen(m), "s3cret")
	press(t, m, "ctrl+u")
	typeText(t, m, "new-s3cret")
	mustNotContain(t, screen(m), "s3cret")
	press(t, m, "enter", "a")
	s = screen(m)
	mustContain(t, s, "[RESTART] http.token: "+settings.Redacted+" -> "+settings.Redacted)
	mustNotContain(t, s, "s3cret")
	press(t, m, "y")
	mustNotContain(t, screen(m), "s3cret")
	if calls := f.applyCalls(); len(calls) != 1 || calls[0].HTTP.Token != "new-s3cret" {
		t.Fatalf("the edited token was not applied: %+v", calls)
	}

	press(t, m, "w")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("saved config with a token has mode %v, want 0600", fi.Mode().Perm())
	}
}
