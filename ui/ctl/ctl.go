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
	"slices"
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
  clear             clear the L1 cache and print what went (asks first on a terminal; --yes skips);
                    with --tier l1|l2|all|N, the L1 pool, every L2 tier, both, or tier N
                    (index or type), only kvdock's own files and keys (HTTP API)
  tiers             each L2 tier's state and objects; --keys N lists up to N keys of each
                    (HTTP API; --tier N picks one)
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
KVDOCK_HTTP_TOKEN, then these flags. With the protocol left unset, ctl
reads the server's from its /status. Every command takes every flag, so one
alias (kvdock ctl --port 5655 --http-port 8155) serves them all.

Flags:
`

// usageLine is the one line printed under a usage error.
const usageLine = "usage: kvdock ctl [flags] ping|noop|chunk-size|clear [--tier l1|l2|all|N]|end-session ID|unregister ID|status|reset-stats|restart|tiers (kvdock ctl --help for more)"

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
	tier    *string
	keys    *int
}

// newFlags registers ctl's flags on a set named name. The setting flags
// keep serve's names so settings.Load reads them as the flag layer.
func newFlags(name string) flagSet {
	def := settings.Default()
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.String(settings.ConfigFlag, "", "settings file (default $XDG_CONFIG_HOME/kvdock/config.yaml when it exists) ["+settings.EnvConfig+"]")
	fs.String("host", def.Server.Host, "server host [KVDOCK_HOST]")
	fs.Int("port", def.Server.Port, "server ZMQ port [KVDOCK_PORT]")
	fs.String("protocol", def.Server.Protocol, "the server's protocol profile: "+strings.Join(assets.ProtocolNames(), ", ")+", or "+settings.ProtocolAuto+
		"; unset: the one the server's /status names (else "+def.Server.Protocol+") [KVDOCK_PROTOCOL]")
	fs.String("http-host", def.HTTP.Host, "host of kvdock's HTTP API [KVDOCK_HTTP_HOST]")
	fs.Int("http-port", def.HTTP.Port, "port of kvdock's HTTP API, for status and clear's counts (0: clear over ZMQ, without counts) [KVDOCK_HTTP_PORT]")
	fs.String("http-token", "", "bearer token of kvdock's HTTP API, for clear (better KVDOCK_HTTP_TOKEN: a flag shows in ps) [KVDOCK_HTTP_TOKEN]")
	return flagSet{
		fs:      fs,
		timeout: fs.Duration("timeout", 5*time.Second, "how long to wait for the reply"),
		yes:     fs.Bool("yes", false, "clear: do not ask for confirmation"),
		json:    fs.Bool("json", false, "status: print the /status document as JSON"),
		tier:    fs.String("tier", "", "clear: what to clear, l1, l2 (every L2 tier), all, or one tier by index or type; tiers: the tier to list"),
		keys:    fs.Int("keys", 0, "tiers: list up to this many keys of each tier"),
	}
}

// noArgs reports whether params is empty, and says on stderr that cmd takes
// no arguments when it is not.
func noArgs(env Env, cmd string, params []string) bool {
	if len(params) > 0 {
		fmt.Fprintf(env.Stderr, "kvdock ctl: %s takes no arguments (got %q)\n%s\n", cmd, strings.Join(params, " "), usageLine)
		return false
	}
	return true
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
		fmt.Fprintf(stderr, "%s: %v%s\n%s\n", f.fs.Name(), err, settings.FlagHint(f.fs, err), line)
		return 2, true
	}
	return 0, false
}

// load resolves the settings layers with the parsed flags. It fails only
// on problems with the keys ctl reads: the others are serve's to report,
// and a client need not share the server's view of, say, free memory.
func (f flagSet) load(env Env) (settings.Config, error) {
	l, err := f.loadSources(env)
	if err != nil {
		return settings.Config{}, err
	}
	return l.Config, nil
}

// loadSources is load with where each value came from.
func (f flagSet) loadSources(env Env) (*settings.Loaded, error) {
	ctlKeys := []string{"server.host", "server.port", "server.protocol", "server.protocol_auto_default", "http.host", "http.port", "http.token"}
	l, err := settings.Load(settings.LoadOptions{Flags: f.fs, Environ: env.Environ})
	var ve *settings.ValidationError
	if errors.As(err, &ve) && l != nil {
		var mine []settings.Problem
		for _, p := range ve.Problems {
			if slices.Contains(ctlKeys, p.Key) {
				mine = append(mine, p)
			}
		}
		if len(mine) == 0 {
			return l, nil
		}
		return nil, &settings.ValidationError{Problems: mine}
	}
	if err != nil {
		return nil, err
	}
	return l, nil
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
	case "tiers":
		return runTiers(f, params, env)
	}
	r := wireRequest{cmd: cmd}
	switch cmd {
	case "ping":
		r.name = protocol.Ping
	case "noop":
		r.name = protocol.Noop
	case "chunk-size":
		r.name = protocol.GetChunkSize
	case "clear":
		r.name = protocol.Clear
	case "end-session":
		if len(params) != 1 {
			fmt.Fprintf(env.Stderr, "kvdock ctl: end-session takes exactly one request id\n%s\n", usageLine)
			return 2
		}
		r.name, r.params, params = protocol.EndSession, params, nil
	default:
		fmt.Fprintf(env.Stderr, "kvdock ctl: unknown command %q%s\n%s\n", cmd, settings.DidYouMean("", cmd, commands()), usageLine)
		return 2
	}
	if !noArgs(env, cmd, params) {
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
	l, err := f.loadSources(env)
	if err != nil {
		fmt.Fprintf(env.Stderr, "kvdock ctl: %v\n", err)
		return 2
	}
	cfg := l.Config
	if cmd == "clear" {
		return runClear(l, r, f, env)
	}
	t := targetOf(cfg, l.Sources["server.protocol"], *f.timeout)
	reply, code := callWire(cfg, t, r, *f.timeout, env.Stderr)
	if code != 0 {
		return code
	}
	return printReply(env.Stdout, env.Stderr, r, reply)
}

// commands are ctl's commands, for "did you mean".
func commands() []string {
	return []string{"ping", "noop", "chunk-size", "clear", "end-session", "unregister", "status", "reset-stats", "restart", "tiers"}
}

// callWire sends r to the ZMQ endpoint of cfg in t's table and returns the
// reply, or the exit status (the problem printed): 2 when ctl cannot say
// r in that table, 1 when the call failed.
func callWire(cfg settings.Config, t wireTarget, r wireRequest, timeout time.Duration, stderr io.Writer) (client.Reply, int) {
	c, err := t.call(r)
	if err != nil {
		fmt.Fprintf(stderr, "kvdock ctl: --protocol %s (%s): %v\n", t.profile, t.how, err)
		return client.Reply{}, 2
	}
	reply, addr, err := call(cfg, c, timeout)
	if err != nil {
		explainCallError(stderr, cfg, r.cmd, addr, t, c.prof.Name, timeout, err)
		return client.Reply{}, 1
	}
	return reply, 0
}

// call sends c to the ZMQ endpoint of cfg and returns the reply and the
// address it dialled.
func call(cfg settings.Config, c wireCall, timeout time.Duration) (client.Reply, string, error) {
	addr := settings.DialAddr(cfg.Server.Host, cfg.Server.Port)
	cl, err := client.Dial("tcp://"+addr, c.prof, client.Options{Timeout: timeout})
	if err != nil {
		return client.Reply{}, addr, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := cl.Call(ctx, c.spec.Name, c.args...)
	return r, addr, err
}

// explainCallError prints a failed call. A timeout says what the server's
// /status tells of its table, when it answers: a server drops a request
// it reads under another table without an answer.
func explainCallError(stderr io.Writer, cfg settings.Config, cmd, addr string, t wireTarget, sent string, timeout time.Duration, err error) {
	if !errors.Is(err, client.ErrTimeout) {
		fmt.Fprintf(stderr, "kvdock ctl: %s: %v\n", cmd, err)
		return
	}
	fmt.Fprintf(stderr, "kvdock ctl: %s: no answer from %s within %v (sent as %s, --protocol %s %s).\n", cmd, addr, timeout, sent, t.profile, t.how)
	s, ok := serverProtocol(cfg, min(timeout, discoverWait))
	switch {
	case !ok:
		fmt.Fprintf(stderr, "Check that kvdock is running and listening on %s (--host/--port), and that it speaks\n"+
			"--protocol %s: a server drops a request of another table without an answer. Its /status\n"+
			"(--http-port) names its table; with --protocol unset ctl reads it there.\n", addr, t.profile)
	case s.Protocol != t.profile:
		fmt.Fprintf(stderr, "The server speaks %s (its /status says): pass --protocol %s, or leave --protocol unset.\n", s.Protocol, s.Protocol)
	default:
		fmt.Fprintf(stderr, "The server speaks %s as well (its /status says): its log says why the request went unanswered.\n", s.Protocol)
	}
}

func printReply(stdout, stderr io.Writer, req wireRequest, r client.Reply) int {
	switch req.cmd {
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
		fmt.Fprintf(stdout, "ended session %s\n", req.params[0])
	}
	return 0
}
