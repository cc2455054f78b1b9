package ctl_test

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// fakeStatus serves body as /status on a loopback port and returns it.
func fakeStatus(t *testing.T, body string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(body))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// With --protocol unset, ctl takes the table from /status only when the
// answer is about the ZMQ port it dials and names a table it knows: another
// kvdock's answer, a name that is no table, or no document at all leave it
// on the default (here the fake server's nongpu-v1, so ping answers), and a
// matching answer is followed (engine-driven: the nongpu-v1 server then
// does not answer, which the error explains from that /status).
func TestHostileStatusNeverPicksTheTable(t *testing.T) {
	port, _ := serve(t)
	ps := strconv.Itoa(port)
	for _, body := range []string{
		fmt.Sprintf(`{"endpoint": "tcp://127.0.0.1:%d", "protocol": "engine-driven"}`, port+1),
		fmt.Sprintf(`{"endpoint": "tcp://127.0.0.1:%d", "protocol": "../../etc/passwd"}`, port),
		fmt.Sprintf(`{"endpoint": "tcp://127.0.0.1:%d", "protocol": "auto", "protocol_detection": {"default": "nope"}}`, port),
		fmt.Sprintf(`{"endpoint": "%d", "protocol": "engine-driven"}`, port),
		"not json",
		strings.Repeat("[", 1<<16),
	} {
		code, out, errs := run("--port", ps, "--http-port", fakeStatus(t, body), "--timeout", "2s", "ping")
		if code != 0 || out != "true\n" {
			t.Errorf("/status %.60q: exit %d, %q %q", body, code, out, errs)
		}
	}
	body := fmt.Sprintf(`{"endpoint": "tcp://127.0.0.1:%d", "protocol": "engine-driven"}`, port)
	code, _, errs := run("--port", ps, "--http-port", fakeStatus(t, body), "--timeout", "300ms", "noop")
	if code != 1 || !strings.Contains(errs, "sent as engine-driven, --protocol engine-driven from the server's /status") ||
		!strings.Contains(errs, "The server speaks engine-driven as well") {
		t.Fatalf("a matching /status: exit %d, %q", code, errs)
	}
}
