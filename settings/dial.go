package settings

import (
	"net"
	"strconv"
	"strings"
)

// DialAddr is the host:port a client on this machine dials to reach a server
// listening on host and port: a bind-all address (what a server listens on)
// becomes the loopback address of its family, and localhost becomes
// 127.0.0.1 (ZMQ resolves it to ::1 first on some hosts, where kvdock is not
// listening).
func DialAddr(host string, port int) string {
	switch host {
	case "", "0.0.0.0", "localhost":
		host = "127.0.0.1"
	case "::", "[::]":
		host = "::1"
	default:
		host = strings.Trim(host, "[]")
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}
