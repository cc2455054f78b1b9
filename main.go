// Command kvdock serves LLM inference workers as a local KV-cache appliance,
// wire-compatible with the LMCache multiprocess cache server for non-CUDA
// workers. main assembles the faces: the appliance (dashboard or headless),
// ctl, bench and config.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"kvdock/core/engine"
	"kvdock/core/logcap"
	"kvdock/core/portholder"
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

// signalName is "SIGTERM" for SIGTERM (its String is "terminated").
func signalName(sig os.Signal) string {
	if s, ok := sig.(syscall.Signal); ok && unix.SignalName(s) != "" {
		return unix.SignalName(s)
	}
	return sig.String()
}

// shutdown stops the engine within a bounded time; a second SIGINT or
// SIGTERM exits at once.
func shutdown(eng *engine.Engine, sigs <-chan os.Signal, logger *slog.Logger, why string) int {
	logger.Info("stopping", "cause", why)
	// The engine bounds its own drain; this only guards against a stop
	// that hangs past what it needs (drain + closing the pool).
	ctx, cancel := context.WithTimeout(context.Background(), engine.StopTimeout)
	defer cancel()
	done := make(chan error, 1)
	stop := eng.Stop
	if cfg, _ := eng.Config(); cfg.L1.KeepOnExit {
		// l1.keep_on_exit: the next start adopts the pool.
		stop = eng.StopKeeping
	}
	go func() { done <- stop(ctx) }()
	for {
		select {
		case err := <-done:
			if err != nil {
				logger.Warn("stopped with errors", "err", err)
			}
			logger.Info("stopped")
			return 0
		case <-ctx.Done():
			// Exiting unmaps the pool safely; its name goes at the next
			// start's stale-segment cleanup.
			logger.Warn("stop did not finish in time: exiting", "timeout", engine.StopTimeout)
			return 1
		case s := <-sigs:
			if s == syscall.SIGHUP {
				continue
			}
			logger.Warn("second signal: exiting at once", "signal", s.String())
			return 130
		}
	}
}

// shmDir is where kvdock creates its pool segments.
const shmDir = "/dev/shm"

// keptNote says what a stop left in the shared-memory directory for the
// next start to adopt (l1.keep_on_exit), from the snapshot taken before the
// stop: the segment, the memory it holds and what it caches. "" when no
// segment was kept.
func keptNote(before engine.Snapshot, dir string) string {
	seg := before.Pool.Decision.Segment
	if !before.Config.L1.KeepOnExit || seg == "" {
		return ""
	}
	path := filepath.Join(dir, seg)
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("kept %s (%s of shared memory, %d object(s), %s cached) for the next start; rm it to free the memory",
		path, settings.BytesText(fi.Size()), before.Pool.Objects, settings.BytesText(before.Pool.ResidentBytes))
}

// portHint follows a start refused because port is taken: who holds the
// port, when /proc says (best effort), and the setting that moves kvdock
// elsewhere. "" for any other error.
func portHint(err error, port int, flag, others string) string {
	if !errors.Is(err, syscall.EADDRINUSE) && !strings.Contains(err.Error(), "address already in use") {
		return ""
	}
	who := "another process"
	if h, ok := portholder.Find("", port); ok {
		who = h.String()
	}
	return fmt.Sprintf("kvdock: port %d is held by %s; give kvdock another with %s (or %s)\n", port, who, flag, others)
}

// stopNow stops the engine on an error path, bounded like shutdown.
func stopNow(eng *engine.Engine) {
	ctx, cancel := context.WithTimeout(context.Background(), engine.StopTimeout)
	defer cancel()
	_ = eng.Stop(ctx)
}

// reload re-reads the settings (file, env, the original flags) and applies
// the difference; problems are logged and the running config kept.
func reload(ctx context.Context, eng *engine.Engine, opts settings.LoadOptions, logger *slog.Logger) {
	loaded, err := settings.Load(opts)
	if err != nil {
		logger.Error("SIGHUP: settings not reloaded", "err", err)
		return
	}
	logOverridden(loaded, logger)
	res, err := eng.Apply(ctx, loaded.Config, loaded.Sources)
	if err != nil {
		logger.Error("SIGHUP: apply failed", "err", err, "rolled_back", res.RolledBack)
		return
	}
	if len(res.Changes) == 0 {
		logger.Info("SIGHUP: settings unchanged")
		return
	}
	for _, c := range res.Changes {
		old, new := plainValue(c.Old), plainValue(c.New)
		if c.Class == settings.NextStart {
			logger.Warn("SIGHUP: takes effect when kvdock restarts", "key", c.Key, "old", old, "new", new)
			continue
		}
		logger.Info("SIGHUP: applied", "key", c.Key, "old", old, "new", new, "class", c.Class.String())
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

// newLogger builds the slog logger of cfg: text or JSON, to the log file
// when one is set, else to stderr.
func newLogger(cfg settings.LogConfig, level *slog.LevelVar, stderr io.Writer) (*slog.Logger, func(), error) {
	if err := level.UnmarshalText([]byte(cfg.Level)); err != nil {
		return nil, nil, fmt.Errorf("log level %q: %w", cfg.Level, err)
	}
	w, closer := stderr, func() {}
	if cfg.File != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.File), 0o755); err != nil {
			return nil, nil, fmt.Errorf("log file directory: %w", err)
		}
		f, err := os.OpenFile(cfg.File, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return nil, nil, fmt.Errorf("log file: %w", err)
		}
		w, closer = f, func() { _ = f.Close() }
	}
	hopts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(w, hopts)
	if cfg.Format == "json" {
		h = slog.NewJSONHandler(w, hopts)
	}
	// Peers put strings into log lines (names, ids, error texts): cut them
	// and rate-limit, in both faces.
	return slog.New(logcap.NewHandler(h, logcap.Options{})), closer, nil
}

// isTerminal reports whether f is a terminal (the dashboard needs one on
// stdin and stdout).
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// defaultLogFile is where the dashboard sends logs when --log-file is not
// set: $XDG_STATE_HOME/kvdock/kvdock.log, else ~/.local/state/kvdock/kvdock.log.
func defaultLogFile() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "kvdock", "kvdock.log")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "state", "kvdock", "kvdock.log")
	}
	return filepath.Join(os.TempDir(), "kvdock.log")
}

// applyMemoryLimit sets the Go heap's soft limit from the settings, so the
// garbage of large messages (pickle replies built in Go) is collected long
// before GOGC's doubling of the live heap would. A GOMEMLIMIT in the
// environment wins over the derived value (not over an explicit setting).
func applyMemoryLimit(sc settings.ServerConfig, env string, log *slog.Logger) int64 {
	if sc.GoMemoryLimitMB == 0 && env != "" {
		log.Info("go memory limit from GOMEMLIMIT", "value", env)
		return debug.SetMemoryLimit(-1)
	}
	limit := sc.GoMemoryLimit()
	debug.SetMemoryLimit(limit)
	log.Info("go memory limit", "bytes", limit, "derived", sc.GoMemoryLimitMB == 0)
	return limit
}
