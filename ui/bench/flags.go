package bench

// The command line: flags, their checks and the --l2-adapter values.

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"kvdock/assets"
	"kvdock/settings"
)

const usage = `usage: kvdock bench [flags]

Starts a kvdock engine in this process (or targets --host/--port), drives it
with --workers simulated LMCache non-GPU workers over ZMQ, and reports store
and retrieve throughput, per-chunk latency, small request rates, CPU per GB
and peak RSS beyond the pool, with ratios against a memcpy and a raw ZMQ echo
measured in the same run.

Against a running server (--host/--port) it runs the requested modes the
server can serve and says which it skipped and why: a server started with
--shm-name "" serves pickle workers only; a kvdock sharing a segment serves
both (pickle workers fall back), which the bench confirms through kvdock's
HTTP API (GET /status), also the source of the pool size. The HTTP address
comes from --http-host/--http-port, else the settings layers as for kvdock
serve (--config, KVDOCK_HTTP_HOST, KVDOCK_HTTP_PORT; port 8080), the host
defaulting to --host.

With --l2-adapter (JSON as for kvdock serve, repeatable) each tier is
measured on an in-process engine of its own: write and prefetch-read
against plain file I/O (fs) or valkey-go SET/GET (resp) of the same bytes
on the same target, and NOOP/LOOKUP while the tier is saturated with
writes against the same load without a tier.

With --restart it measures restarts instead: a server process that keeps
its pool (--l1-keep-on-exit), a working set stored once, then the workers
look it up and retrieve it without pause while the server restarts by
SIGUSR2 and by SIGTERM followed by the same command line; it reports the
gap (from the signal to the first answer to a request sent after it), the
hit ratio in the second before and in the first second after, and failed
requests (--timeout 2s unless given).

A progress line (phase, elapsed, GB moved) goes to stderr: redrawn on a
terminal, a plain line per phase otherwise, none with --json.

--compare FILE.json compares the run with a saved --json run: each ratio
and key throughput with its change in percent, figures missing on either
side said so. --from FILE.json compares a saved run instead of running one.
--fail-drop PCT makes the comparison a check: exit 3 when a ratio dropped
by more than PCT percent, or is missing from this run (task bench:check).

Exit status: 0 done, 1 failed, nothing could run, or a checksum mismatch or
timeout occurred, 2 bad flags (an unreadable --compare/--from file too),
3 --fail-drop found a regression. Performance targets are reported, not
enforced.

Flags:
`

// parseFlags returns the options, or an exit code ≥ 0 when Run should stop.
func parseFlags(args []string, stderr io.Writer, environ []string) (Options, int) {
	fs := pflag.NewFlagSet("kvdock bench", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	f := defineFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return Options{}, 0
		}
		fmt.Fprintf(stderr, "kvdock bench: %v (see kvdock bench --help)\n", err)
		return Options{}, 2
	}
	opts, bad := f.validate(fs, environ)
	if len(bad) > 0 {
		for _, b := range bad {
			fmt.Fprintln(stderr, "kvdock bench: "+b)
		}
		return Options{}, 2
	}
	opts.Args = append([]string(nil), args...)
	return opts, -1
}

// benchFlags holds the flags' values as parsed, before validate.
type benchFlags struct {
	model, dtype, mode, host, proto, cpuprof, compare, from string
	layers, hidden, chunks, workers, rounds, prompts        int
	port, pid                                               int
	mla, child, restart, asJSON                             bool
	repeat, poolGB, failDrop                                float64
	duration, small, refDur, timeout                        time.Duration
	restartObjects                                          []int
	l2                                                      []string
}

// defineFlags is the flag table.
func defineFlags(fs *pflag.FlagSet) *benchFlags {
	f := &benchFlags{}
	fs.StringVar(&f.model, "model", "llama-3.1-8b", "model preset: "+strings.Join(presetNames(), ", "))
	fs.IntVar(&f.layers, "layers", 0, "layers (overrides the preset)")
	fs.IntVar(&f.hidden, "hidden", 0, "hidden size per token and layer: KV heads × head size, or the MLA latent (overrides the preset)")
	fs.StringVar(&f.dtype, "dtype", "", "torch dtype name, e.g. bfloat16 (overrides the preset)")
	fs.BoolVar(&f.mla, "mla", false, "MLA layout [layers, tokens, hidden] (overrides the preset)")
	fs.StringVar(&f.mode, "mode", "both", "transfer mode: shm, pickle or both")
	fs.IntVar(&f.chunks, "chunks", 4, "chunks per prompt")
	fs.IntVar(&f.workers, "workers", 1, "concurrent workers (one ZMQ client and one registered instance each)")
	fs.Float64Var(&f.repeat, "repeat", 0.5, "share of prompts that start with a shared prefix (0..1)")
	fs.DurationVar(&f.duration, "duration", 4*time.Second, "store/retrieve time per mode (whole rounds; at least one)")
	fs.DurationVar(&f.small, "small-duration", time.Second, "time for each small-request measurement (NOOP, LOOKUP+STATUS)")
	fs.DurationVar(&f.refDur, "ref-duration", time.Second, "time for each reference measurement (memcpy, echoes)")
	fs.IntVar(&f.rounds, "rounds", 0, "exact number of store/retrieve rounds (0: as many as --duration allows)")
	fs.IntVar(&f.prompts, "prompts", 0, "prompts per worker per round (0: fill about 70% of the pool)")
	fs.Float64Var(&f.poolGB, "pool-gb", 0, "in-process pool size in GiB (0: 1 GiB, more if one round of the workload needs it)")
	fs.StringVar(&f.host, "host", "", "target a running server at this host instead of starting one")
	fs.IntVar(&f.port, "port", 0, "the target server's ZMQ port (with --host)")
	fs.IntVar(&f.pid, "server-pid", 0, "the target server's pid, for its CPU time and peak RSS")
	fs.BoolVar(&f.child, "server-process", false, "start the server as a separate kvdock process and measure it as a target (its own RSS and CPU); one --mode")
	fs.BoolVar(&f.restart, "restart", false, "measure restarts instead: a server process that keeps its pool (--l1-keep-on-exit) restarted by SIGUSR2 and by SIGTERM + the same command line under load; the gap and the hit ratio around it (--mode shm, --timeout 2s unless given)")
	fs.IntSliceVar(&f.restartObjects, "restart-objects", nil, "with --restart: fill the pool with this many objects first, one server process per size, e.g. 1000,16000,64000 (default: one working set of --prompts)")
	def := settings.Default()
	fs.String(settings.ConfigFlag, "", "settings file to read the target's HTTP address from (default $XDG_CONFIG_HOME/kvdock/config.yaml when it exists) ["+settings.EnvConfig+"]")
	fs.String("http-host", "", "host of the target's HTTP API, for /status (default: --host) [KVDOCK_HTTP_HOST]")
	fs.Int("http-port", def.HTTP.Port, "port of the target's HTTP API (0: none; then the pool size of a pickle server is unknown) [KVDOCK_HTTP_PORT]")
	fs.StringVar(&f.proto, "protocol", "nongpu-v1", "protocol profile: "+strings.Join(assets.ProtocolNames(), ", "))
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "per-request timeout (a request without a reply by then counts as a timeout)")
	fs.BoolVar(&f.asJSON, "json", false, "print one JSON object instead of the table")
	fs.StringVar(&f.cpuprof, "cpuprofile", "", "write a pprof CPU profile of the whole run to FILE")
	fs.StringVar(&f.compare, "compare", "", "compare the run with a saved --json run in FILE: each ratio and key throughput and its change")
	fs.StringVar(&f.from, "from", "", "with --compare: compare the saved --json run in FILE instead of running one")
	fs.Float64Var(&f.failDrop, "fail-drop", 0, "with --compare: exit 3 when a ratio dropped by more than this many percent, or is missing (0: report only)")
	fs.StringArrayVar(&f.l2, "l2-adapter", nil, `an L2 tier to measure, JSON as for kvdock serve, repeatable: {"type": "fs", "base_path": "/data/l2"} or {"type": "resp", "host": "redis", "port": 6379} (in-process engine only)`)
	return f
}

// validate is the one check of the flags together: the options, or every
// problem found, in the order of the flags they concern.
func (f *benchFlags) validate(fs *pflag.FlagSet, environ []string) (Options, []string) {
	var bad []string
	if fs.NArg() > 0 {
		bad = append(bad, fmt.Sprintf("unexpected arguments %q", strings.Join(fs.Args(), " ")))
	}
	m, err := resolveModel(f.model, f.layers, f.hidden, f.dtype, f.mla, fs.Changed("mla"))
	if err != nil {
		bad = append(bad, err.Error())
	}
	bad = append(bad, f.checkWorkload(fs)...)
	httpHost, httpPort, targetBad := f.checkTarget(fs, environ)
	bad = append(bad, targetBad...)
	if _, err := assets.Protocol(f.proto); err != nil {
		bad = append(bad, "--protocol: "+err.Error())
	}
	bad = append(bad, f.checkRestart(fs)...)
	if f.child {
		if f.host != "" || len(f.l2) > 0 {
			bad = append(bad, "--server-process: not with --host/--port or --l2-adapter (it starts its own server)")
		}
		if f.mode == "both" {
			bad = append(bad, "--server-process: give one --mode (shm or pickle): one server process per run")
		}
	}
	var adapters []settings.Adapter
	if len(f.l2) > 0 {
		if f.host != "" {
			bad = append(bad, "--l2-adapter: only for the in-process engine (a target server has its own tiers)")
		}
		a, err := loadAdapters(f.l2, environ)
		if err != nil {
			bad = append(bad, err.Error())
		}
		adapters = a
	}
	baseline, fromRun, compareBad := f.checkCompare()
	bad = append(bad, compareBad...)
	return Options{
		Model: m, Mode: f.mode, Chunks: f.chunks, Workers: f.workers, Repeat: f.repeat,
		Duration: f.duration, SmallOps: f.small, RefDuration: f.refDur, Rounds: f.rounds, Prompts: f.prompts,
		PoolBytes: int64(f.poolGB * (1 << 30)), Host: f.host, Port: f.port, ServerPID: f.pid,
		HTTPHost: httpHost, HTTPPort: httpPort,
		Protocol: f.proto, Timeout: f.timeout, JSON: f.asJSON, CPUProfile: f.cpuprof,
		Adapters: adapters, ServerProcess: f.child, Restart: f.restart, RestartObjects: f.restartObjects,
		Baseline: baseline, BaselinePath: f.compare, From: fromRun, FailDrop: f.failDrop,
	}, bad
}

// checkWorkload checks the model's overrides, the mode and the workload's
// sizes and times.
func (f *benchFlags) checkWorkload(fs *pflag.FlagSet) (bad []string) {
	if fs.Changed("layers") && f.layers <= 0 {
		bad = append(bad, fmt.Sprintf("--layers %d: must be > 0", f.layers))
	}
	if fs.Changed("hidden") && f.hidden <= 0 {
		bad = append(bad, fmt.Sprintf("--hidden %d: must be > 0", f.hidden))
	}
	switch f.mode {
	case "shm", "pickle", "both":
	default:
		bad = append(bad, fmt.Sprintf("--mode %q: must be shm, pickle or both", f.mode))
	}
	if f.chunks < 1 || f.chunks > 1024 {
		bad = append(bad, fmt.Sprintf("--chunks %d: must be 1..1024", f.chunks))
	}
	if f.workers < 1 || f.workers > 256 {
		bad = append(bad, fmt.Sprintf("--workers %d: must be 1..256", f.workers))
	}
	if !(f.repeat >= 0 && f.repeat <= 1) {
		bad = append(bad, fmt.Sprintf("--repeat %v: must be in 0..1", f.repeat))
	}
	for name, d := range map[string]time.Duration{"--duration": f.duration, "--small-duration": f.small, "--ref-duration": f.refDur, "--timeout": f.timeout} {
		if d <= 0 {
			bad = append(bad, fmt.Sprintf("%s %v: must be positive", name, d))
		}
	}
	if f.rounds < 0 || f.prompts < 0 {
		bad = append(bad, fmt.Sprintf("--rounds %d / --prompts %d: must be ≥ 0", f.rounds, f.prompts))
	}
	if !(f.poolGB >= 0) || f.poolGB > 1024 {
		bad = append(bad, fmt.Sprintf("--pool-gb %v: must be 0 (auto) or a size up to 1024", f.poolGB))
	}
	return bad
}

// checkTarget checks --host/--port and what goes with them, and finds the
// target's HTTP address.
func (f *benchFlags) checkTarget(fs *pflag.FlagSet, environ []string) (httpHost string, httpPort int, bad []string) {
	if (f.host == "") != (f.port == 0) {
		bad = append(bad, "--host and --port go together (both to target a server, neither to start one)")
	}
	if f.port < 0 || f.port > 65535 {
		bad = append(bad, fmt.Sprintf("--port %d: out of range 1-65535", f.port))
	}
	if f.pid < 0 || (f.pid > 0 && f.host == "") {
		bad = append(bad, fmt.Sprintf("--server-pid %d: only with --host/--port (in process, the bench measures itself)", f.pid))
	}
	if f.host != "" && fs.Changed("pool-gb") {
		bad = append(bad, "--pool-gb: only for the in-process engine (a target server has its own pool)")
	}
	switch {
	case f.host == "":
		for _, name := range []string{settings.ConfigFlag, "http-host", "http-port"} {
			if fs.Changed(name) {
				bad = append(bad, "--"+name+": only with --host/--port (the in-process engine needs no HTTP API)")
			}
		}
	default:
		h, p, err := httpAddress(fs, environ, f.host)
		if err != nil {
			bad = append(bad, err.Error())
		}
		httpHost, httpPort = h, p
	}
	return httpHost, httpPort, bad
}

// checkRestart gives --restart its defaults (--mode shm, --timeout 2s
// unless given) and checks what goes with it.
func (f *benchFlags) checkRestart(fs *pflag.FlagSet) (bad []string) {
	if f.restart {
		if !fs.Changed("mode") {
			f.mode = "shm"
		}
		if !fs.Changed("timeout") {
			f.timeout = 2 * time.Second // a request lost at the restart comes back soon
		}
		if f.host != "" || len(f.l2) > 0 || f.child || f.compare != "" {
			bad = append(bad, "--restart: not with --host/--port, --l2-adapter, --server-process or --compare (it starts its own server process)")
		}
		if f.mode == "both" {
			bad = append(bad, "--restart: give one --mode (shm or pickle)")
		}
	}
	for _, n := range f.restartObjects {
		if n < 1 || n > 1<<22 {
			bad = append(bad, fmt.Sprintf("--restart-objects %d: must be 1..4194304", n))
		}
	}
	if len(f.restartObjects) > 0 && (!f.restart || fs.Changed("prompts")) {
		bad = append(bad, "--restart-objects: only with --restart, and not with --prompts (the size sets the prompts)")
	}
	return bad
}

// checkCompare reads the saved runs of --compare and --from and checks
// --fail-drop.
func (f *benchFlags) checkCompare() (baseline, fromRun *Result, bad []string) {
	var err error
	if f.compare != "" {
		if baseline, err = loadSaved(f.compare); err != nil {
			bad = append(bad, "--compare: "+err.Error())
		}
	}
	if f.from != "" {
		if f.compare == "" {
			bad = append(bad, "--from: only with --compare (it names the run to compare)")
		} else if fromRun, err = loadSaved(f.from); err != nil {
			bad = append(bad, "--from: "+err.Error())
		}
	}
	if !(f.failDrop >= 0 && f.failDrop <= 100) {
		bad = append(bad, fmt.Sprintf("--fail-drop %v: must be a percentage in 0..100", f.failDrop))
	} else if f.failDrop > 0 && f.compare == "" {
		bad = append(bad, "--fail-drop: only with --compare")
	}
	return baseline, fromRun, bad
}

// loadAdapters validates --l2-adapter values as kvdock serve does (the
// settings layers, with only these flags and no settings file), credentials
// filled from environ's KVDOCK_RESP_* / LMCACHE_RESP_*.
func loadAdapters(values []string, environ []string) ([]settings.Adapter, error) {
	fs := pflag.NewFlagSet("l2", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	settings.RegisterFlags(fs)
	args := make([]string, 0, len(values))
	for _, v := range values {
		args = append(args, "--l2-adapter="+v)
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("--l2-adapter: %w", err)
	}
	env := []string{settings.EnvConfig + "="} // no settings file
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case settings.EnvRespUsername, settings.EnvRespPassword, settings.EnvUpstreamRespUsername, settings.EnvUpstreamRespPassword:
			env = append(env, kv)
		}
	}
	l, err := settings.Load(settings.LoadOptions{Flags: fs, Environ: env})
	if err != nil {
		return nil, fmt.Errorf("--l2-adapter: %w", err)
	}
	return l.Config.L2.Adapters, nil
}
