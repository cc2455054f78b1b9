package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvdock/assets"
	"kvdock/tests/harness"
)

// An operator edits one key in the Settings pane and presses w: the file on
// disk gets that value and keeps its comments and mode, and neither the
// token from the environment nor the port from the command line reaches it.
func TestDashboardSaveInTmux(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatalf("tmux is required (scripts/install-deps.sh installs it): %v", err)
	}
	bin := harness.Binary(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	orig := strings.Replace(string(assets.DefaultConfig()), "eviction:\n", "# ours: tuned by hand\neviction:\n", 1)
	if err := os.WriteFile(path, []byte(orig), 0o600); err != nil {
		t.Fatal(err)
	}
	port := harness.FreePort(t)
	m := tmux{t: t, socket: harness.UniqueName("kvdock-save")}
	cmd := fmt.Sprintf("KVDOCK_HTTP_TOKEN=s3cret-env %s --config %s --port %d --http-port 0 --shm-name %s --l1-size-gb 0.0625 --no-l1-prefault --log-file %s",
		bin, path, port, harness.UniqueName("kvsave"), filepath.Join(dir, "kvdock.log"))
	m.run("new-session", "-d", "-s", "kv", "-x", "160", "-y", "48", cmd)
	t.Cleanup(func() {
		// The terminal hangs up; kvdock stops and removes its segment.
		_ = exec.Command("tmux", "-L", m.socket, "kill-server").Run()
	})
	m.waitFor("dashboard up", 20*time.Second, "SERVING")

	m.keys("5")
	m.waitFor("settings pane", 5*time.Second, "eviction.ratio")
	m.keys("/", "eviction.ratio", "Enter")
	m.keys("Enter")
	m.waitFor("editor", 5*time.Second, "new value:", "a number")
	m.keys("C-u", "0.3", "Enter")
	m.waitFor("pending edit", 5*time.Second, "1 pending edit(s)")
	m.keys("w")
	m.waitFor("saved", 5*time.Second, "OK saved eviction.ratio to "+path)

	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got := string(data)
	if want := strings.Replace(orig, "  ratio: 0.2\n", "  ratio: 0.3\n", 1); got != want {
		t.Fatalf("the file on disk is not the original with ratio changed:\n%s", got)
	}
	if !strings.Contains(got, "# ours: tuned by hand\n") {
		t.Fatalf("comment lost:\n%s", got)
	}
	for _, leak := range []string{"s3cret", fmt.Sprint(port)} {
		if strings.Contains(got, leak) {
			t.Fatalf("%q from env or flags reached the file:\n%s", leak, got)
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode after save %v, want 0600 kept", fi.Mode().Perm())
	}
	if screen := m.capture(); strings.Contains(screen, "s3cret") {
		t.Fatalf("the token is on screen:\n%s", screen)
	}
}

// Without --config (nor KVDOCK_CONFIG), w creates the default settings file
// $XDG_CONFIG_HOME/kvdock/config.yaml: its directory 0700, the file 0600,
// holding the edited key; the next start reads it.
func TestDashboardSaveWithoutAFileCreatesIt(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatalf("tmux is required (scripts/install-deps.sh installs it): %v", err)
	}
	bin := harness.Binary(t)
	dir := t.TempDir()
	xdg := filepath.Join(dir, "xdg") // does not exist yet
	path := filepath.Join(xdg, "kvdock", "config.yaml")
	port := harness.FreePort(t)
	m := tmux{t: t, socket: harness.UniqueName("kvdock-create")}
	cmd := fmt.Sprintf("env -u KVDOCK_CONFIG XDG_CONFIG_HOME=%s %s --port %d --http-port 0 --shm-name %s --l1-size-gb 0.0625 --no-l1-prefault --log-file %s",
		xdg, bin, port, harness.UniqueName("kvcreate"), filepath.Join(dir, "kvdock.log"))
	m.run("new-session", "-d", "-s", "kv", "-x", "160", "-y", "48", cmd)
	t.Cleanup(func() { _ = exec.Command("tmux", "-L", m.socket, "kill-server").Run() })
	m.waitFor("dashboard up", 20*time.Second, "SERVING")

	m.keys("5")
	m.waitFor("settings pane", 5*time.Second, "eviction.ratio")
	m.keys("/", "eviction.ratio", "Enter")
	m.keys("Enter")
	m.waitFor("editor", 5*time.Second, "new value:")
	m.keys("C-u", "0.3", "Enter")
	m.waitFor("pending edit", 5*time.Second, "1 pending edit(s)")
	m.keys("w")
	m.waitFor("created", 5*time.Second, "created "+path)

	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("w did not create the default settings file: %v", err)
	}
	if !strings.Contains(string(data), "ratio: 0.3") {
		t.Fatalf("the created file lacks the edit:\n%s", data)
	}
	for p, want := range map[string]os.FileMode{path: 0o600, filepath.Dir(path): 0o700} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Fatalf("%s: mode %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
	out, err := exec.Command("env", "-u", "KVDOCK_CONFIG", "XDG_CONFIG_HOME="+xdg, bin, "config", "show", "--sources").CombinedOutput()
	if err != nil || !strings.Contains(string(out), path) {
		t.Fatalf("the next start does not read the created file: %v\n%s", err, out)
	}
}
