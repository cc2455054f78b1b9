package ctl_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"kvdock/assets"
	"kvdock/core/protocol"
	"kvdock/core/rpc"
	"kvdock/ui/ctl"
)

func serve(t *testing.T) (port int, ended chan string) {
	t.Helper()
	b, _ := assets.Protocol("nongpu-v1")
	p, err := protocol.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := rpc.New(rpc.Options{Host: "127.0.0.1", Profile: p, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ended = make(chan string, 1)
	srv.Handle(protocol.Noop, func(context.Context, *rpc.Request) (any, error) { return "OK", nil })
	srv.Handle(protocol.Ping, func(context.Context, *rpc.Request) (any, error) { return true, nil })
	srv.Handle(protocol.GetChunkSize, func(context.Context, *rpc.Request) (any, error) { return 256, nil })
	srv.Handle(protocol.Clear, func(context.Context, *rpc.Request) (any, error) { return nil, nil })
	srv.Handle(protocol.EndSession, func(_ context.Context, r *rpc.Request) (any, error) {
		ended <- r.Args[0].(string)
		return nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	for srv.Endpoint() == "" {
		time.Sleep(time.Millisecond)
	}
	_, portStr, _ := net.SplitHostPort(strings.TrimPrefix(srv.Endpoint(), "tcp://"))
	port, _ = strconv.Atoi(portStr)
	return port, ended
}

func run(args ...string) (int, string, string) {
	return runEnv(ctl.Env{}, args...)
}

// runEnv runs ctl with env's Environ, Stdin and Terminal (no settings file
// unless Environ names one) and returns its exit code, stdout and stderr.
func runEnv(env ctl.Env, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	env.Stdout, env.Stderr = &out, &errb
	if env.Stdin == nil {
		env.Stdin = strings.NewReader("")
	}
	code := ctl.Run(args, env)
	return code, out.String(), errb.String()
}

func TestCommands(t *testing.T) {
	port, ended := serve(t)
	p := "--port=" + strconv.Itoa(port)
	for _, c := range []struct{ cmd, want string }{
		{"ping", "true\n"}, {"noop", "OK\n"}, {"chunk-size", "256\n"},
		{"clear", "cleared (over ZMQ CLEAR, which does not say what went: the HTTP API is off)\n"},
	} {
		code, out, errs := run(p, "--http-port=0", "--yes", c.cmd)
		if code != 0 || out != c.want {
			t.Errorf("%s: code %d out %q err %q", c.cmd, code, out, errs)
		}
	}
	code, out, _ := run("end-session", "req-7", p)
	if code != 0 || out != "ended session req-7\n" || <-ended != "req-7" {
		t.Errorf("end-session: %d %q", code, out)
	}
}

func TestTimeoutExplains(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens there now
	t0 := time.Now()
	code, _, errs := run("--port", strconv.Itoa(port), "--timeout", "300ms", "noop")
	if code != 1 {
		t.Fatalf("code %d", code)
	}
	for _, want := range []string{"no answer from 127.0.0.1:" + strconv.Itoa(port) + " within 300ms", "running and listening on 127.0.0.1:" + strconv.Itoa(port), "--protocol nongpu-v1"} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q: %s", want, errs)
		}
	}
	if time.Since(t0) > 3*time.Second {
		t.Errorf("took %v", time.Since(t0))
	}
}

func TestWrongProtocolTimesOut(t *testing.T) {
	port, _ := serve(t)
	// engine-driven NOOP is 21, which nongpu-v1 does not know: dropped.
	code, _, errs := run("--port", strconv.Itoa(port), "--protocol", "engine-driven", "--timeout", "300ms", "noop")
	if code != 1 || !strings.Contains(errs, "speaks\n--protocol engine-driven: a server drops a request of another table") {
		t.Errorf("code %d: %s", code, errs)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{}, {"bogus"}, {"end-session"}, {"ping", "extra"}, {"--protocol", "nope", "ping"}, {"--timeout", "0s", "ping"}} {
		if code, _, _ := run(args...); code != 2 {
			t.Errorf("%q: code %d, want 2", args, code)
		}
	}
}
