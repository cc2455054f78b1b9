package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"kvdock/core/engine"
	"kvdock/core/hostmem"
	"kvdock/settings"
)

// restartRequests carries `kvdock ctl restart` (POST /restart) to the
// serve loop, which handles it as SIGUSR2; one pending request at most.
type restartRequests chan struct{}

// ask queues a restart; an error when one is already under way.
func (r restartRequests) ask() error {
	select {
	case r <- struct{}{}:
		return nil
	default:
		return errors.New("a restart is already under way")
	}
}

// binaryCheckTimeout bounds the `--version` run of the binary a restart
// is about to execute: a binary that hangs there would hang the new image.
const binaryCheckTimeout = 10 * time.Second

// execSignals are ignored from the moment the exec begins until the new
// image asks for them (signal.Notify early in serve): a disposition set to
// SIG_IGN survives execve, and the Go runtime of the new image drops them
// until Notify, where the default action (SIGUSR2 before the runtime
// starts, SIGHUP until Notify) would end the process holding the pool.
var execSignals = []os.Signal{syscall.SIGUSR2, syscall.SIGHUP}

// restarter re-executes kvdock in place (SIGUSR2, `kvdock ctl restart`):
// stop keeping the pool, whatever l1.keep_on_exit says, then replace this
// process with the binary at its path, the same arguments and environment.
// The new image, with the same pid (so the same auto segment name), adopts
// the pool. Replacing the binary first makes this an upgrade.
type restarter struct {
	eng      *engine.Engine
	loadOpts settings.LoadOptions
	logger   *slog.Logger
	sigs     chan<- os.Signal // serve's, given back execSignals when the exec fails
	// exec replaces the process image: syscall.Exec; tests make it fail.
	exec func(path string, argv, env []string) error
}

// check is what must hold before anything stops, so that a restart that
// could not come back is refused while this process serves on: the
// settings the new image will load pass every check its start makes
// before serving (the file, the flags and the environment, the memory, the
// log file), and the binary at this process's path is a regular
// executable file that runs (`--version`). It returns the path to execute.
func (r restarter) check() (string, error) {
	loaded, err := loadStartable(r.loadOpts)
	if err != nil {
		return "", fmt.Errorf("the new settings are refused: %w", err)
	}
	_, logCfg := faceOf(loaded.Config)
	_, closeLog, err := newLogger(logCfg, new(slog.LevelVar), io.Discard)
	if err != nil {
		return "", fmt.Errorf("the new settings are refused: %w", err)
	}
	closeLog()
	path, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("cannot find this binary's path: %w", err)
	}
	if err := checkBinary(path); err != nil {
		return "", err
	}
	return path, nil
}

// checkBinary says why path cannot be executed as kvdock: missing, not a
// regular file, not executable, or it does not run `--version` and print
// kvdock's version line.
func checkBinary(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("the binary: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("the binary %s is not a regular file (%s)", path, fi.Mode().Type())
	}
	if err := unix.Access(path, unix.X_OK); err != nil {
		return fmt.Errorf("the binary %s is not executable (mode %s): %w", path, fi.Mode().Perm(), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), binaryCheckTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, path, "--version")
	cmd.Stdout = &limitedBuffer{b: &out, max: 4096}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("the binary %s does not run (%s --version: %w)", path, path, err)
	}
	if !bytes.HasPrefix(out.Bytes(), []byte("kvdock ")) {
		first, _, _ := bytes.Cut(out.Bytes(), []byte("\n"))
		return fmt.Errorf("the binary %s is not kvdock: its --version printed %q", path, string(first[:min(len(first), 80)]))
	}
	return nil
}

// limitedBuffer keeps the first max bytes written and drops the rest: a
// binary that is not kvdock may print anything.
type limitedBuffer struct {
	b   *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// handOver stops keeping the pool and executes path. It returns only when
// the exec failed: this process then starts its engine again, adopting the
// pool it has just kept, and the error says why the exec failed (and why
// the engine did not start again, if it did not: engineUp false).
func (r restarter) handOver(ctx context.Context, path, why string) (engineUp bool, err error) {
	sctx, cancel := context.WithTimeout(context.Background(), engine.StopTimeout)
	defer cancel()
	// The listening socket outlives this image (the new one serves on it):
	// a worker that reconnects during the restart is accepted, not refused.
	lfd, lfor, lerr := r.eng.KeepListener()
	if lerr != nil {
		r.logger.Warn("restart: the listening socket is not kept; workers reconnect once the new image binds", "err", lerr)
	}
	if err := r.eng.StopKeeping(sctx); err != nil {
		r.logger.Warn("restart: pool not kept; the new process starts cold", "err", err)
	}
	r.logger.Info("restart: executing", "cause", why, "path", path)
	signal.Ignore(execSignals...)
	err = r.exec(path, os.Args, listenerEnv(os.Environ(), lfd, lfor))
	signal.Notify(r.sigs, execSignals...)
	if lfd >= 0 {
		_ = unix.Close(lfd) // this image binds again
	}
	err = fmt.Errorf("exec %s: %w", path, err)
	r.logger.Error("restart: exec failed; serving again in this process with the kept pool", "path", path, "err", err)
	if serr := r.eng.Start(ctx); serr != nil {
		return false, errors.Join(err, fmt.Errorf("start again: %w", serr))
	}
	return true, err
}

// The environment that names the listening socket an exec keeps: its
// descriptor and the endpoint it was bound for.
const (
	envListenerFD  = "KVDOCK_LISTENER_FD"
	envListenerFor = "KVDOCK_LISTENER_FOR"
)

// listenerEnv is env without a listening socket named, then naming fd (kept
// for endpoint) when fd >= 0.
func listenerEnv(env []string, fd int, endpoint string) []string {
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		if !strings.HasPrefix(kv, envListenerFD+"=") && !strings.HasPrefix(kv, envListenerFor+"=") {
			out = append(out, kv)
		}
	}
	if fd >= 0 {
		out = append(out, envListenerFD+"="+strconv.Itoa(fd), envListenerFor+"="+endpoint)
	}
	return out
}

// settingsEnviron is env as the settings read it: without the names of a
// kept socket, which are this image's to take (inheritedListener), not
// settings (each would be warned about as naming none).
func settingsEnviron(env []string) []string { return listenerEnv(env, -1, "") }

// inheritedListener takes the listening socket the previous image kept
// (listenerEnv) out of the environment: nil when none is named or the name
// is not a descriptor past stdio. The engine checks the socket itself and
// closes it when it is not the one for its endpoint.
func inheritedListener(log *slog.Logger) (*os.File, string) {
	v, endpoint := os.Getenv(envListenerFD), os.Getenv(envListenerFor)
	_ = os.Unsetenv(envListenerFD)
	_ = os.Unsetenv(envListenerFor)
	if v == "" {
		return nil, ""
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		log.Warn("restart: "+envListenerFD+" does not name a kept socket; binding a new one", "value", v)
		return nil, ""
	}
	return os.NewFile(uintptr(fd), "kept listener"), endpoint
}

// loadStartable loads the settings of opts and checks what serve checks
// before it starts: a pool larger than the host would start, then
// prefault until the OOM killer ends it, so it is refused like any other
// invalid setting (unreadable meminfo, 0, checks nothing). The errors say
// "invalid settings (N problems):" themselves.
func loadStartable(opts settings.LoadOptions) (*settings.Loaded, error) {
	avail, _ := hostmem.Probe{}.MemAvailable()
	return settings.LoadForServe(opts, avail)
}

// faceOf is whether cfg runs the dashboard here (a terminal on stdin and
// stdout, not headless) and the log settings that face uses: the
// dashboard owns the screen, so its logs go to a file.
func faceOf(cfg settings.Config) (dash bool, logCfg settings.LogConfig) {
	dash = !cfg.UI.Headless && isTerminal(os.Stdin) && isTerminal(os.Stdout)
	logCfg = cfg.Log
	if dash && logCfg.File == "" {
		logCfg.File = defaultLogFile()
	}
	return dash, logCfg
}
