package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"kvdock/tests/harness"
)

// `kvdock ctl reset-stats` posts /reset-stats with KVDOCK_HTTP_TOKEN: exit 0
// and when; without the token exit 1 saying so (nothing reset); arguments
// or an HTTP API turned off are usage errors (exit 2).
func TestCtlResetStats(t *testing.T) {
	const token = "reset-stats-token"
	srv := harness.Start(t, "--http-token", token)
	port := "--http-port=" + strconv.Itoa(srv.HTTPPort)
	resetAt := func() any {
		t.Helper()
		res, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/status", srv.HTTPPort))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var st map[string]any
		if err := json.NewDecoder(res.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st["stats_reset_at"]
	}

	code, _, stderr := kvdock(t, nil, "ctl", port, "reset-stats")
	if code != 1 || !strings.Contains(stderr, "KVDOCK_HTTP_TOKEN") || resetAt() != nil {
		t.Fatalf("without the token: exit %d, stderr %q, reset at %v", code, stderr, resetAt())
	}
	code, out, stderr := kvdock(t, []string{"KVDOCK_HTTP_TOKEN=" + token}, "ctl", port, "reset-stats")
	if code != 0 || !strings.HasPrefix(out, "statistics reset at ") || resetAt() == nil {
		t.Fatalf("with the token: exit %d, out %q, stderr %q, reset at %v", code, out, stderr, resetAt())
	}
	for _, args := range [][]string{{port, "reset-stats", "now"}, {"--http-port=0", "reset-stats"}, {port, "--json", "reset-stats"}} {
		if code, _, stderr := kvdock(t, []string{"KVDOCK_HTTP_TOKEN=" + token}, append([]string{"ctl"}, args...)...); code != 2 || stderr == "" {
			t.Errorf("ctl %q: exit %d, stderr %q; want a usage error", args, code, stderr)
		}
	}
	if code, out, _ := kvdock(t, nil, "ctl", "--help"); code != 0 || !strings.Contains(out, "reset-stats") {
		t.Errorf("ctl --help does not list reset-stats (exit %d):\n%s", code, out)
	}
}
