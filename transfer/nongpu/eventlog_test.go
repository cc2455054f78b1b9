package nongpu

import (
	"log/slog"
	"strings"
	"testing"

	"kvdock/core/testkit/logbuf"
)

// An event about one instance logs its instance_id; a module-wide one (the
// restart's "registration(s) restored", sent with id 0) logs none rather
// than instance_id=0, which names no worker.
func TestEventLogsInstanceIDOnlyForAnInstance(t *testing.T) {
	old := newEnv(t, true, 1<<20)
	old.register(7)
	fresh := newEnv(t, true, 1<<20)
	var buf logbuf.Buffer
	fresh.mod.log = slog.New(slog.NewTextHandler(&buf, nil))
	if n, refused := fresh.mod.Restore(old.mod.Registrations(), true); n != 1 || len(refused) != 0 {
		t.Fatalf("restored %d, refused %q", n, refused)
	}
	fresh.mod.Unregister(7)
	var restored, unregistered string
	for _, line := range strings.Split(buf.String(), "\n") {
		switch {
		case strings.Contains(line, "registration(s) restored"):
			restored = line
		case strings.Contains(line, "event=unregister"):
			unregistered = line
		}
	}
	if restored == "" || strings.Contains(restored, "instance_id") {
		t.Errorf("restore line %q: want one, without instance_id\n%s", restored, buf.String())
	}
	if !strings.Contains(unregistered, "instance_id=7") {
		t.Errorf("unregister line %q lacks instance_id=7\n%s", unregistered, buf.String())
	}
}
