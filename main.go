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
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"kvdock/core/engine"
	"kvdock/core/gpu"
	"kvdock/core/hostmem"
	"kvdock/core/logcap"
	"kvdock/core/portholder"
	"kvdock/core/rpc"
	"kvdock/settings"
	"kvdock/ui/bench"
	"kvdock/ui/configcmd"
	"kvdock/ui/ctl"
	"kvdock/ui/dashboard"
	"kvdock/ui/httpapi"
	"kvdock/ui/metrics"
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

// serve runs the appliance until SIGINT/SIGTERM.
func serve(args []string, stdout, stderr io.Writer) int {
	// First of all: a re-executed image inherits SIGUSR2 and SIGHUP
	// ignored (restarter.handOver) and takes them back here.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR2)
	defer signal.Stop(sigs)

	fs := pflag.NewFlagSet("kvdock serve", pflag.ContinueOnError)
	fs.SetOutput(io.Discard) // ContinueOnError prints nothing useful; the error is printed below
	settings.RegisterFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stdout, "Usage: kvdock [serve] [flags]\n\nFlags (each also settable by its KVDOCK_* variable or the settings file):\n%s", fs.FlagUsages())
	}
	const serveLine = "usage: kvdock [serve] [flags] (kvdock serve --help lists every flag; kvdock help for the commands)"
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "kvdock: %v\n%s\n", err, serveLine)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvdock: unexpected arguments %q\n%s\n", fs.Args(), serveLine)
		return 2
	}
	loadOpts := settings.LoadOptions{Flags: fs, Environ: os.Environ()}
	loaded, err := loadStartable(loadOpts)
	if err != nil {
		fmt.Fprintf(stderr, "kvdock: %v\n", err)
		return 2
	}
	cfg := loaded.Config
	dash, logCfg := faceOf(cfg)
	level := new(slog.LevelVar)
	logger, closeLog, err := newLogger(logCfg, level, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "kvdock: %v\n", err)
		return 2
	}
	defer closeLog()
	for _, w := range loaded.Warnings {
		logger.Warn(w)
	}
	if loaded.File != "" {
		logger.Info("settings file", "path", loaded.File, "chosen_by", loaded.FileSource.String())
	}
	if t := rpc.TuneMalloc(); t.String() != "" {
		logger.Debug("malloc tuning", "result", t.String())
	}
	applyMemoryLimit(cfg.Server, os.Getenv("GOMEMLIMIT"), logger)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := metrics.New()
	var web *httpapi.Runner // set once the engine exists; OnApply runs only after Start
	gpuSrc := gpu.NewNVML(logger.With("component", "gpu"))
	defer gpuSrc.Close()
	eng := engine.New(cfg, engine.Options{
		GPU:      gpu.NewSampler(gpuSrc),
		Logger:   logger,
		LogLevel: level,
		Sources:  loaded.Sources,
		Version:  buildVersion(),
		Observer: m,
		Memory:   hostmem.Probe{},
		OnApply: func(_ context.Context, _, new settings.Config) error {
			return web.Restart(new.HTTP)
		},
	})
	m.Watch(eng)
	restarts := make(restartRequests, 1)
	rs := restarter{eng: eng, loadOpts: loadOpts, logger: logger, sigs: sigs, exec: syscall.Exec}
	// checkRestart is the restart's check, said where the operator looks:
	// a restart that is refused stops nothing.
	checkRestart := func(why string) (string, error) {
		path, err := rs.check()
		if err != nil {
			logger.Error("restart refused; serving on", "cause", why, "err", err)
			return "", fmt.Errorf("restart refused, serving on: %w", err)
		}
		return path, nil
	}
	askRestart := func() error {
		if _, err := checkRestart("kvdock ctl restart"); err != nil {
			return err
		}
		return restarts.ask()
	}
	// No token set: POST /restart still needs one, the local token written
	// in the state directory for kvdock ctl (ui/httpapi/localtoken.go).
	stateDir, _ := cfg.Server.StateDirPath(os.Getenv, os.UserHomeDir)
	web = httpapi.NewRunner(eng, httpapi.Options{Metrics: m, Logger: logger.With("component", "http"), Restart: askRestart, StateDir: stateDir})

	if err := eng.Start(ctx); err != nil {
		logger.Error("kvdock could not start", "err", err)
		fmt.Fprintf(stderr, "kvdock: could not start: %v\n%s", err, portHint(err, cfg.Server.Port, "--port", "KVDOCK_PORT, server.port"))
		return 1
	}
	if err := web.Start(ctx, cfg.HTTP); err != nil {
		stopNow(eng)
		fmt.Fprintf(stderr, "kvdock: could not start the HTTP API: %v\n%s", err,
			portHint(err, cfg.HTTP.Port, "--http-port", "KVDOCK_HTTP_PORT, http.port; 0 turns the HTTP API off"))
		return 1
	}
	defer web.Stop()
	snap := eng.Snapshot()
	started, endpoint := time.Now(), snap.Endpoint
	face := "headless"
	if dash {
		face = "dashboard"
	}
	// bye prints the one line an operator reads after kvdock exits: what
	// ran, for how long, where the log is (the dashboard hid it). Where
	// stderr carries JSON logs it is a log record, so the stream stays JSON.
	// The endpoint is read again before each stop: a SIGHUP or the
	// settings pane may have moved the port since the start.
	lastEndpoint := func() {
		if e := eng.Snapshot().Endpoint; e != "" {
			endpoint = e
		}
	}
	kept := "" // what a stop that kept the pool left in /dev/shm (keptNote)
	bye := func(code int, why string) int {
		ran := time.Since(started).Round(time.Second)
		if logCfg.File == "" && logCfg.Format == "json" {
			attrs := []any{"face", face, "endpoint", endpoint, "ran", ran.String(), "cause", why, "exit_code", code, "log", "stderr"}
			if kept != "" {
				attrs = append(attrs, "kept", kept)
			}
			logger.Info("kvdock exited", attrs...)
			return code
		}
		where := logCfg.File
		if where == "" {
			where = "stderr (above)"
		}
		if kept != "" {
			kept = "; " + kept
		}
		fmt.Fprintf(stderr, "kvdock: %s on %s ran %s, stopped by %s, exit %d%s; log: %s\n", face, endpoint, ran, why, code, kept, where)
		return code
	}
	// stop is shutdown, noting what it kept for the exit line.
	stop := func(why string) int {
		before := eng.Snapshot()
		code := shutdown(eng, sigs, logger, why)
		kept = keptNote(before, shmDir)
		return code
	}
	logger.Info("kvdock serving", "version", snap.Version, "endpoint", snap.Endpoint, "protocol", snap.Protocol,
		"shm_name", snap.Shm.ShmName, "pool_size", snap.Shm.PoolSize, "shm_reason", snap.Shm.Reason)

	var quit chan struct{} // closed when the dashboard ends; nil without one
	stopDash := func() {}
	startDash := func() {
		dctx, cancel := context.WithCancel(ctx)
		q := make(chan struct{})
		quit, stopDash = q, cancel
		path := loaded.File
		if path == "" {
			path, _ = settings.DefaultPath(os.Environ())
		}
		go func() {
			defer close(q)
			if err := dashboard.Run(dctx, eng, dashboard.Options{Version: buildVersion(), ConfigPath: path, LogFile: logCfg.File, Memory: hostmem.Probe{}}); err != nil {
				logger.Error("dashboard", "err", err)
			}
		}()
	}
	if dash {
		startDash()
	}
	defer func() { stopDash() }()
	// restartInPlace checks the restart, gives the terminal back
	// (dashboard), stops the HTTP API and hands over to the new image. It
	// returns (code, true) when this process is to exit; after a refused
	// restart, or an exec that failed with the engine serving again over
	// the kept pool, it returns false and serving goes on.
	restartInPlace := func(why string) (int, bool) {
		path, err := checkRestart(why)
		if err != nil {
			return 0, false
		}
		lastEndpoint()
		if dash {
			stopDash()
			<-quit
		}
		web.Stop()
		logger.Info("restarting in place, keeping the pool", "cause", why)
		up, err := rs.handOver(ctx, path, why)
		if !up {
			logger.Error("restart: the exec failed and the engine could not start again", "err", err)
			return bye(1, why+" (exec failed)"), true
		}
		now, _ := eng.Config()
		if err := web.Start(ctx, now.HTTP); err != nil {
			logger.Error("restart: the exec failed and the HTTP API could not start again; the wire server serves", "err", err)
		}
		if dash {
			startDash()
		}
		return 0, false
	}
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGHUP && !dash {
				reload(ctx, eng, loadOpts, logger)
				continue
			}
			lastEndpoint()
			if sig == syscall.SIGUSR2 {
				if code, exit := restartInPlace("SIGUSR2"); exit {
					return code
				}
				continue
			}
			// With the dashboard, SIGHUP is the terminal hanging up (the
			// settings pane is how it reloads): stop rather than run on
			// without a screen.
			if dash {
				stopDash() // give the terminal back before stopping
				<-quit
			}
			return bye(stop(sig.String()), signalName(sig))
		case <-restarts:
			if code, exit := restartInPlace("kvdock ctl restart"); exit {
				return code
			}
		case <-quit:
			lastEndpoint()
			return bye(stop("dashboard quit"), "dashboard quit")
		case <-eng.Failed():
			logger.Error("wire server stopped unexpectedly")
			if dash {
				stopDash() // give the terminal back before the exit line
				<-quit
			}
			lastEndpoint()
			stopNow(eng)
			return bye(1, "a wire server failure")
		}
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
