package resp

import (
	"net"
	"strconv"
	"strings"
	"testing"

	"kvdock/core/tierstate"
)

// TestDownReasonSaysTheAddressOnce: a tier whose server refuses the
// connection says why with the address once ("ping: dial tcp ADDR: …:
// connection refused"), not once per layer of wrapping.
func TestDownReasonSaysTheAddressOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close() // nobody listens there now
	tr, _ := open(t, RESPConfig{Host: "127.0.0.1", Port: port, NumWorkers: 2, CapacityBytes: 1 << 20, KeyPrefix: DefaultKeyPrefix})
	st := waitState(t, tr, tierstate.Down, stateLimit)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if n := strings.Count(st.Reason, addr); n != 1 || !strings.Contains(st.Reason, "connection refused") {
		t.Fatalf("down reason %q names %s %d times, want once with the refusal", st.Reason, addr, n)
	}
}
