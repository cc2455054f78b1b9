package resp

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"kvdock/transfer/tier"
)

// Defaults of the fields an adapter object may leave out.
const (
	DefaultHost          = "localhost"
	DefaultPort          = 6379
	DefaultCapacityGB    = 10
	DefaultNumWorkers    = 8
	DefaultKeyPrefix     = "kvdock:"
	maxNumWorkers        = 1024
	maxTTLSeconds        = 10 * 365 * 24 * 3600
	maxCapacityGB        = 1 << 20 // 1 PB: past that the number is a typo
	maxStartupNodes      = 1024
	envUsername          = "KVDOCK_RESP_USERNAME"
	envPassword          = "KVDOCK_RESP_PASSWORD"
	envUpstreamUsername  = "LMCACHE_RESP_USERNAME"
	envUpstreamPassword  = "LMCACHE_RESP_PASSWORD"
	redactedPasswordText = "***"
)

// RESPConfig is one validated {"type": "resp", …} adapter object.
type RESPConfig struct {
	Host          string
	Port          int
	Username      string
	Password      string // secret: never printed (String and LogValue redact it)
	CapacityBytes int64  // max_capacity_gb in bytes: the budget for this process's own writes
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
}

// Fields lists the keys an adapter object may have.
func Fields() []string {
	return []string{
		"type", "host", "port", "username", "password", "max_capacity_gb", "num_workers",
		"tls", "ca_file", "cluster", "startup_nodes", "key_prefix", "ttl_seconds",
	}
}

// ParseConfig turns an adapter object (decoded JSON or YAML) into a RESPConfig.
// Unknown fields and ill-typed or out-of-range values are errors naming the
// field. Username and password left out are taken from KVDOCK_RESP_USERNAME /
// KVDOCK_RESP_PASSWORD, else upstream's LMCACHE_RESP_USERNAME /
// LMCACHE_RESP_PASSWORD. Errors never quote the password.
func ParseConfig(m map[string]any) (RESPConfig, error) {
	c := RESPConfig{
		Host: DefaultHost, Port: DefaultPort, NumWorkers: DefaultNumWorkers,
		CapacityBytes: DefaultCapacityGB << 30, KeyPrefix: DefaultKeyPrefix,
	}
	fields := Fields()
	var unknown []string
	for k := range m {
		if !contains(fields, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return RESPConfig{}, fmt.Errorf("resp adapter: unknown field %q (known: %s)", unknown[0], strings.Join(fields, ", "))
	}
	if t, ok := m["type"]; ok && t != "resp" {
		return RESPConfig{}, fmt.Errorf("resp adapter: field \"type\" is %v, want \"resp\"", t)
	}
	var err error
	str := func(name string, dst *string) {
		if v, ok := m[name]; ok && err == nil {
			s, ok := v.(string)
			if !ok {
				err = fmt.Errorf("resp adapter: field %q must be a string", name)
				return
			}
			*dst = s
		}
	}
	boolean := func(name string, dst *bool) {
		if v, ok := m[name]; ok && err == nil {
			b, ok := v.(bool)
			if !ok {
				err = fmt.Errorf("resp adapter: field %q must be true or false", name)
				return
			}
			*dst = b
		}
	}
	str("host", &c.Host)
	str("username", &c.Username)
	str("password", &c.Password)
	str("ca_file", &c.CAFile)
	str("key_prefix", &c.KeyPrefix)
	boolean("tls", &c.TLS)
	boolean("cluster", &c.Cluster)
	if err != nil {
		return RESPConfig{}, err
	}
	if v, ok := m["port"]; ok {
		p, err := integer("port", v, 1, 65535)
		if err != nil {
			return RESPConfig{}, err
		}
		c.Port = int(p)
	}
	if v, ok := m["num_workers"]; ok {
		n, err := integer("num_workers", v, 1, maxNumWorkers)
		if err != nil {
			return RESPConfig{}, err
		}
		c.NumWorkers = int(n)
	}
	if v, ok := m["ttl_seconds"]; ok {
		n, err := integer("ttl_seconds", v, 0, maxTTLSeconds)
		if err != nil {
			return RESPConfig{}, err
		}
		c.TTL = time.Duration(n) * time.Second
	}
	if v, ok := m["max_capacity_gb"]; ok {
		gb, ok := tier.Number(v)
		if !ok || math.IsNaN(gb) || gb <= 0 || gb > maxCapacityGB {
			return RESPConfig{}, fmt.Errorf("resp adapter: field \"max_capacity_gb\" must be a number in (0, %d], got %v", maxCapacityGB, v)
		}
		c.CapacityBytes = int64(gb * (1 << 30))
	}
	if v, ok := m["startup_nodes"]; ok {
		list, ok := v.([]any)
		if s, isStrings := v.([]string); isStrings {
			list, ok = make([]any, len(s)), true
			for i := range s {
				list[i] = s[i]
			}
		}
		if !ok || len(list) == 0 || len(list) > maxStartupNodes {
			return RESPConfig{}, fmt.Errorf("resp adapter: field \"startup_nodes\" must be a list of 1..%d \"host:port\" strings", maxStartupNodes)
		}
		for i, n := range list {
			s, ok := n.(string)
			if !ok {
				return RESPConfig{}, fmt.Errorf("resp adapter: startup_nodes[%d] must be a \"host:port\" string", i)
			}
			if err := checkAddr(s); err != nil {
				return RESPConfig{}, fmt.Errorf("resp adapter: startup_nodes[%d]: %w", i, err)
			}
			c.StartupNodes = append(c.StartupNodes, s)
		}
		if !c.Cluster {
			return RESPConfig{}, errors.New("resp adapter: field \"startup_nodes\" needs \"cluster\": true")
		}
	}
	if c.Host == "" || strings.ContainsAny(c.Host, " /\t\r\n") {
		return RESPConfig{}, fmt.Errorf("resp adapter: field \"host\" %q is not a host name or address", c.Host)
	}
	if c.CAFile != "" && !c.TLS {
		return RESPConfig{}, errors.New("resp adapter: field \"ca_file\" needs \"tls\": true")
	}
	if c.Cluster && len(c.StartupNodes) == 0 {
		c.StartupNodes = []string{c.addr()}
	}
	if c.Username == "" {
		c.Username = firstEnv(envUsername, envUpstreamUsername)
	}
	if c.Password == "" {
		c.Password = firstEnv(envPassword, envUpstreamPassword)
	}
	return c, nil
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func integer(name string, v any, lo, hi int64) (int64, error) {
	f, ok := tier.Number(v)
	if !ok || f != math.Trunc(f) || f < float64(lo) || f > float64(hi) {
		return 0, fmt.Errorf("resp adapter: field %q must be a whole number in [%d, %d], got %v", name, lo, hi, v)
	}
	return int64(f), nil
}

func checkAddr(s string) error {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", s, err)
	}
	n, err := strconv.Atoi(p)
	if h == "" || err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q is not host:port", s)
	}
	return nil
}

func (c RESPConfig) addr() string { return net.JoinHostPort(c.Host, strconv.Itoa(c.Port)) }

// addrs are the addresses the client is seeded with.
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

// tlsConfig builds the client's TLS settings (nil without TLS).
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
