package ctl_test

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"kvdock/ui/httpapi"
)

// TestStatusStripsTerminalEscapes: a worker's model name (and any other
// string of /status) is printed without ESC, BEL or other controls.
func TestStatusStripsTerminalEscapes(t *testing.T) {
	evil := "\x1b[31mEVIL\x1b[0m\x07"
	st := httpapi.Status{State: "serving\x1b]0;owned\x07", Error: "bad\x1b[2J", ShmReason: "why\u009b1m",
		Contexts: []httpapi.ContextStatus{{InstanceID: 7, ModelName: evil, Mode: "PICKLE", Reason: "r\teason\x1b[K", Dtype: "float32"}}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(st)
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	code, out, errs := runStatus("--http-host", "127.0.0.1", "--http-port", port)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if strings.ContainsAny(out, "\x1b\x07\u009b") {
		t.Fatalf("control characters in the output: %q", out)
	}
	var row string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, strconv.Itoa(7)+" ") {
			row = l
		}
	}
	if f := strings.Fields(row); len(f) < 9 || f[1] != "EVIL" || f[len(f)-2] != "r" || f[len(f)-1] != "eason" {
		t.Fatalf("context row %q", row)
	}
}
