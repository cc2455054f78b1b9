package settings_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvdock/settings"
)

func TestDiffClassifies(t *testing.T) {
	cases := []struct {
		key, value string
		class      settings.Class
	}{
		{"eviction.policy", "noop", settings.Live},
		{"eviction.ratio", "0.5", settings.Live},
		{"l1.read_ttl_seconds", "30", settings.Live},
		{"log.level", "debug", settings.Live},
		{"ui.refresh", "2s", settings.Live},
		{"server.port", "6000", settings.Restart},
		{"server.max_workers", "4", settings.Restart},
		{"http.token", "t", settings.Restart},
		{"log.format", "json", settings.NextStart},
		{"log.file", "/tmp/kvdock.log", settings.NextStart},
		{"ui.headless", "true", settings.NextStart},
		{"server.protocol", "nongpu-v2", settings.Restart},
		{"l1.size_gb", "2", settings.Rebuild},
		{"server.shm_name", "", settings.Rebuild},
		{"l1.use_lazy", "true", settings.Rebuild},
		{"server.chunk_size", "512", settings.Rebuild},
		{"l1.align_bytes", "64", settings.Rebuild},
	}
	old := settings.Default()
	for _, tc := range cases {
		nc := old
		if err := settings.Set(&nc, tc.key, tc.value); err != nil {
			t.Fatal(err)
		}
		ch := settings.Diff(old, nc)
		if len(ch) != 1 || ch[0].Key != tc.key || ch[0].Class != tc.class {
			t.Errorf("%s: diff = %+v, want one %v change", tc.key, ch, tc.class)
		}
	}
	nc := old
	_ = settings.Set(&nc, "server.shm_name", "")
	if ch := settings.Diff(old, nc); ch[0].Old != "auto" || ch[0].New != `""` {
		t.Errorf("shm diff shows %q → %q", ch[0].Old, ch[0].New)
	}
	if d := settings.Diff(old, old); len(d) != 0 {
		t.Errorf("diff of equal configs: %+v", d)
	}
	_ = settings.Set(&nc, "log.level", "debug")
	_ = settings.Set(&nc, "server.port", "6000")
	if s := settings.Strongest(settings.Diff(old, nc)); s != settings.Rebuild || s.String() != "rebuild" {
		t.Errorf("strongest = %v", s)
	}
	lr := old
	_ = settings.Set(&lr, "log.level", "debug")
	_ = settings.Set(&lr, "http.port", "0")
	if s := settings.Strongest(settings.Diff(old, lr)); s != settings.Restart || s.String() != "restart" {
		t.Errorf("strongest = %v", s)
	}
	// A next-start key is stronger than a live one (the change is not in
	// effect yet) and weaker than any restart.
	ns := old
	_ = settings.Set(&ns, "log.level", "debug")
	_ = settings.Set(&ns, "log.format", "json")
	if s := settings.Strongest(settings.Diff(old, ns)); s != settings.NextStart || s.String() != "next-start" {
		t.Errorf("strongest of live + next-start = %v", s)
	}
	_ = settings.Set(&ns, "http.port", "0")
	if s := settings.Strongest(settings.Diff(old, ns)); s != settings.Restart {
		t.Errorf("strongest of next-start + restart = %v", s)
	}
	if settings.Live.String() != "live" || settings.Strongest(nil) != settings.Live {
		t.Errorf("Live")
	}
}

// TestDiffRedactsSecrets: a token change is listed with its class, but
// neither value appears (SIGHUP logs every change; the dashboard shows them).
func TestDiffRedactsSecrets(t *testing.T) {
	old, nc := settings.Default(), settings.Default()
	old.HTTP.Token, nc.HTTP.Token = "old-s3cret", "new-s3cret"
	ch := settings.Diff(old, nc)
	if len(ch) != 1 || ch[0].Key != "http.token" || ch[0].Class != settings.Restart {
		t.Fatalf("token change: %+v", ch)
	}
	if ch[0].Old != settings.Redacted || ch[0].New != settings.Redacted {
		t.Fatalf("token change shows %q -> %q, want both %q", ch[0].Old, ch[0].New, settings.Redacted)
	}
	// Setting a token where there was none says so, without the value.
	ch = settings.Diff(settings.Default(), nc)
	if len(ch) != 1 || ch[0].Old != `""` || ch[0].New != settings.Redacted {
		t.Fatalf("token set: %+v", ch)
	}
	if ki, ok := settings.LookupKey("http.token"); !ok || !ki.Secret {
		t.Fatalf("http.token is not marked secret: %+v", ki)
	}
}

func TestRedactAndShownHideSecrets(t *testing.T) {
	c := settings.Default()
	if v, _ := settings.Shown(c, "http.token"); v != "" {
		t.Fatalf("an empty token shows as %q", v)
	}
	c.HTTP.Token = "s3cret"
	if v, _ := settings.Shown(c, "http.token"); v != settings.Redacted {
		t.Fatalf("a set token shows as %q", v)
	}
	if out := string(settings.Render(settings.Redact(c), nil)); strings.Contains(out, "s3cret") {
		t.Fatalf("rendered redacted config holds the token:\n%s", out)
	}
	if c.HTTP.Token != "s3cret" {
		t.Fatal("Redact changed its argument")
	}
}

// TestLoadProblemsRedactSecrets: a token the loader cannot take is reported
// with its key and source, never its value.
func TestLoadProblemsRedactSecrets(t *testing.T) {
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte("http:\n  token: [s3cret, other]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := settings.Load(settings.LoadOptions{ConfigPath: p})
	var ve *settings.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 1 || ve.Problems[0].Key != "http.token" {
		t.Fatalf("a list as token: %v", err)
	}
	if shown := fmt.Sprintf("%+v %s", ve.Problems[0], ve.Problems[0]); strings.Contains(shown, "s3cret") {
		t.Fatalf("the problem shows the secret: %s", shown)
	}
}
