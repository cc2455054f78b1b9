package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"kvdock/core/testkit/poll"
	"kvdock/core/testkit/redisserver"
	"kvdock/tests/harness"
)

// TestHostileCtlTiersListsAndClearsOnlyKvdocksOwn: against a real
// redis-server and an fs tier, kvdock ctl tiers lists each tier and its
// keys; kvdock ctl clear --tier asks (refuses without a terminal or
// --yes), needs the token, and removes only kvdock's own files and keys: a
// file of another name under the fs tier's base_path and a key of another
// prefix on the Redis server stay, and so does the tier not named.
func TestHostileCtlTiersListsAndClearsOnlyKvdocksOwn(t *testing.T) {
	const token = "tiers-token"
	r := redisserver.Start(t, redisserver.Options{})
	dir := t.TempDir()
	fsTier, _ := json.Marshal(map[string]any{"type": "fs", "base_path": dir, "max_capacity_gb": 1})
	respTier, _ := json.Marshal(map[string]any{"type": "resp", "host": "127.0.0.1", "port": r.Port})
	srv := harness.Start(t, "--chunk-size", "16", "--http-token", token, "--l2-adapter", string(fsTier), "--l2-adapter", string(respTier))
	rw := newRealWorker(t, srv, 4, 2)
	want := 4 * rw.chunks
	poll.Until(t, 30*time.Second, "both tiers hold the worker's chunks", func() bool {
		d := liveStatus(t, srv.HTTPPort)
		return len(d.Tiers) == 2 && d.Tiers[0].Objects == int64(want) && d.Tiers[1].Objects == int64(want)
	})
	foreignFile := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(foreignFile, []byte("not kvdock's"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.Do(ctx, "SET", "other:app:key", "theirs"); err != nil {
		t.Fatal(err)
	}
	env := []string{"KVDOCK_PORT=" + strconv.Itoa(srv.Port), "KVDOCK_HTTP_PORT=" + strconv.Itoa(srv.HTTPPort)}
	withToken := append([]string{"KVDOCK_HTTP_TOKEN=" + token}, env...)

	code, out, stderr := kvdock(t, env, "ctl", "tiers")
	if code != 0 || !strings.Contains(out, fmt.Sprintf("tier 0  fs  %s  up  %d object(s)", dir, want)) ||
		!strings.Contains(out, fmt.Sprintf("tier 1  resp  127.0.0.1:%d  up  %d object(s)", r.Port, want)) {
		t.Fatalf("ctl tiers: exit %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = kvdock(t, env, "ctl", "tiers", "--tier", "fs", "--keys", "3")
	if code != 0 || strings.Count(out, "@real-model@") != 3 || !strings.Contains(out, fmt.Sprintf("… %d more", want-3)) || strings.Contains(out, "resp") {
		t.Fatalf("ctl tiers --tier fs --keys 3: exit %d\n%s%s", code, out, stderr)
	}

	if code, out, stderr = kvdock(t, withToken, "ctl", "clear", "--tier", "fs"); code != 2 || !strings.Contains(stderr, "--yes") {
		t.Fatalf("clear --tier without a terminal or --yes: exit %d\n%s%s", code, out, stderr)
	}
	if code, out, stderr = kvdock(t, env, "ctl", "clear", "--tier", "fs", "--yes"); code != 1 || !strings.Contains(stderr, "token") {
		t.Fatalf("clear --tier without the token: exit %d\n%s%s", code, out, stderr)
	}
	if code, out, stderr = kvdock(t, withToken, "ctl", "clear", "--tier", "nosuch", "--yes"); code != 1 || !strings.Contains(stderr, `tier "nosuch"`) {
		t.Fatalf("clear --tier nosuch: exit %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = kvdock(t, withToken, "ctl", "clear", "--tier", "fs", "--yes")
	if code != 0 || !strings.Contains(out, fmt.Sprintf("tier 0 (fs %s): cleared %d objects", dir, want)) || strings.Contains(out, "L1:") {
		t.Fatalf("clear --tier fs: exit %d\n%s%s", code, out, stderr)
	}
	files := fsObjects(t, dir)
	if _, ok := files[foreignFile]; !ok {
		t.Fatalf("the clear removed a file that is not kvdock's: %v", files)
	}
	for f := range files {
		if f != foreignFile && filepath.Base(f) != ".kvdock.lock" {
			t.Fatalf("a chunk file is left after the fs tier's clear: %s", f)
		}
	}
	if n := len(redisObjects(t, r.Addr)); n < want+1 {
		t.Fatalf("clearing the fs tier touched Redis: %d keys left", n)
	}

	code, out, stderr = kvdock(t, withToken, "ctl", "clear", "--tier", "all", "--yes")
	if code != 0 || !strings.Contains(out, "L1: cleared ") || !strings.Contains(out, fmt.Sprintf("tier 1 (resp 127.0.0.1:%d): cleared %d objects", r.Port, want)) {
		t.Fatalf("clear --tier all: exit %d\n%s%s", code, out, stderr)
	}
	keys := redisObjects(t, r.Addr)
	if _, ok := keys["other:app:key"]; !ok || len(keys) != 1 {
		t.Fatalf("after clearing the resp tier, Redis holds %d keys (want only the foreign one): %v", len(keys), keys)
	}
	d := liveStatus(t, srv.HTTPPort)
	if d.Pool.Objects != 0 || d.Tiers[0].Objects != 0 || d.Tiers[1].Objects != 0 {
		t.Fatalf("after clear --tier all: pool %d objects, tiers %+v", d.Pool.Objects, d.Tiers)
	}
	for p, h := range rw.hits(t) {
		if h != 0 {
			t.Fatalf("prompt %d: %d hits after every tier and L1 were cleared", p, h)
		}
	}
}
