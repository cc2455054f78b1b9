package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"syscall"

	"kvdock/core/engine"
	"kvdock/ui/httpapi"
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

// reexec is SIGUSR2: stop keeping the pool (whatever l1.keep_on_exit
// says), then replace this process with the binary at its path, the same
// arguments and environment. The new image, with the same pid (so the
// same auto segment name), adopts the pool. Replacing the binary first
// makes this an upgrade. It returns only when the exec failed; the kept
// pool then waits for the next start.
func reexec(eng *engine.Engine, logger *slog.Logger, why string) int {
	path, err := os.Executable()
	if err != nil {
		logger.Error("restart: cannot find this binary's path; stopping instead", "err", err)
		return shutdownKeeping(eng, logger, why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), engine.StopTimeout)
	defer cancel()
	if err := eng.StopKeeping(ctx); err != nil {
		logger.Warn("restart: pool not kept; the new process starts cold", "err", err)
	}
	logger.Info("restart: executing", "cause", why, "path", path)
	err = syscall.Exec(path, os.Args, os.Environ())
	logger.Error("restart: exec failed; the kept pool waits for the next start", "path", path, "err", err)
	return 1
}

// shutdownKeeping stops keeping the pool, bounded like shutdown.
func shutdownKeeping(eng *engine.Engine, logger *slog.Logger, why string) int {
	ctx, cancel := context.WithTimeout(context.Background(), engine.StopTimeout)
	defer cancel()
	if err := eng.StopKeeping(ctx); err != nil {
		logger.Warn("stopped with errors", "cause", why, "err", err)
		return 1
	}
	return 0
}

// restartInPlace gives the terminal back (dashboard), stops the HTTP API
// and re-executes (reexec); bye prints the exit line if the exec fails.
func restartInPlace(eng *engine.Engine, web *httpapi.Runner, logger *slog.Logger, dash bool, stopDash func(),
	quit <-chan struct{}, bye func(code int, why string) int, why string) int {
	if dash {
		stopDash()
		<-quit
	}
	web.Stop()
	logger.Info("restarting in place, keeping the pool", "cause", why)
	return bye(reexec(eng, logger, why), why+" (exec failed)")
}
