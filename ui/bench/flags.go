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
	model := fs.String("model", "llama-3.1-8b", "model preset: "+strings.Join(presetNames(), ", "))
	layers := fs.Int("layers", 0, "layers (overrides the preset)")
	hidden := fs.Int("hidden", 0, "hidden size per token and layer: KV heads × head size, or the MLA latent (overrides the preset)")
	dtype := fs.String("dtype", "", "torch dtype name, e.g. bfloat16 (overrides the preset)")
	mla := fs.Bool("mla", false, "MLA layout [layers, tokens, hidden] (overrides the preset)")
	mode := fs.String("mode", "both", "transfer mode: shm, pickle or both")
	chunks := fs.Int("chunks", 4, "chunks per prompt")
	workers := fs.Int("workers", 1, "concurrent workers (one ZMQ client and one registered instance each)")
	repeat := fs.Float64("repeat", 0.5, "share of prompts that start with a shared prefix (0..1)")
	duration := fs.Duration("duration", 4*time.Second, "store/retrieve time per mode (whole rounds; at least one)")
	small := fs.Duration("small-duration", time.Second, "time for each small-request measurement (NOOP, LOOKUP+STATUS)")
	refDur := fs.Duration("ref-duration", time.Second, "time for each reference measurement (memcpy, echoes)")
	rounds := fs.Int("rounds", 0, "exact number of store/retrieve rounds (0: as many as --duration allows)")
	prompts := fs.Int("prompts", 0, "prompts per worker per round (0: fill about 70% of the pool)")
	poolGB := fs.Float64("pool-gb", 0, "in-process pool size in GiB (0: 1 GiB, more if one round of the workload needs it)")
	host := fs.String("host", "", "target a running server at this host instead of starting one")
	port := fs.Int("port", 0, "the target server's ZMQ port (with --host)")
	pid := fs.Int("server-pid", 0, "the target server's pid, for its CPU time and peak RSS")
	child := fs.Bool("server-process", false, "start the server as a separate kvdock process and measure it as a target (its own RSS and CPU); one --mode")
	restart := fs.Bool("restart", false, "measure restarts instead: a server process that keeps its pool (--l1-keep-on-exit) restarted by SIGUSR2 and by SIGTERM + the same command line under load; the gap and the hit ratio around it (--mode shm, --timeout 2s unless given)")
	restartObjects := fs.IntSlice("restart-objects", nil, "with --restart: fill the pool with this many objects first, one server process per size, e.g. 1000,16000,64000 (default: one working set of --prompts)")
	def := settings.Default()
	fs.String(settings.ConfigFlag, "", "settings file to read the target's HTTP address from (default $XDG_CONFIG_HOME/kvdock/config.yaml when it exists) ["+settings.EnvConfig+"]")
	fs.String("http-host", "", "host of the target's HTTP API, for /status (default: --host) [KVDOCK_HTTP_HOST]")
	fs.Int("http-port", def.HTTP.Port, "port of the target's HTTP API (0: none; then the pool size of a pickle server is unknown) [KVDOCK_HTTP_PORT]")
	proto := fs.String("protocol", "nongpu-v1", "protocol profile: "+strings.Join(assets.ProtocolNames(), ", "))
	timeout := fs.Duration("timeout", 30*time.Second, "per-request timeout (a request without a reply by then counts as a timeout)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of the table")
	cpuprof := fs.String("cpuprofile", "", "write a pprof CPU profile of the whole run to FILE")
	compare := fs.String("compare", "", "compare the run with a saved --json run in FILE: each ratio and key throughput and its change")
	from := fs.String("from", "", "with --compare: compare the saved --json run in FILE instead of running one")
	failDrop := fs.Float64("fail-drop", 0, "with --compare: exit 3 when a ratio dropped by more than this many percent, or is missing (0: report only)")
	l2 := fs.StringArray("l2-adapter", nil, `an L2 tier to measure, JSON as for kvdock serve, repeatable: {"type": "fs", "base_path": "/data/l2"} or {"type": "resp", "host": "redis", "port": 6379} (in-process engine only)`)
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
	var bad []string
	if fs.NArg() > 0 {
		bad = append(bad, fmt.Sprintf("unexpected arguments %q", strings.Join(fs.Args(), " ")))
	}
	m, err := resolveModel(*model, *layers, *hidden, *dtype, *mla, fs.Changed("mla"))
	if err != nil {
		bad = append(bad, err.Error())
	}
	if fs.Changed("layers") && *layers <= 0 {
		bad = append(bad, fmt.Sprintf("--layers %d: must be > 0", *layers))
	}
	if fs.Changed("hidden") && *hidden <= 0 {
		bad = append(bad, fmt.Sprintf("--hidden %d: must be > 0", *hidden))
	}
	switch *mode {
	case "shm", "pickle", "both":
	default:
		bad = append(bad, fmt.Sprintf("--mode %q: must be shm, pickle or both", *mode))
	}
	if *chunks < 1 || *chunks > 1024 {
		bad = append(bad, fmt.Sprintf("--chunks %d: must be 1..1024", *chunks))
	}
	if *workers < 1 || *workers > 256 {
		bad = append(bad, fmt.Sprintf("--workers %d: must be 1..256", *workers))
	}
	if !(*repeat >= 0 && *repeat <= 1) {
		bad = append(bad, fmt.Sprintf("--repeat %v: must be in 0..1", *repeat))
	}
	for name, d := range map[string]time.Duration{"--duration": *duration, "--small-duration": *small, "--ref-duration": *refDur, "--timeout": *timeout} {
		if d <= 0 {
			bad = append(bad, fmt.Sprintf("%s %v: must be positive", name, d))
		}
	}
	if *rounds < 0 || *prompts < 0 {
		bad = append(bad, fmt.Sprintf("--rounds %d / --prompts %d: must be ≥ 0", *rounds, *prompts))
	}
	if !(*poolGB >= 0) || *poolGB > 1024 {
		bad = append(bad, fmt.Sprintf("--pool-gb %v: must be 0 (auto) or a size up to 1024", *poolGB))
	}
	if (*host == "") != (*port == 0) {
		bad = append(bad, "--host and --port go together (both to target a server, neither to start one)")
	}
	if *port < 0 || *port > 65535 {
		bad = append(bad, fmt.Sprintf("--port %d: out of range 1-65535", *port))
	}
	if *pid < 0 || (*pid > 0 && *host == "") {
		bad = append(bad, fmt.Sprintf("--server-pid %d: only with --host/--port (in process, the bench measures itself)", *pid))
	}
	if *host != "" && fs.Changed("pool-gb") {
		bad = append(bad, "--pool-gb: only for the in-process engine (a target server has its own pool)")
	}
	var httpHost string
	var httpPort int
	switch {
	case *host == "":
		for _, name := range []string{settings.ConfigFlag, "http-host", "http-port"} {
			if fs.Changed(name) {
				bad = append(bad, "--"+name+": only with --host/--port (the in-process engine needs no HTTP API)")
			}
		}
	default:
		h, p, err := httpAddress(fs, environ, *host)
		if err != nil {
			bad = append(bad, err.Error())
		}
		httpHost, httpPort = h, p
	}
	if _, err := assets.Protocol(*proto); err != nil {
		bad = append(bad, "--protocol: "+err.Error())
	}
	if *restart {
		if !fs.Changed("mode") {
			*mode = "shm"
		}
		if !fs.Changed("timeout") {
			*timeout = 2 * time.Second // a request lost at the restart comes back soon
		}
		if *host != "" || len(*l2) > 0 || *child || *compare != "" {
			bad = append(bad, "--restart: not with --host/--port, --l2-adapter, --server-process or --compare (it starts its own server process)")
		}
		if *mode == "both" {
			bad = append(bad, "--restart: give one --mode (shm or pickle)")
		}
	}
	for _, n := range *restartObjects {
		if n < 1 || n > 1<<22 {
			bad = append(bad, fmt.Sprintf("--restart-objects %d: must be 1..4194304", n))
		}
	}
	if len(*restartObjects) > 0 && (!*restart || fs.Changed("prompts")) {
		bad = append(bad, "--restart-objects: only with --restart, and not with --prompts (the size sets the prompts)")
	}
	var adapters []settings.Adapter
	if *child {
		if *host != "" || len(*l2) > 0 {
			bad = append(bad, "--server-process: not with --host/--port or --l2-adapter (it starts its own server)")
		}
		if *mode == "both" {
			bad = append(bad, "--server-process: give one --mode (shm or pickle): one server process per run")
		}
	}
	if len(*l2) > 0 {
		if *host != "" {
			bad = append(bad, "--l2-adapter: only for the in-process engine (a target server has its own tiers)")
		}
		a, err := loadAdapters(*l2, environ)
		if err != nil {
			bad = append(bad, err.Error())
		}
		adapters = a
	}
	var baseline, fromRun *Result
	if *compare != "" {
		if baseline, err = loadSaved(*compare); err != nil {
			bad = append(bad, "--compare: "+err.Error())
		}
	}
	if *from != "" {
		if *compare == "" {
			bad = append(bad, "--from: only with --compare (it names the run to compare)")
		} else if fromRun, err = loadSaved(*from); err != nil {
			bad = append(bad, "--from: "+err.Error())
		}
	}
	if !(*failDrop >= 0 && *failDrop <= 100) {
		bad = append(bad, fmt.Sprintf("--fail-drop %v: must be a percentage in 0..100", *failDrop))
	} else if *failDrop > 0 && *compare == "" {
		bad = append(bad, "--fail-drop: only with --compare")
	}
	if len(bad) > 0 {
		for _, b := range bad {
			fmt.Fprintln(stderr, "kvdock bench: "+b)
		}
		return Options{}, 2
	}
	return Options{
		Model: m, Mode: *mode, Chunks: *chunks, Workers: *workers, Repeat: *repeat,
		Duration: *duration, SmallOps: *small, RefDuration: *refDur, Rounds: *rounds, Prompts: *prompts,
		PoolBytes: int64(*poolGB * (1 << 30)), Host: *host, Port: *port, ServerPID: *pid,
		HTTPHost: httpHost, HTTPPort: httpPort,
		Protocol: *proto, Timeout: *timeout, JSON: *asJSON, CPUProfile: *cpuprof,
		Adapters: adapters, Args: append([]string(nil), args...), ServerProcess: *child, Restart: *restart, RestartObjects: *restartObjects,
		Baseline: baseline, BaselinePath: *compare, From: fromRun, FailDrop: *failDrop,
	}, -1
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
