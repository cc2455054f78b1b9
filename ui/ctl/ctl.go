// Package ctl is `kvdock ctl`: one-shot management requests (ping, noop,
// chunk-size, clear, end-session) sent to a running kvdock, or any LMCache MP
// server, over its ZMQ endpoint with the Go client.
package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"kvdock/assets"
	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
)

const usage = `usage: kvdock ctl [flags] COMMAND

Commands:
  ping              PING the server (prints true)
  noop              NOOP round trip (prints OK)
  chunk-size        print the server chunk size (GET_CHUNK_SIZE)
  clear             clear the L1 cache (CLEAR)
  end-session ID    END_SESSION for request id ID
  status            the engine's /status as a table (HTTP API; see kvdock ctl status --help)

Flags:
`

// Run executes one ctl command and returns the process exit code: 0 success,
// 1 the request failed or timed out, 2 usage error.
func Run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "status" {
		// status talks to the HTTP API and has flags of its own.
		return Status(args[1:], stdout, stderr)
	}
	fs := pflag.NewFlagSet("kvdock ctl", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	host := fs.String("host", "localhost", "server host")
	port := fs.Int("port", 5555, "server ZMQ port")
	proto := fs.String("protocol", "nongpu-v1", "protocol profile: "+strings.Join(assets.ProtocolNames(), ", "))
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the reply")
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return 2
	}
	cmd, params := rest[0], rest[1:]
	var name string
	var callArgs []any
	switch cmd {
	case "ping":
		name = protocol.Ping
	case "noop":
		name = protocol.Noop
	case "chunk-size":
		name = protocol.GetChunkSize
	case "clear":
		name = protocol.Clear
	case "end-session":
		if len(params) != 1 {
			fmt.Fprintln(stderr, "kvdock ctl: end-session takes exactly one request id")
			return 2
		}
		name, callArgs, params = protocol.EndSession, []any{params[0]}, nil
	default:
		fmt.Fprintf(stderr, "kvdock ctl: unknown command %q\n", cmd)
		fs.Usage()
		return 2
	}
	if len(params) > 0 {
		fmt.Fprintf(stderr, "kvdock ctl: %s takes no arguments (got %q)\n", cmd, strings.Join(params, " "))
		return 2
	}
	if *timeout <= 0 {
		fmt.Fprintf(stderr, "kvdock ctl: --timeout %v must be positive\n", *timeout)
		return 2
	}
	if *port <= 0 || *port > 65535 {
		fmt.Fprintf(stderr, "kvdock ctl: --port %d out of range 1-65535\n", *port)
		return 2
	}
	prof, err := assets.Profile(*proto)
	if err != nil {
		fmt.Fprintf(stderr, "kvdock ctl: --protocol: %v\n", err)
		return 2
	}
	h := *host
	if h == "localhost" {
		h = "127.0.0.1"
	}
	addr := h + ":" + strconv.Itoa(*port)
	if strings.Contains(h, ":") {
		addr = "[" + h + "]:" + strconv.Itoa(*port)
	}
	c, err := client.Dial("tcp://"+addr, prof, client.Options{Timeout: *timeout})
	if err != nil {
		fmt.Fprintf(stderr, "kvdock ctl: %v\n", err)
		return 1
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	r, err := c.Call(ctx, name, callArgs...)
	if err != nil {
		if errors.Is(err, client.ErrTimeout) {
			fmt.Fprintf(stderr, "kvdock ctl: %s: the server did not answer within %v.\n"+
				"Check that kvdock is running and listening on %s (--host/--port), and that\n"+
				"--protocol %s matches the server's profile (a mismatched profile is dropped silently).\n",
				cmd, *timeout, addr, prof.Name)
			return 1
		}
		fmt.Fprintf(stderr, "kvdock ctl: %s: %v\n", cmd, err)
		return 1
	}
	return printReply(stdout, stderr, cmd, callArgs, r)
}

func printReply(stdout, stderr io.Writer, cmd string, args []any, r client.Reply) int {
	switch cmd {
	case "ping":
		var ok bool
		if err := r.Decode(&ok); err != nil {
			fmt.Fprintf(stderr, "kvdock ctl: ping: %v\n", err)
			return 1
		}
		fmt.Fprintln(stdout, ok)
		if !ok {
			return 1
		}
	case "noop":
		var s string
		if err := r.Decode(&s); err != nil {
			fmt.Fprintf(stderr, "kvdock ctl: noop: %v\n", err)
			return 1
		}
		fmt.Fprintln(stdout, s)
	case "chunk-size":
		var n int64
		if err := r.Decode(&n); err != nil {
			fmt.Fprintf(stderr, "kvdock ctl: chunk-size: %v\n", err)
			return 1
		}
		fmt.Fprintln(stdout, n)
	case "clear":
		fmt.Fprintln(stdout, "cleared")
	case "end-session":
		fmt.Fprintf(stdout, "ended session %s\n", args[0])
	}
	return 0
}
