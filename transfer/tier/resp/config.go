package resp

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"kvdock/settings"
)

// Defaults of the fields an adapter may leave out.
const (
	DefaultHost          = "localhost"
	DefaultPort          = 6379
	DefaultCapacityGB    = 10
	DefaultNumWorkers    = 8
	DefaultKeyPrefix     = "kvdock:"
	redactedPasswordText = "***"
)

// RESPConfig is what the tier runs with: a resp adapter with its defaults
// applied.
type RESPConfig struct {
	Host          string
	Port          int
	Username      string
	Password      string // secret: never printed (String and LogValue redact it)
	CapacityBytes int64  // max_capacity_gb in bytes: the budget for this host's own values, at their server memory
	NumWorkers    int    // calls in flight at once
	TLS           bool
	CAFile        string // PEM roots for TLS; "" = the system's
	Cluster       bool
	StartupNodes  []string // "host:port" seeds when Cluster; default [Host:Port]
	KeyPrefix     string
	TTL           time.Duration // 0 = values never expire
	// DialTimeout bounds one connection attempt, TLS handshake included
	// (0 = 2 s). Not an adapter field: tests on a loaded machine raise it.
	DialTimeout time.Duration
	// Instance names this host's share of a server other hosts may use
	// too: the list of its own values is kept under it (share.go). ""
	// = the host name. Not an adapter field: tests run two hosts in one.
	Instance string
}

// FromAdapter is the config of an adapter settings validated (credentials
// included: settings fills them from the environment), defaults applied.
func FromAdapter(a settings.RESPAdapter) RESPConfig {
	c := RESPConfig{
		Host: cmp.Or(a.Host, DefaultHost), Port: cmp.Or(a.Port, DefaultPort),
		Username: a.Username, Password: a.Password,
		CapacityBytes: int64(cmp.Or(a.MaxCapacityGB, DefaultCapacityGB) * (1 << 30)),
		NumWorkers:    cmp.Or(a.NumWorkers, DefaultNumWorkers),
		TLS:           a.TLS, CAFile: a.CAFile, Cluster: a.Cluster,
		StartupNodes: slices.Clone(a.StartupNodes), KeyPrefix: DefaultKeyPrefix,
		TTL: time.Duration(a.TTLSeconds) * time.Second,
	}
	if a.KeyPrefix != nil {
		c.KeyPrefix = *a.KeyPrefix
	}
	return c
}

func (c RESPConfig) addr() string { return net.JoinHostPort(c.Host, strconv.Itoa(c.Port)) }

// Seeds are the addresses a client is seeded with.
func (c RESPConfig) Seeds() []string { return c.addrs() }

func (c RESPConfig) addrs() []string {
	if c.Cluster {
		return c.StartupNodes
	}
	return []string{c.addr()}
}

// Target names the tier for the faces: "host:port" or "cluster h1:p1,…".
func (c RESPConfig) Target() string {
	if c.Cluster {
		return "cluster " + strings.Join(c.StartupNodes, ",")
	}
	return c.addr()
}

// String prints the config with the password redacted.
func (c RESPConfig) String() string {
	pw := ""
	if c.Password != "" {
		pw = redactedPasswordText
	}
	return fmt.Sprintf("resp{target=%s tls=%t ca_file=%q username=%q password=%s capacity=%d workers=%d key_prefix=%q ttl=%s}",
		c.Target(), c.TLS, c.CAFile, c.Username, pw, c.CapacityBytes, c.NumWorkers, c.KeyPrefix, c.TTL)
}

// GoString keeps %#v from printing the password too.
func (c RESPConfig) GoString() string { return c.String() }

// LogValue keeps slog from printing the password.
func (c RESPConfig) LogValue() slog.Value { return slog.StringValue(c.String()) }

// TLSConfig is a client's TLS settings (nil without TLS).
func (c RESPConfig) TLSConfig() (*tls.Config, error) { return c.tlsConfig() }

func (c RESPConfig) tlsConfig() (*tls.Config, error) {
	if !c.TLS {
		return nil, nil
	}
	// ServerName stays empty: the dialer takes it from each node's address,
	// which matters in a cluster whose nodes have names of their own.
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("resp tier: read ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("resp tier: ca_file %s holds no PEM certificate", c.CAFile)
		}
		tc.RootCAs = pool
	}
	return tc, nil
}
