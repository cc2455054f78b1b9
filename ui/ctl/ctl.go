// Package ctl is `kvdock ctl`: one-shot management requests (ping, noop,
// chunk-size, clear, end-session) sent to a running kvdock, or any LMCache MP
// server, over its ZMQ endpoint with the Go client, and status (and clear's
// counts) over kvdock's HTTP API. Like serve, it takes the server's address
// from the settings layers: defaults < settings file < KVDOCK_* < flags.
package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"kvdock/assets"
	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/settings"
)

const usage = `usage: kvdock ctl [flags] COMMAND

Commands:
  ping              PING the server (prints true)
  noop              NOOP round trip (prints OK)
  chunk-size        print the server chunk size (GET_CHUNK_SIZE)
  clear             clear the L1 cache and print what went (asks first on a terminal; --yes skips)
  end-session ID    END_SESSION for request id ID
  unregister ID     remove worker instance ID: its context goes, its pending stores are
                    aborted (HTTP API; asks first on a terminal; --yes skips)
  status            the engine's /status as a table (HTTP API; see kvdock ctl status --help)
  reset-stats       start the hit ratio, tokens saved, miss breakdown and what-if again
                    from now, e.g. after a benchmark (HTTP API; the cache is untouched)
  restart           restart the server in place keeping its cache, as SIGUSR2 does, and
                    print what the new process adopted (HTTP API; asks first on a
                    terminal; --yes skips)

The server's address comes from the same settings as kvdock serve's: the
settings file (--config, $KVDOCK_CONFIG, the default path), KVDOCK_HOST,
KVDOCK_PORT, KVDOCK_PROTOCOL, KVDOCK_HTTP_HOST, KVDOCK_HTTP_PORT,
KVDOCK_HTTP_TOKEN, then these flags.

Flags:
`

// usageLine is the one line printed under a usage error.
const usageLine = "usage: kvdock ctl [flags] ping|noop|chunk-size|clear|end-session ID|unregister ID|status|reset-stats|restart (kvdock ctl --help for more)"

// Env is what ctl reads and writes besides its arguments; main passes the
// process's own.
type Env struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Environ is "NAME=value" pairs: KVDOCK_* settings, KVDOCK_CONFIG and
	// the variables of the default settings path ($XDG_CONFIG_HOME, $HOME).
	Environ []string
	// Terminal reports that Stdin and Stderr are a terminal: clear asks
	// there before it clears, and refuses without --yes anywhere else.
	Terminal bool
}

// flagSet holds the flags of ctl (and of ctl status, which hides the
// ZMQ ones).
type flagSet struct {
	fs      *pflag.FlagSet
	timeout *time.Duration
	yes     *bool
	json    *bool
}

// newFlags registers ctl's flags on a set named name. The setting flags
// keep serve's names so settings.Load reads them as the flag layer.
func newFlags(name string) flagSet {
	def := settings.Default()
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.String(settings.ConfigFlag, "", "settings file (default $XDG_CONFIG_HOME/kvdock/config.yaml when it exists) ["+settings.EnvConfig+"]")
	fs.String("host", def.Server.Host, "server host [KVDOCK_HOST]")
	fs.Int("port", def.Server.Port, "server ZMQ port [KVDOCK_PORT]")
	fs.String("protocol", def.Server.Protocol, "protocol profile: "+strings.Join(assets.ProtocolNames(), ", ")+" [KVDOCK_PROTOCOL]")
	fs.String("http-host", def.HTTP.Host, "host of kvdock's HTTP API [KVDOCK_HTTP_HOST]")
	fs.Int("http-port", def.HTTP.Port, "port of kvdock's HTTP API, for status and clear's counts (0: clear over ZMQ, without counts) [KVDOCK_HTTP_PORT]")
	fs.String("http-token", "", "bearer token of kvdock's HTTP API, for clear (better KVDOCK_HTTP_TOKEN: a flag shows in ps) [KVDOCK_HTTP_TOKEN]")
	return flagSet{
		fs:      fs,
		timeout: fs.Duration("timeout", 5*time.Second, "how long to wait for the reply"),
		yes:     fs.Bool("yes", false, "clear: do not ask for confirmation"),
		json:    fs.Bool("json", false, "status: print the /status document as JSON"),
	}
}

// parse parses args. done reports that Run should return code: after
// --help (0) or a parse error, printed with the usage line (2).
func (f flagSet) parse(args []string, stderr io.Writer, help func(), line string) (code int, done bool) {
	f.fs.SetOutput(io.Discard) // errors are printed below, once
	f.fs.Usage = func() {}
	err := f.fs.Parse(args)
	switch {
	case errors.Is(err, pflag.ErrHelp):
		help()
		return 0, true
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v\n%s\n", f.fs.Name(), err, line)
		return 2, true
	}
	return 0, false
}

// load resolves the settings layers with the parsed flags. It fails only
// on problems with the keys ctl reads: the others are serve's to report,
// and a client need not share the server's view of, say, free memory.
func (f flagSet) load(env Env) (settings.Config, error) {
	ctlKeys := []string{"server.host", "server.port", "server.protocol", "http.host", "http.port", "http.token"}
	l, err := settings.Load(settings.LoadOptions{Flags: f.fs, Environ: env.Environ})
	var ve *settings.ValidationError
	if errors.As(err, &ve) && l != nil {
		var mine []settings.Problem
		for _, p := range ve.Problems {
			for _, k := range ctlKeys {
				if p.Key == k {
					mine = append(mine, p)
				}
			}
		}
		if len(mine) == 0 {
			return l.Config, nil
		}
		return settings.Config{}, &settings.ValidationError{Problems: mine}
	}
	if err != nil {
		return settings.Config{}, err
	}
	return l.Config, nil
}

// Run executes one ctl command and returns the process exit code: 0 success,
// 1 the request failed or timed out (or a clear was declined), 2 usage or
// settings error.
func Run(args []string, env Env) int {
	if len(args) > 0 && args[0] == "status" {
		// status talks to the HTTP API and has a help of its own.
		return Status(args[1:], env)
	}
	f := newFlags("kvdock ctl")
	help := func() {
		fmt.Fprint(env.Stdout, usage)
		fmt.Fprint(env.Stdout, f.fs.FlagUsages())
	}
	if code, done := f.parse(args, env.Stderr, help, usageLine); done {
		return code
	}
	rest := f.fs.Args()
	if len(rest) == 0 {
		fmt.Fprintf(env.Stderr, "kvdock ctl: no command given\n%s\n", usageLine)
		return 2
	}
	cmd, params := rest[0], rest[1:]
	if cmd == "status" {
		return runStatus(f, params, env)
	}
	switch cmd {
	case "unregister":
		return runUnregister(f, params, env)
	case "reset-stats":
		return runResetStats(f, params, env)
	case "restart":
		return runRestart(f, params, env)
	}
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
			fmt.Fprintf(env.Stderr, "kvdock ctl: end-session takes exactly one request id\n%s\n", usageLine)
			return 2
		}
		name, callArgs, params = protocol.EndSession, []any{params[0]}, nil
	default:
		fmt.Fprintf(env.Stderr, "kvdock ctl: unknown command %q\n%s\n", cmd, usageLine)
		return 2
	}
	if len(params) > 0 {
		fmt.Fprintf(env.Stderr, "kvdock ctl: %s takes no arguments (got %q)\n%s\n", cmd, strings.Join(params, " "), usageLine)
		return 2
	}
	if *f.timeout <= 0 {
		fmt.Fprintf(env.Stderr, "kvdock ctl: --timeout %v must be positive\n", *f.timeout)
		return 2
	}
	// --yes elsewhere is harmless (nothing else asks); --json would promise
	// output that only status gives.
	if f.fs.Changed("json") {
		fmt.Fprintf(env.Stderr, "kvdock ctl: --json applies only to status\n%s\n", usageLine)
		return 2
	}
	cfg, err := f.load(env)
	if err != nil {
		fmt.Fprintf(env.Stderr, "kvdock ctl: %v\n", err)
		return 2
	}
	if cmd == "clear" {
		return runClear(cfg, f, env)
	}
	prof, err := protocol.Load(cfg.Server.ClientProtocol(), assets.Protocol)
	if err != nil {
		fmt.Fprintf(env.Stderr, "kvdock ctl: --protocol: %v\n", err)
		return 2
	}
	r, addr, err := call(cfg, prof, *f.timeout, name, callArgs...)
	if err != nil {
		explainCallError(env.Stderr, cmd, addr, prof.Name, *f.timeout, err)
		return 1
	}
	return printReply(env.Stdout, env.Stderr, cmd, callArgs, r)
}

// call sends one request to the ZMQ endpoint of cfg and returns the reply
// and the address it dialled.
func call(cfg settings.Config, prof *protocol.Profile, timeout time.Duration, name string, args ...any) (client.Reply, string, error) {
	addr := settings.DialAddr(cfg.Server.Host, cfg.Server.Port)
	c, err := client.Dial("tcp://"+addr, prof, client.Options{Timeout: timeout})
	if err != nil {
		return client.Reply{}, addr, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := c.Call(ctx, name, args...)
	return r, addr, err
}

// explainCallError prints a failed call; a timeout gets the usual causes.
func explainCallError(stderr io.Writer, cmd, addr, profile string, timeout time.Duration, err error) {
	if errors.Is(err, client.ErrTimeout) {
		fmt.Fprintf(stderr, "kvdock ctl: %s: the server did not answer within %v.\n"+
			"Check that kvdock is running and listening on %s (--host/--port), and that\n"+
			"--protocol %s matches the server's profile (a mismatched profile is dropped silently).\n",
			cmd, timeout, addr, profile)
		return
	}
	fmt.Fprintf(stderr, "kvdock ctl: %s: %v\n", cmd, err)
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
	case "end-session":
		fmt.Fprintf(stdout, "ended session %s\n", args[0])
	}
	return 0
}
