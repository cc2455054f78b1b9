// The appliance: kvdock serve's steps, its signals, its stop and its exit
// line. main.go holds the commands.

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
	"kvdock/ui/dashboard"
	"kvdock/ui/httpapi"
	"kvdock/ui/metrics"
)

// serve runs the appliance until SIGINT/SIGTERM.
func serve(args []string, stdout, stderr io.Writer) int {
	// First of all: a re-executed image inherits SIGUSR2 and SIGHUP
	// ignored (restarter.handOver) and takes them back here.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR2)
	defer signal.Stop(sigs)

	fs, code, ok := serveFlags(args, stdout, stderr)
	if !ok {
		return code
	}
	loadOpts := settings.LoadOptions{Flags: fs, Environ: settingsEnviron(os.Environ())}
	loaded, err := loadStartable(loadOpts)
	if err != nil {
		fmt.Fprintf(stderr, "kvdock: %v\n", err)
		return 2
	}
	s := &server{stderr: stderr, sigs: sigs, loadOpts: loadOpts, loaded: loaded, stopDash: func() {}}
	s.dash, s.logCfg = faceOf(loaded.Config)
	level := new(slog.LevelVar)
	closeLog, err := s.startLogger(level)
	if err != nil {
		fmt.Fprintf(stderr, "kvdock: %v\n", err)
		return 2
	}
	defer closeLog()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	closeGPU := s.newEngine(level)
	defer closeGPU()
	if err := s.start(ctx); err != nil {
		return 1
	}
	defer s.web.Stop()
	s.announce()
	if s.dash {
		s.startDash(ctx)
	}
	defer func() { s.stopDash() }()
	return s.loop(ctx)
}

// server is what serve's steps share: the engine and its faces, and what
// the exit line says about the run.
type server struct {
	stderr   io.Writer
	sigs     chan os.Signal
	loadOpts settings.LoadOptions
	loaded   *settings.Loaded
	dash     bool
	logCfg   settings.LogConfig
	logger   *slog.Logger

	eng      *engine.Engine
	web      *httpapi.Runner
	rs       restarter
	restarts restartRequests

	started  time.Time
	face     string
	endpoint string
	kept     string // what a stop that kept the pool left in /dev/shm (keptNote)

	quit     chan struct{} // closed when the dashboard ends; nil without one
	stopDash func()
}

// serveFlags parses serve's flags; ok is false when serve is to exit with
// code (0 after --help).
func serveFlags(args []string, stdout, stderr io.Writer) (fs *pflag.FlagSet, code int, ok bool) {
	fs = pflag.NewFlagSet("kvdock serve", pflag.ContinueOnError)
	fs.SetOutput(io.Discard) // ContinueOnError prints nothing useful; the error is printed below
	settings.RegisterFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stdout, "Usage: kvdock [serve] [flags]\n\nFlags (each also settable by its KVDOCK_* variable or the settings file):\n%s", fs.FlagUsages())
	}
	const serveLine = "usage: kvdock [serve] [flags] (kvdock serve --help lists every flag; kvdock help for the commands)"
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, 0, false
		}
		fmt.Fprintf(stderr, "kvdock: %v\n%s\n", err, serveLine)
		return nil, 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvdock: unexpected arguments %q\n%s\n", fs.Args(), serveLine)
		return nil, 2, false
	}
	return fs, 0, true
}

// startLogger opens the log and says what the settings and the process
// tuning came to; the returned func closes the log.
func (s *server) startLogger(level *slog.LevelVar) (func(), error) {
	logger, closeLog, err := newLogger(s.logCfg, level, s.stderr)
	if err != nil {
		return nil, err
	}
	s.logger = logger
	for _, w := range s.loaded.Warnings {
		logger.Warn(w)
	}
	if s.loaded.File != "" {
		logger.Info("settings file", "path", s.loaded.File, "chosen_by", s.loaded.FileSource.String())
	}
	if t := rpc.TuneMalloc(); t.String() != "" {
		logger.Debug("malloc tuning", "result", t.String())
	}
	applyMemoryLimit(s.loaded.Config.Server, os.Getenv("GOMEMLIMIT"), logger)
	return closeLog, nil
}

// newEngine builds the engine, its metrics, the restarter and the HTTP API
// (not yet started); the returned func closes the GPU source.
func (s *server) newEngine(level *slog.LevelVar) (closeGPU func()) {
	cfg := s.loaded.Config
	m := metrics.New()
	gpuSrc := gpu.NewNVML(s.logger.With("component", "gpu"))
	listener, listenerFor := inheritedListener(s.logger)
	s.eng = engine.New(cfg, engine.Options{
		Listener:    listener,
		ListenerFor: listenerFor,
		GPU:         gpu.NewSampler(gpuSrc),
		Logger:      s.logger,
		LogLevel:    level,
		Sources:     s.loaded.Sources,
		Version:     buildVersion(),
		Observer:    m,
		Memory:      hostmem.Probe{},
		// s.web is set below, before Start; OnApply runs only after it.
		OnApply: func(_ context.Context, _, new settings.Config) error {
			return s.web.Restart(new.HTTP)
		},
	})
	m.Watch(s.eng)
	s.restarts = make(restartRequests, 1)
	s.rs = restarter{eng: s.eng, loadOpts: s.loadOpts, logger: s.logger, sigs: s.sigs, exec: syscall.Exec}
	// No token set: POST /restart still needs one, the local token written
	// in the state directory for kvdock ctl (ui/httpapi/localtoken.go).
	stateDir, _ := cfg.Server.StateDirPath(os.Getenv, os.UserHomeDir)
	s.web = httpapi.NewRunner(s.eng, httpapi.Options{Metrics: m, Logger: s.logger.With("component", "http"), Restart: s.askRestart, StateDir: stateDir})
	return func() { gpuSrc.Close() }
}

// start starts the engine, then the HTTP API; an error has been said on
// stderr already.
func (s *server) start(ctx context.Context) error {
	cfg := s.loaded.Config
	if err := s.eng.Start(ctx); err != nil {
		s.logger.Error("kvdock could not start", "err", err)
		fmt.Fprintf(s.stderr, "kvdock: could not start: %v\n%s", err, portHint(err, cfg.Server.Port, "--port", "KVDOCK_PORT, server.port"))
		return err
	}
	if err := s.web.Start(ctx, cfg.HTTP); err != nil {
		stopNow(s.eng)
		fmt.Fprintf(s.stderr, "kvdock: could not start the HTTP API: %v\n%s", err,
			portHint(err, cfg.HTTP.Port, "--http-port", "KVDOCK_HTTP_PORT, http.port; 0 turns the HTTP API off"))
		return err
	}
	return nil
}

// announce notes what the exit line will say and logs that kvdock serves.
func (s *server) announce() {
	snap := s.eng.Snapshot()
	s.started, s.endpoint = time.Now(), snap.Endpoint
	s.face = "headless"
	if s.dash {
		s.face = "dashboard"
	}
	s.logger.Info("kvdock serving", "version", snap.Version, "endpoint", snap.Endpoint, "protocol", snap.Protocol,
		"shm_name", snap.Shm.ShmName, "pool_size", snap.Shm.PoolSize, "shm_reason", snap.Shm.Reason)
}

// lastEndpoint reads the endpoint again before a stop: a SIGHUP or the
// settings pane may have moved the port since the start.
func (s *server) lastEndpoint() {
	if e := s.eng.Snapshot().Endpoint; e != "" {
		s.endpoint = e
	}
}

// bye prints the one line an operator reads after kvdock exits: what
// ran, for how long, where the log is (the dashboard hid it). Where
// stderr carries JSON logs it is a log record, so the stream stays JSON.
func (s *server) bye(code int, why string) int {
	ran := time.Since(s.started).Round(time.Second)
	if s.logCfg.File == "" && s.logCfg.Format == "json" {
		attrs := []any{"face", s.face, "endpoint", s.endpoint, "ran", ran.String(), "cause", why, "exit_code", code, "log", "stderr"}
		if s.kept != "" {
			attrs = append(attrs, "kept", s.kept)
		}
		s.logger.Info("kvdock exited", attrs...)
		return code
	}
	where := s.logCfg.File
	if where == "" {
		where = "stderr (above)"
	}
	if s.kept != "" {
		s.kept = "; " + s.kept
	}
	fmt.Fprintf(s.stderr, "kvdock: %s on %s ran %s, stopped by %s, exit %d%s; log: %s\n", s.face, s.endpoint, ran, why, code, s.kept, where)
	return code
}

// stop is shutdown, noting what it kept for the exit line.
func (s *server) stop(why string) int {
	before := s.eng.Snapshot()
	code := shutdown(s.eng, s.sigs, s.logger, why)
	s.kept = keptNote(before, shmDir)
	return code
}

// checkRestart is the restart's check, said where the operator looks:
// a restart that is refused stops nothing.
func (s *server) checkRestart(why string) (string, error) {
	path, err := s.rs.check()
	if err != nil {
		s.logger.Error("restart refused; serving on", "cause", why, "err", err)
		return "", fmt.Errorf("restart refused, serving on: %w", err)
	}
	return path, nil
}

// askRestart is the HTTP API's POST /restart.
func (s *server) askRestart() error {
	if _, err := s.checkRestart("kvdock ctl restart"); err != nil {
		return err
	}
	return s.restarts.ask()
}

// startDash runs the dashboard until it quits (s.quit closes) or
// s.stopDash is called.
func (s *server) startDash(ctx context.Context) {
	dctx, cancel := context.WithCancel(ctx)
	q := make(chan struct{})
	s.quit, s.stopDash = q, cancel
	path := s.loaded.File
	if path == "" {
		path, _ = settings.DefaultPath(os.Environ())
	}
	go func() {
		defer close(q)
		if err := dashboard.Run(dctx, s.eng, dashboard.Options{Version: buildVersion(), ConfigPath: path, LogFile: s.logCfg.File, Memory: hostmem.Probe{}}); err != nil {
			s.logger.Error("dashboard", "err", err)
		}
	}()
}

// endDash gives the terminal back (a no-op without the dashboard).
func (s *server) endDash() {
	if s.dash {
		s.stopDash()
		<-s.quit
	}
}

// restartInPlace checks the restart, gives the terminal back
// (dashboard), stops the HTTP API and hands over to the new image. It
// returns (code, true) when this process is to exit; after a refused
// restart, or an exec that failed with the engine serving again over
// the kept pool, it returns false and serving goes on.
func (s *server) restartInPlace(ctx context.Context, why string) (int, bool) {
	path, err := s.checkRestart(why)
	if err != nil {
		return 0, false
	}
	s.lastEndpoint()
	s.endDash()
	s.web.Stop()
	s.logger.Info("restarting in place, keeping the pool", "cause", why)
	up, err := s.rs.handOver(ctx, path, why)
	if !up {
		s.logger.Error("restart: the exec failed and the engine could not start again", "err", err)
		return s.bye(1, why+" (exec failed)"), true
	}
	now, _ := s.eng.Config()
	if err := s.web.Start(ctx, now.HTTP); err != nil {
		s.logger.Error("restart: the exec failed and the HTTP API could not start again; the wire server serves", "err", err)
	}
	if s.dash {
		s.startDash(ctx)
	}
	return 0, false
}

// loop serves until a signal, the dashboard or a wire server failure ends
// the run, and returns the exit code.
func (s *server) loop(ctx context.Context) int {
	for {
		select {
		case sig := <-s.sigs:
			if sig == syscall.SIGHUP && !s.dash {
				reload(ctx, s.eng, s.loadOpts, s.logger)
				continue
			}
			s.lastEndpoint()
			if sig == syscall.SIGUSR2 {
				if code, exit := s.restartInPlace(ctx, "SIGUSR2"); exit {
					return code
				}
				continue
			}
			// With the dashboard, SIGHUP is the terminal hanging up (the
			// settings pane is how it reloads): stop rather than run on
			// without a screen.
			s.endDash() // give the terminal back before stopping
			return s.bye(s.stop(sig.String()), signalName(sig))
		case <-s.restarts:
			if code, exit := s.restartInPlace(ctx, "kvdock ctl restart"); exit {
				return code
			}
		case <-s.quit:
			s.lastEndpoint()
			return s.bye(s.stop("dashboard quit"), "dashboard quit")
		case <-s.eng.Failed():
			s.logger.Error("wire server stopped unexpectedly")
			s.endDash() // give the terminal back before the exit line
			s.lastEndpoint()
			stopNow(s.eng)
			return s.bye(1, "a wire server failure")
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
