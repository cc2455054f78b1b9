package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvdock/assets"
	"kvdock/core/engine"
	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/core/testkit/logbuf"
	"kvdock/settings"
	"kvdock/transfer/worker"
)

// TestHostileExecFailureServesOnWithThePool: the exec of a restart fails
// after the pool was kept (here E2BIG; in life the binary removed between
// the check and the exec). The process starts its engine again, adopting
// the pool it has just kept, and says why: the worker, on the same
// connection and mapping, reads what it stored (before, the restart
// returned exit 1 with the engine stopped and the pool left to the next
// start).
func TestHostileExecFailureServesOnWithThePool(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cfg := settings.Default()
	cfg.Server.Port = port
	cfg.Server.ChunkSize = 16
	cfg.Server.StateDir = filepath.Join(t.TempDir(), "state")
	name := fmt.Sprintf("exec_fail_%d", os.Getpid())
	cfg.Server.ShmName = &name
	cfg.L1.SizeGB = 16.0 / 1024
	cfg.L1.Prefault = false
	cfg.L1.KeepOnExit = true
	logs := &logbuf.Buffer{} // the wire server logs from its own goroutine
	logger := slog.New(slog.NewTextHandler(logs, nil))
	eng := engine.New(cfg, engine.Options{Logger: logger})
	ctx := context.Background()
	if err := eng.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Stop(context.Background()) })

	p, err := protocol.Load("nongpu-v1", assets.Protocol)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(fmt.Sprintf("tcp://127.0.0.1:%d", port), p, client.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w, err := worker.Register(ctx, c, worker.Config{InstanceID: 2305, Model: "exec-model", Layers: 2, Hidden: 16, Dtype: "float32"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	toks := make([]uint32, 2*w.ChunkTokens())
	for i := range toks {
		toks[i] = uint32(i*13 + 5)
	}
	chunk := func(j int) []byte { return bytes.Repeat([]byte{byte(j + 7)}, int(w.Layout().Bytes)) }
	if res, err := w.Store(ctx, w.Key(toks, 2, "s"), [][]byte{chunk(0), chunk(1)}); err != nil || !res.Committed {
		t.Fatalf("store: %+v %v", res, err)
	}

	// The exec is handed the listening socket, still listening with the
	// wire server stopped (the new image would serve on it); when it
	// fails, this process closes it and binds again.
	var keptFor string
	keptListening := false
	rs := restarter{eng: eng, logger: logger, sigs: make(chan os.Signal, 4),
		exec: func(_ string, _ []string, env []string) error {
			for _, kv := range env {
				if v, ok := strings.CutPrefix(kv, envListenerFD+"="); ok {
					fd, _ := strconv.Atoi(v)
					n, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
					keptListening = err == nil && n == 1
				}
				if v, ok := strings.CutPrefix(kv, envListenerFor+"="); ok {
					keptFor = v
				}
			}
			return syscall.E2BIG
		}}
	up, err := rs.handOver(ctx, "/kvdock/that/did/not/run", "test")
	if !up || err == nil || !strings.Contains(err.Error(), "argument list too long") {
		t.Fatalf("handOver: up %v, err %v\n%s", up, err, logs.String())
	}
	if !strings.Contains(logs.String(), "exec failed; serving again in this process") {
		t.Fatalf("the failed exec is not logged:\n%s", logs.String())
	}
	if want := fmt.Sprintf("tcp://127.0.0.1:%d", port); !keptListening || keptFor != want {
		t.Fatalf("the exec was not handed the listening socket: listening %v, kept for %q (want %q)", keptListening, keptFor, want)
	}
	if r := eng.Snapshot().Restart; !r.Adopted || r.Objects != 2 || r.Contexts != 1 {
		t.Fatalf("after the failed exec the engine did not adopt its kept pool: %+v\n%s", r, logs.String())
	}
	hits, err := worker.Scheduler{C: c}.Hits(ctx, w.LookupKey(toks, "r"), 1)
	if err != nil || hits != 2 {
		t.Fatalf("after the failed exec: %d hits (%v)", hits, err)
	}
	wrong := 0
	got, err := w.Retrieve(ctx, w.Key(toks, hits, "r"), func(j int, b []byte) {
		if !bytes.Equal(b, chunk(j)) {
			wrong++
		}
	})
	if err != nil || got != 2 || wrong != 0 {
		t.Fatalf("retrieve after the failed exec: %d chunks, %d wrong, %v", got, wrong, err)
	}
}

// TestListenerEnv: the exec's environment names the kept socket once,
// replacing a name an earlier image left; a new image takes the name out of
// its environment, and refuses one that names stdio or no number.
func TestListenerEnv(t *testing.T) {
	env := listenerEnv([]string{"A=1", envListenerFD + "=9", envListenerFor + "=tcp://old:1", "B=2"}, 12, "tcp://127.0.0.1:5555")
	want := []string{"A=1", "B=2", envListenerFD + "=12", envListenerFor + "=tcp://127.0.0.1:5555"}
	if strings.Join(env, " ") != strings.Join(want, " ") {
		t.Fatalf("env %q, want %q", env, want)
	}
	if env := listenerEnv([]string{envListenerFD + "=9", "A=1"}, -1, ""); strings.Join(env, " ") != "A=1" {
		t.Fatalf("env without a kept socket: %q", env)
	}
	// The settings do not take the names for settings (each was warned
	// about as naming none, at every restart).
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	loaded, err := settings.Load(settings.LoadOptions{Environ: settingsEnviron(
		[]string{envListenerFD + "=12", envListenerFor + "=tcp://127.0.0.1:5555", "XDG_CONFIG_HOME=" + os.Getenv("XDG_CONFIG_HOME")})})
	if err != nil || len(loaded.Warnings) != 0 {
		t.Fatalf("settings over an exec's environment: %v, warnings %q", err, loaded.Warnings)
	}
	logger := slog.New(slog.DiscardHandler)
	for _, v := range []string{"2", "x", "-4"} {
		t.Setenv(envListenerFD, v)
		t.Setenv(envListenerFor, "tcp://127.0.0.1:5555")
		if f, _ := inheritedListener(logger); f != nil {
			t.Errorf("%s=%s taken as a kept socket", envListenerFD, v)
		}
		if os.Getenv(envListenerFD) != "" || os.Getenv(envListenerFor) != "" {
			t.Errorf("%s=%s left in the environment", envListenerFD, v)
		}
	}
}
