package resp

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"kvdock/settings"
)

func TestFromAdapterDefaultsAndFields(t *testing.T) {
	c := FromAdapter(settings.RESPAdapter{})
	if c.Host != DefaultHost || c.Port != DefaultPort || c.NumWorkers != DefaultNumWorkers ||
		c.CapacityBytes != DefaultCapacityGB<<30 || c.KeyPrefix != DefaultKeyPrefix || c.TTL != 0 || c.Cluster || c.TLS {
		t.Fatalf("defaults: %+v", c)
	}
	empty := ""
	nodes := []string{"a:1", "b:2"}
	c = FromAdapter(settings.RESPAdapter{Host: "redis", Port: 6380, Username: "u", Password: "p",
		MaxCapacityGB: 0.5, NumWorkers: 3, TLS: true, CAFile: "/ca.pem", Cluster: true,
		StartupNodes: nodes, KeyPrefix: &empty, TTLSeconds: 60})
	want := RESPConfig{Host: "redis", Port: 6380, Username: "u", Password: "p", CapacityBytes: 1 << 29, NumWorkers: 3,
		TLS: true, CAFile: "/ca.pem", Cluster: true, StartupNodes: nodes, KeyPrefix: "", TTL: time.Minute}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got %+v\nwant %+v", c, want)
	}
	if c.Target() != "cluster a:1,b:2" || !reflect.DeepEqual(c.Seeds(), nodes) {
		t.Fatalf("Target %q, seeds %v", c.Target(), c.Seeds())
	}
	nodes[0] = "changed:1" // the config keeps its own list
	if c.StartupNodes[0] != "a:1" {
		t.Fatalf("StartupNodes shares the adapter's list: %v", c.StartupNodes)
	}
}

func TestConfigNeverPrintsThePassword(t *testing.T) {
	const pw = "hunter2-very-secret"
	c := FromAdapter(settings.RESPAdapter{Password: pw, Username: "bob"})
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("cfg", "config", c)
	slog.New(slog.NewTextHandler(&logged, nil)).Info("cfg", "config", c)
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%v %+v %#v %s", c, c, c, c), logged.String()} {
		if strings.Contains(s, pw) {
			t.Fatalf("password printed: %s", s)
		}
		if !strings.Contains(s, "***") {
			t.Fatalf("no sign of a redacted password: %s", s)
		}
	}
}

func TestTLSConfig(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pem")
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (RESPConfig{TLS: true, CAFile: bad}).TLSConfig(); err == nil || !strings.Contains(err.Error(), "no PEM") {
		t.Fatalf("bad CA file: %v", err)
	}
	if _, err := (RESPConfig{TLS: true, CAFile: filepath.Join(dir, "missing.pem")}).tlsConfig(); err == nil {
		t.Fatal("missing CA file accepted")
	}
	if _, err := Open(t.Context(), RESPConfig{TLS: true, CAFile: bad, Port: 1}, nil); err == nil {
		t.Fatal("Open with a bad CA file succeeded")
	}
	tc, err := (RESPConfig{TLS: true}).tlsConfig()
	if err != nil || tc == nil || tc.RootCAs != nil || tc.MinVersion == 0 {
		t.Fatalf("system roots: %+v, %v", tc, err)
	}
	if tc, _ := (RESPConfig{}).tlsConfig(); tc != nil {
		t.Fatal("TLS config without tls")
	}
}
