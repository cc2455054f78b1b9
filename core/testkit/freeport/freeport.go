// Package freeport gives tests a loopback TCP port that nothing listens on
// at the moment it is asked for (the kernel's choice for port 0).
package freeport

import (
	"net"
	"testing"
)

// Port is a loopback port nothing listens on now; another process may take
// it before the test binds it, which the test then sees as a bind error.
func Port(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
