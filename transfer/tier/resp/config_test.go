package resp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func parseJSON(t *testing.T, s string) (RESPConfig, error) {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return ParseConfig(m)
}

func TestParseConfigDefaultsAndFields(t *testing.T) {
	t.Setenv(envUsername, "")
	t.Setenv(envPassword, "")
	t.Setenv(envUpstreamUsername, "")
	t.Setenv(envUpstreamPassword, "")
	c, err := parseJSON(t, `{"type": "resp"}`)
	if err != nil {
		t.Fatal(err)
	}
	if c.Host != DefaultHost || c.Port != DefaultPort || c.NumWorkers != DefaultNumWorkers ||
		c.CapacityBytes != DefaultCapacityGB<<30 || c.KeyPrefix != DefaultKeyPrefix || c.TTL != 0 || c.Cluster || c.TLS {
		t.Fatalf("defaults: %+v", c)
	}
	c, err = parseJSON(t, `{"type": "resp", "host": "redis", "port": 6380, "username": "u", "password": "p",
		"max_capacity_gb": 0.5, "num_workers": 3, "tls": true, "ca_file": "/ca.pem", "cluster": true,
		"startup_nodes": ["a:1", "b:2"], "key_prefix": "ns:", "ttl_seconds": 60}`)
	if err != nil {
		t.Fatal(err)
	}
	want := RESPConfig{Host: "redis", Port: 6380, Username: "u", Password: "p", CapacityBytes: 1 << 29, NumWorkers: 3,
		TLS: true, CAFile: "/ca.pem", Cluster: true, StartupNodes: []string{"a:1", "b:2"}, KeyPrefix: "ns:", TTL: time.Minute}
	if fmt.Sprintf("%+v", []any{c.Host, c.Port, c.Username, c.Password, c.CapacityBytes, c.NumWorkers, c.TLS, c.CAFile, c.Cluster, c.StartupNodes, c.KeyPrefix, c.TTL}) !=
		fmt.Sprintf("%+v", []any{want.Host, want.Port, want.Username, want.Password, want.CapacityBytes, want.NumWorkers, want.TLS, want.CAFile, want.Cluster, want.StartupNodes, want.KeyPrefix, want.TTL}) {
		t.Fatalf("got %+v\nwant %+v", c, want)
	}
	if c.Target() != "cluster a:1,b:2" {
		t.Fatalf("Target %q", c.Target())
	}
	// YAML gives ints; cluster without startup_nodes seeds from host:port.
	c, err = ParseConfig(map[string]any{"type": "resp", "port": 7000, "cluster": true})
	if err != nil || c.Port != 7000 || len(c.StartupNodes) != 1 || c.StartupNodes[0] != "localhost:7000" {
		t.Fatalf("yaml ints: %+v, %v", c, err)
	}
}

func TestParseConfigRejects(t *testing.T) {
	for _, c := range []struct{ in, field string }{
		{`{"type": "resp", "hots": "x"}`, `"hots"`},
		{`{"type": "fs"}`, `"type"`},
		{`{"port": 0}`, `"port"`},
		{`{"port": 70000}`, `"port"`},
		{`{"port": 63.5}`, `"port"`},
		{`{"port": "6379"}`, `"port"`},
		{`{"host": ""}`, `"host"`},
		{`{"host": 5}`, `"host"`},
		{`{"num_workers": 0}`, `"num_workers"`},
		{`{"num_workers": 100000}`, `"num_workers"`},
		{`{"max_capacity_gb": 0}`, `"max_capacity_gb"`},
		{`{"max_capacity_gb": -1}`, `"max_capacity_gb"`},
		{`{"ttl_seconds": -1}`, `"ttl_seconds"`},
		{`{"tls": "yes"}`, `"tls"`},
		{`{"ca_file": "/x"}`, `"ca_file"`},
		{`{"startup_nodes": ["a:1"]}`, `"startup_nodes"`},
		{`{"cluster": true, "startup_nodes": []}`, `"startup_nodes"`},
		{`{"cluster": true, "startup_nodes": ["nohostport"]}`, `startup_nodes[0]`},
		{`{"cluster": true, "startup_nodes": [1]}`, `startup_nodes[0]`},
		{`{"password": 1234}`, `"password"`},
	} {
		_, err := parseJSON(t, c.in)
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: error %v, want one naming %s", c.in, err, c.field)
		}
	}
}

func TestParseConfigCredentialsFromEnv(t *testing.T) {
	t.Setenv(envUpstreamUsername, "up-user")
	t.Setenv(envUpstreamPassword, "up-pass")
	t.Setenv(envUsername, "")
	t.Setenv(envPassword, "")
	c, err := ParseConfig(map[string]any{})
	if err != nil || c.Username != "up-user" || c.Password != "up-pass" {
		t.Fatalf("LMCACHE_RESP_*: %q %q %v", c.Username, c.Password, err)
	}
	t.Setenv(envUsername, "kv-user")
	t.Setenv(envPassword, "kv-pass")
	if c, _ = ParseConfig(map[string]any{}); c.Username != "kv-user" || c.Password != "kv-pass" {
		t.Fatalf("KVDOCK_RESP_* should win over upstream's names: %q %q", c.Username, c.Password)
	}
	if c, _ = ParseConfig(map[string]any{"password": "field-pass"}); c.Password != "field-pass" {
		t.Fatalf("the adapter's own field should win: %q", c.Password)
	}
}

func TestConfigNeverPrintsThePassword(t *testing.T) {
	const pw = "hunter2-very-secret"
	c, err := ParseConfig(map[string]any{"password": pw, "username": "bob"})
	if err != nil {
		t.Fatal(err)
	}
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
	if _, err := (RESPConfig{TLS: true, CAFile: bad}).tlsConfig(); err == nil || !strings.Contains(err.Error(), "no PEM") {
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
