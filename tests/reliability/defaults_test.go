package reliability

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvdock/settings"
	"kvdock/tests/harness"
)

// listeners returns the local addresses (hex, as /proc/net/tcp{,6} has
// them) of the listening sockets on port.
func listeners(t *testing.T, port int) []string {
	t.Helper()
	var out []string
	suffix := fmt.Sprintf(":%04X", port)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			if f == "/proc/net/tcp6" && os.IsNotExist(err) {
				continue // no IPv6 in this kernel
			}
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) > 3 && strings.HasSuffix(fs[1], suffix) && fs[3] == "0A" {
				out = append(out, fs[1])
			}
		}
	}
	return out
}

// TestDefaultsKeepStrangersOut: ZMQ and HTTP listen on loopback only by
// default, the segment is 0600, and binding either elsewhere is warned about.
func TestDefaultsKeepStrangersOut(t *testing.T) {
	def := settings.Default()
	if def.Server.Host != "localhost" && def.Server.Host != "127.0.0.1" {
		t.Fatalf("default ZMQ host %q", def.Server.Host)
	}
	if def.HTTP.Host != "127.0.0.1" && def.HTTP.Host != "localhost" {
		t.Fatalf("default HTTP host %q", def.HTTP.Host)
	}
	srv := harness.Start(t) // no --host, no --http-host
	for what, port := range map[string]int{"ZMQ": srv.Port, "HTTP": srv.HTTPPort} {
		ls := listeners(t, port)
		if len(ls) == 0 {
			t.Fatalf("%s: no listener on port %d", what, port)
		}
		for _, a := range ls {
			ip := a[:strings.IndexByte(a, ':')]
			// 127.0.0.1 is 0100007F; ::1 is 00000000000000000000000001000000.
			if ip != "0100007F" && ip != "00000000000000000000000001000000" {
				t.Fatalf("%s listens on %s (port %d), not loopback", what, a, port)
			}
		}
	}
	fi, err := os.Stat(filepath.Join("/dev/shm", srv.Segment))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("segment mode %v, want 0600", fi.Mode().Perm())
	}
	if out := srv.Output(); strings.Contains(out, "non-loopback") {
		t.Fatalf("loopback server warns about exposure:\n%s", out)
	}

	open := harness.Start(t, "--host", "0.0.0.0", "--http-host", "0.0.0.0")
	out := open.Output()
	for _, want := range []string{
		"ZMQ bound to a non-loopback address: anyone who can reach it can read and write the cache",
		"HTTP API bound to a non-loopback address without a token",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no warning %q in the log:\n%s", want, out)
		}
	}
	for what, port := range map[string]int{"ZMQ": open.Port, "HTTP": open.HTTPPort} {
		// 0.0.0.0, or Go's dual-stack [::] for it.
		if ls := listeners(t, port); len(ls) == 0 || strings.Trim(ls[0][:strings.IndexByte(ls[0], ':')], "0") != "" {
			t.Errorf("%s with host 0.0.0.0 listens on %v", what, ls)
		}
	}
}
