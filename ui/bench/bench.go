// Package bench is `kvdock bench`: it drives a kvdock engine started in this
// process (real ZMQ over loopback) or a running server with N simulated
// LMCache non-GPU workers on the real wire protocol, in SHM and pickle mode,
// verifies every retrieved chunk, and reports throughput, latency, small
// request rates, CPU and memory against references measured in the same run
// (memcpy of the same bytes, a raw ZMQ ROUTER/DEALER echo of the same sizes);
// with --l2-adapter it measures each L2 tier the same way.
//
// One file per phase: flags.go reads the command line, execute.go runs
// the phases in order, mode.go measures one transfer mode, tiers.go the L2
// tiers, refs.go the references; report.go turns the figures into ratios
// and targets, compare.go sets them against a saved run.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"time"

	"kvdock/settings"
)

// Options is a parsed, validated bench invocation.
type Options struct {
	Model     Model
	Mode      string // shm | pickle | both
	Chunks    int
	Workers   int
	Repeat    float64
	Duration  time.Duration
	SmallOps  time.Duration
	Rounds    int
	Prompts   int
	PoolBytes int64 // 0 = auto
	Host      string
	Port      int
	ServerPID int
	// HTTPHost and HTTPPort are the target's HTTP API (port 0: none).
	HTTPHost    string
	HTTPPort    int
	Protocol    string
	Timeout     time.Duration
	JSON        bool
	CPUProfile  string
	RefDuration time.Duration
	// ServerProcess (--server-process) starts the server as a child process
	// and drives it as a target.
	ServerProcess bool
	// Restart (--restart) measures the gap and the hit ratio around
	// restarts of a server process that keeps its pool (restart.go).
	Restart bool
	// RestartObjects (--restart-objects) are the table sizes --restart
	// measures, one server process each (empty: one working set).
	RestartObjects []int
	// Adapters are the validated --l2-adapter objects: each is measured as
	// the one tier of an in-process engine.
	Adapters []settings.Adapter
	Args     []string
	// Baseline is the saved run of --compare (nil: none), read from
	// BaselinePath; From (--from) replaces the run; FailDrop is --fail-drop.
	Baseline     *Result
	BaselinePath string
	From         *Result
	FailDrop     float64

	// progress reports phase, elapsed time and bytes moved (nil: silent).
	progress *progress
}

// Run executes `kvdock bench` and returns the exit code. The settings
// layers (for the target's HTTP API) come from the process environment.
func Run(args []string, stdout, stderr io.Writer) int {
	return run(args, stdout, stderr, os.Environ(), isTerminal(stderr))
}

// run is Run with the environment and whether stderr is a terminal given.
func run(args []string, stdout, stderr io.Writer, environ []string, tty bool) int {
	opts, code := parseFlags(args, stderr, environ)
	if code >= 0 {
		return code
	}
	if opts.CPUProfile != "" {
		f, err := os.Create(opts.CPUProfile)
		if err != nil {
			fmt.Fprintf(stderr, "kvdock bench: --cpuprofile: %v\n", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "kvdock bench: --cpuprofile: %v\n", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	if opts.From != nil {
		c := compareRuns(opts.From, opts.Baseline, opts.BaselinePath, opts.FailDrop)
		var werr error
		if opts.JSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			werr = enc.Encode(c)
		} else {
			werr = c.WriteTable(stdout)
		}
		if werr != nil {
			fmt.Fprintf(stderr, "kvdock bench: write comparison: %v\n", werr)
			return 1
		}
		return regressionExit(c, stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if !opts.JSON {
		opts.progress = newProgress(stderr, tty)
	}
	if opts.Restart {
		return runRestart(ctx, opts, stdout, stderr)
	}
	var res *Result
	var err error
	if opts.ServerProcess {
		res, err = executeInChild(ctx, opts)
	} else {
		res, err = Execute(ctx, opts)
	}
	opts.progress.close() // before anything else is written
	if res != nil {
		if opts.Baseline != nil {
			res.Comparison = compareRuns(res, opts.Baseline, opts.BaselinePath, opts.FailDrop)
		}
		var werr error
		if opts.JSON {
			werr = res.WriteJSON(stdout)
		} else {
			werr = res.WriteTable(stdout)
			if werr == nil && res.Comparison != nil {
				if _, werr = io.WriteString(stdout, "\n"); werr == nil {
					werr = res.Comparison.WriteTable(stdout)
				}
			}
		}
		if werr != nil {
			fmt.Fprintf(stderr, "kvdock bench: %v\n", werr)
			return 1
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvdock bench: %v\n", err)
		return 1
	}
	for _, m := range []*ModeResult{res.SHM, res.Pickle} {
		if m != nil && (m.Mismatches > 0 || m.Timeouts > 0 || m.Errors > 0) {
			fmt.Fprintf(stderr, "kvdock bench: %s mode: %d checksum mismatches, %d timeouts, %d errors\n", m.Mode, m.Mismatches, m.Timeouts, m.Errors)
			return 1
		}
	}
	for i, t := range res.Tiers {
		if t.Mismatches > 0 || t.Errors > 0 {
			fmt.Fprintf(stderr, "kvdock bench: tier %d (%s): %d checksum mismatches, %d errors\n", i, t.Type, t.Mismatches, t.Errors)
			return 1
		}
	}
	if res.Comparison != nil {
		return regressionExit(res.Comparison, stderr)
	}
	return 0
}

// regressionExit is exitRegression, with the ratios named on stderr, when
// the --fail-drop check found any; else 0.
func regressionExit(c *Comparison, stderr io.Writer) int {
	if len(c.Regressions) == 0 {
		return 0
	}
	fmt.Fprintf(stderr, "kvdock bench: %d ratios dropped more than %g %% against %s, or are missing from this run: %s\n",
		len(c.Regressions), c.FailDropPercent, c.Baseline, strings.Join(c.Regressions, ", "))
	return exitRegression
}
