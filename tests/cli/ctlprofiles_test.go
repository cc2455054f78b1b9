package cli

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"kvdock/settings"
	"kvdock/tests/harness"
	"kvdock/transfer/worker"
)

// TestCtlEveryCommandEveryProfile: every ctl command works against a
// server of every protocol profile and of --protocol auto, with the table
// named (--protocol) and with it left unset (ctl reads it from /status);
// the server logs no request it could not read. Over ZMQ the commands
// send each table's own payload (PING's instance id, CLEAR's force), and
// under auto one no other table reads differently.
func TestCtlEveryCommandEveryProfile(t *testing.T) {
	const token = "every-profile-token"
	for _, profile := range append(settings.ProtocolProfiles(), settings.ProtocolAuto) {
		t.Run(profile, func(t *testing.T) {
			srv := harness.Start(t, "--protocol", profile, "--http-token", token, "--chunk-size", "16",
				"--state-dir", filepath.Join(t.TempDir(), "state"))
			env := []string{"KVDOCK_HTTP_TOKEN=" + token}
			base := []string{"ctl", "--port", strconv.Itoa(srv.Port), "--http-port", strconv.Itoa(srv.HTTPPort), "--timeout", "10s"}
			ctlOK := func(want string, args ...string) {
				t.Helper()
				code, out, stderr := kvdock(t, env, append(append([]string{}, base...), args...)...)
				if code != 0 || !strings.Contains(out, want) {
					t.Fatalf("ctl %q: exit %d, stdout %q (want %q), stderr %q\nserver:\n%s", args, code, out, want, stderr, srv.Output())
				}
			}
			for _, named := range [][]string{{"--protocol", profile}, nil} {
				ctlOK("true\n", append(named, "ping")...)
				ctlOK("OK\n", append(named, "noop")...)
				ctlOK("16\n", append(named, "chunk-size")...)
				ctlOK("ended session req-1\n", append(named, "end-session", "req-1")...)
				ctlOK("cleared 0 objects", append(named, "clear", "--yes")...)
				ctlOK("protocol", append(named, "status")...)
				ctlOK("statistics reset at", append(named, "reset-stats")...)
			}
			// With the HTTP API off, clear is ZMQ's CLEAR in the named table.
			ctlOK("cleared (over ZMQ CLEAR", "--protocol", profile, "--http-port", "0", "clear", "--yes")

			workerTable := profile
			if profile == settings.ProtocolAuto {
				workerTable = "rpc-messages" // the auto default
			}
			w, err := worker.Register(context.Background(), srv.Dial(t, workerTable),
				worker.Config{InstanceID: 41, Model: "every-profile", Layers: 2, Hidden: 16, Dtype: "float32", Pickle: true})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			ctlOK("instance 41 removed", "unregister", "--yes", "41")
			ctlOK("restarted", "--yes", "restart")
			ctlOK("true\n", "ping") // the new process, found again by its /status
			for _, bad := range []string{"bad rpc request dropped", "protocol mismatch", "ambiguous"} {
				if strings.Contains(srv.Output(), bad) {
					t.Errorf("the server logged %q:\n%s", bad, srv.Output())
				}
			}
		})
	}
}
