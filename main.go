// Command kvdock serves LLM inference workers as a local KV-cache appliance,
// wire-compatible with the LMCache multiprocess cache server for non-CUDA
// workers. main assembles the faces: the appliance (dashboard or headless),
// ctl, bench and config.
package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"kvdock/core/rpc"
	"kvdock/settings"
	"kvdock/ui/bench"
	"kvdock/ui/configcmd"
	"kvdock/ui/ctl"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `kvdock: a local KV-cache appliance for LMCache MP workers (non-CUDA).

Usage:
  kvdock [flags]              run the appliance (dashboard on a terminal, else headless)
  kvdock serve [flags]        the same, explicitly
  kvdock ctl COMMAND [flags]  talk to a running kvdock (ping, noop, chunk-size, clear, end-session, unregister, reset-stats, restart, status)
  kvdock bench [flags]        measure store/retrieve throughput and round trips against memcpy and a raw ZMQ echo
  kvdock config COMMAND       init | show [--sources] | check PATH
  kvdock version              print the version, the commit it was built from and its date
  kvdock help [COMMAND]       this text, or a command's flags

  kvdock --version, -v        the same as kvdock version
  kvdock --help, -h           this text

Flags people start with (a KVDOCK_* variable or the settings file sets each too):
  --config PATH               settings file (default ~/.config/kvdock/config.yaml when it exists)
  --host ADDR                 address the ZMQ server binds (default %s)
  --port N                    TCP port of the ZMQ server (default %d)
  --protocol NAME             the workers' LMCache wire table: %s (default), ..., rpc-messages, or auto
  --shm-name NAME             shared-memory segment; "" = SHM off (pickle fallback); unset = auto
  --l1-size-gb GIB            L1 pool size in GiB (default %g)
  --eviction-policy NAME      %s (default), LRU or noop
  --l2-adapter JSON           an L2 tier, e.g. '{"type": "fs", "base_path": "/data/l2"}' (repeatable)
  --http-port N               the HTTP API: status, metrics, ctl (default %d; 0 = off)
  --headless                  run without the dashboard, logging to stderr
  --log-level LEVEL           debug, info, warn or error (default %s)

Run "kvdock serve --help" for all %d setting flags with their defaults and env variables.
`

// usageText is usage with the defaults filled in from the settings, so the
// text cannot drift from them.
func usageText() string {
	d := settings.Default()
	return fmt.Sprintf(usage, d.Server.Host, d.Server.Port, d.Server.Protocol, d.L1.SizeGB, d.Eviction.Policy,
		d.HTTP.Port, d.Log.Level, len(settings.Keys()))
}

func run(args []string, stdout, stderr io.Writer) int {
	// Alone and without a command, these are about kvdock itself, not
	// about serve's flags (kvdock serve --help lists those).
	if len(args) == 1 {
		switch args[0] {
		case "--version", "-v":
			return printVersion(stdout)
		case "--help", "-h":
			fmt.Fprint(stdout, usageText())
			return 0
		}
	}
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		rpc.SpareProc(os.Getenv)
		return serve(args, stdout, stderr)
	case "ctl":
		return ctl.Run(args, ctl.Env{Stdin: os.Stdin, Stdout: stdout, Stderr: stderr, Environ: os.Environ(),
			Terminal: isTerminal(os.Stdin) && isTerminal(os.Stderr)})
	case "bench":
		rpc.SpareProc(os.Getenv) // the engine it starts is the one serve runs
		return bench.Run(args, stdout, stderr)
	case "config":
		return configcmd.Run(args, stdout, stderr, os.Environ())
	case "version":
		switch {
		case len(args) == 1 && (args[0] == "--help" || args[0] == "-h"):
			fmt.Fprintln(stdout, "usage: kvdock version")
			return 0
		case len(args) > 0:
			fmt.Fprintf(stderr, "kvdock version: takes no arguments (got %q)\nusage: kvdock version\n", strings.Join(args, " "))
			return 2
		}
		return printVersion(stdout)
	case "help":
		switch {
		case len(args) == 0 || len(args) == 1 && (args[0] == "--help" || args[0] == "-h"):
			fmt.Fprint(stdout, usageText())
			return 0
		case len(args) > 1 || strings.HasPrefix(args[0], "-"):
			fmt.Fprintf(stderr, "kvdock help: takes one command name (got %q)\nusage: kvdock help [COMMAND]\n", strings.Join(args, " "))
			return 2
		}
		return run([]string{args[0], "--help"}, stdout, stderr)
	default:
		fmt.Fprintf(stderr, "kvdock: unknown command %q\n\n%s", cmd, usageText())
		return 2
	}
}

// plainValue undoes the quotes settings.Diff puts around strings: the log
// handler quotes a value itself where it needs to, and twice reads as
// old="\"info\"".
func plainValue(s string) string {
	if u, err := strconv.Unquote(s); err == nil && strings.HasPrefix(s, `"`) {
		return u
	}
	return s
}
