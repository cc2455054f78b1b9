// Package bench is `kvdock bench`: it drives a kvdock engine started in this
// process (real ZMQ over loopback) or a running server with N simulated
// LMCache non-GPU workers on the real wire protocol, in SHM and pickle mode,
// verifies every retrieved chunk, and reports throughput, latency, small
// request rates, CPU and memory against references measured in the same run
// (memcpy of the same bytes, a raw ZMQ ROUTER/DEALER echo of the same sizes);
// with --l2-adapter it measures each L2 tier the same way (tiers.go).
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"kvdock/assets"
	"kvdock/core/engine"
	"kvdock/core/protocol"
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
		Adapters: adapters, Args: append([]string(nil), args...), ServerProcess: *child,
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

// shmDir is where segments live (POSIX shm_open's tmpfs).
const shmDir = "/dev/shm"

// inProcessChunkTokens is the chunk size of the in-process engine (kvdock's default).
const inProcessChunkTokens = 256

// alignedChunk is a chunk's footprint in the pool (4 KiB aligned allocations).
func alignedChunk(b int64) int64 { return (b + 4095) &^ 4095 }

// poolFor returns the in-process pool size: the flag, or 1 GiB grown until
// one round (every worker storing one prompt) fits in 70% of it, below the
// eviction watermark (80%).
func poolFor(o Options, chunkBytes int64) int64 {
	if o.PoolBytes > 0 {
		return o.PoolBytes
	}
	need := int64(float64(int64(o.Workers)*int64(o.Chunks)*alignedChunk(chunkBytes)) / 0.7)
	need = (need + (1<<20 - 1)) &^ (1<<20 - 1)
	return max(int64(1)<<30, need)
}

// promptsFor is prompts per worker per round: 70% of the pool, at least one.
func promptsFor(o Options, pool, chunkBytes int64) int {
	if o.Prompts > 0 {
		return o.Prompts
	}
	n := int(float64(pool) * 0.7 / float64(int64(o.Workers)*int64(o.Chunks)*alignedChunk(chunkBytes)))
	return max(1, min(n, 64))
}

// Execute runs the benchmark; the Result is returned also with an error
// (whatever was measured before it).
func Execute(ctx context.Context, o Options) (*Result, error) {
	prof, err := protocol.Load(o.Protocol, assets.Protocol)
	if err != nil {
		return nil, err
	}
	lay, err := o.Model.chunkLayout(inProcessChunkTokens)
	if err != nil {
		return nil, err
	}
	res := &Result{
		Schema: 1, Command: "kvdock bench " + strings.Join(o.Args, " "), Started: time.Now().UTC(),
		Config: RunConfig{
			Model: o.Model, ChunkTokens: inProcessChunkTokens, ChunkBytes: lay.Bytes, Chunks: o.Chunks,
			Workers: o.Workers, Repeat: o.Repeat, DurationSeconds: o.Duration.Seconds(),
			InProcess: o.Host == "", ServerPID: o.ServerPID, CPUs: runtime.NumCPU(),
		},
	}
	if res.Config.InProcess {
		res.Config.PoolBytes = poolFor(o, lay.Bytes)
		res.Notes = append(res.Notes,
			"in-process: CPU seconds per GB is getrusage of the whole process, so it mixes the workers' (client) and the server's CPU",
			"in-process: peak RSS beyond the pool = VmHWM (reset per mode through /proc/self/clear_refs) − pool × its mappings in this process (the server's, plus the SHM workers' own MAP_POPULATE mapping) − the bench's own buffers (chunk pattern, per-worker retrieve destinations and pickle encode buffers); pickle mode also holds the workers' own copies of each message (libzmq's and Go's): --server-process measures the server alone",
			"the large echo reference counts bytes in both directions (a round trip moves the message twice); pickle store and retrieve count each chunk once",
			"SHM figures compare against a single-stream memcpy of the same chunk bytes into prefaulted shared-memory pages (references.memcpy_segment_gbps; private memory: memcpy_gbps, shown as store/retrieve_vs_memcpy_private); with several workers they share the CPUs")
	}
	modes := []string{o.Mode}
	if o.Mode == "both" {
		modes = []string{"shm", "pickle"}
	}
	var tgt *target
	if !res.Config.InProcess {
		res.Config.Endpoint = endpointOf(o.Host, o.Port)
		if !o.ServerProcess {
			res.Notes = append(res.Notes, "target server: nothing is cleared between rounds; evicted chunks show as misses")
		}
		o.progress.setPhase("checking the server", "")
		if tgt, err = probeTarget(ctx, o, prof, int64(os.Getpid())<<12+3<<8); err != nil {
			return nil, err
		}
		res.Config.PoolBytes, _ = tgt.pool()
		var run []string
		for _, m := range modes {
			if ok, why := tgt.servable(m); !ok {
				res.Skipped = append(res.Skipped, Skip{Mode: m, Reason: why})
				continue
			}
			run = append(run, m)
		}
		if len(run) == 0 {
			var why []string
			for _, sk := range res.Skipped {
				why = append(why, sk.Mode+" mode: "+sk.Reason)
			}
			return nil, fmt.Errorf("nothing to measure against %s:\n  %s", res.Config.Endpoint, strings.Join(why, "\n  "))
		}
		if tgt.advertised() && slices.Contains(run, "pickle") {
			res.Notes = append(res.Notes, "pickle mode against a server sharing a segment: the workers are those that could not attach it; kvdock switches each to pickle at its first store (one fallback event per worker in the server's log)")
		}
		modes = run
	}
	// memcpy is measured before the modes and again with the other
	// references; the better figure is the reference (the stricter ratio on a
	// noisy machine).
	refSrc := newPattern(int(lay.Bytes), 0xc0ffee).chunk(0)
	memcpyBefore := memcpyGBps(refSrc, o.RefDuration/2)
	// Where SHM mode runs in process, the segment reference is measured in
	// the segment itself (runMode); elsewhere in a tmpfs mapping of the
	// pool's size, sampled here and with the other references.
	ownSegment := res.Config.InProcess && slices.Contains(modes, "shm")
	var tmpfsSamples []float64
	var tmpfsErr error
	tmpfsRef := func(dur time.Duration) {
		if ownSegment || tmpfsErr != nil {
			return
		}
		v, err := tmpfsCopyRate(shmDir, res.Config.PoolBytes, refSrc, dur)
		if err != nil {
			tmpfsErr = err
			return
		}
		tmpfsSamples = append(tmpfsSamples, round4(v))
	}
	tmpfsRef(o.RefDuration / 2)
	var errs []error
	for i, mode := range modes {
		mr, chunkTok, err := runMode(ctx, o, prof, mode, tgt, res.Config.PoolBytes, int64(os.Getpid())<<12+int64(i)<<8)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s mode: %w", mode, err))
		}
		if mr == nil {
			continue
		}
		if chunkTok != res.Config.ChunkTokens {
			res.Config.ChunkTokens = chunkTok
			if l, err := o.Model.chunkLayout(chunkTok); err == nil {
				res.Config.ChunkBytes = l.Bytes
			}
		}
		if mode == "shm" {
			res.SHM = mr
		} else {
			res.Pickle = mr
		}
		if ctx.Err() != nil {
			break
		}
	}
	if len(o.Adapters) > 0 {
		trs, err := runTiers(ctx, o, prof, res.Config.PoolBytes, int64(os.Getpid())<<12+int64(len(modes))<<8)
		res.Tiers = trs
		if err != nil {
			errs = append(errs, fmt.Errorf("tiers: %w", err))
		}
		res.Notes = append(res.Notes,
			"tiers: one in-process engine per adapter with that one tier; write = the stores until the write-behind queue drained (the tier's byte count over that wall time); prefetch-read = LOOKUP + prefetch + retrieve after L1 was cleared (the tier's read bytes over the slowest worker's time for it, less the bench's own checksums)",
			"tiers: NOOP and LOOKUP+STATUS are measured while one more worker keeps storing new chunks, on an engine with the tier (its write queue full) and on one without a tier (the same load)")
	}
	o.progress.setPhase("references", "memcpy, raw ZMQ echo")
	if err := res.measureReferences(ctx, o, prof); err != nil {
		errs = append(errs, err)
	}
	res.References.MemcpySamplesGBps = []float64{round4(memcpyBefore), res.References.MemcpyGBps}
	res.References.MemcpyGBps = max(res.References.MemcpyGBps, round4(memcpyBefore))
	tmpfsRef(o.RefDuration)
	switch {
	case ownSegment && res.SHM != nil && len(res.SHM.segSamples) > 0:
		res.References.MemcpySegmentSamplesGBps = res.SHM.segSamples
		res.References.MemcpySegmentGBps = res.SHM.MemcpyIntoSegmentGBps
		res.References.MemcpySegmentMethod = fmt.Sprintf("memcpy into the in-process engine's own segment %s (the bench's MAP_SHARED|MAP_POPULATE mapping, pages the pool was not using), sampled before the SHM transfers, between their rounds and after them, the mean kept; SHM targets are judged against it", res.SHM.ShmName)
	case ownSegment:
		res.References.MemcpySegmentMethod = "not measured: SHM mode did not reach its transfers; SHM targets are judged against memcpy into private memory"
	case tmpfsErr != nil:
		res.References.MemcpySegmentMethod = "not measured: " + tmpfsErr.Error() + "; SHM targets are judged against memcpy into private memory"
	default:
		res.References.MemcpySegmentSamplesGBps = tmpfsSamples
		res.References.MemcpySegmentGBps = slices.Max(tmpfsSamples)
		why := "a target server's segment is its live pool, which the bench must not overwrite"
		if res.Config.InProcess {
			why = "no in-process segment in this run"
		}
		res.References.MemcpySegmentMethod = fmt.Sprintf("memcpy into a MAP_SHARED mapping of an unlinked %s file of the pool's size (%d bytes), tmpfs pages like the segment's (%s), before and after the modes, the better kept; SHM targets are judged against it", shmDir, max(res.Config.PoolBytes, int64(memcpyDests)*lay.Bytes), why)
	}
	res.finish()
	return res, errors.Join(errs...)
}

func endpointOf(host string, port int) string {
	if host == "localhost" {
		host = "127.0.0.1"
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return "tcp://" + host + ":" + strconv.Itoa(port)
}

// runMode measures one transfer mode against a fresh in-process engine or
// the target server.
func runMode(ctx context.Context, o Options, prof *protocol.Profile, mode string, tgt *target, pool, instanceBase int64) (*ModeResult, int, error) {
	endpoint := endpointOf(o.Host, o.Port)
	if o.Host == "" {
		o.progress.setPhase(mode+": starting the engine", "")
		eng, ep, err := startEngine(ctx, o, mode, pool, nil)
		if err != nil {
			return nil, 0, err
		}
		defer func() { _ = eng.Stop(context.Background()) }()
		endpoint = ep
	}
	d, err := newDriver(ctx, driverConfig{
		Endpoint: endpoint, Profile: prof, Mode: mode, Model: o.Model, Chunks: o.Chunks,
		Workers: o.Workers, Repeat: o.Repeat, Timeout: o.Timeout, Rounds: o.Rounds,
		Duration: o.Duration, ClearBetweenRounds: o.Host == "" || o.ServerProcess, InstanceBase: instanceBase,
		PickleOnSHM: tgt != nil && tgt.status != nil, Progress: o.progress,
	})
	if err != nil {
		return nil, 0, err
	}
	defer d.close(context.Background())
	// A target's pool: from /status, else advertised, else unknown (0).
	if tgt != nil {
		pool, _ = tgt.pool()
	}
	sizing := pool
	if sizing == 0 {
		sizing = 1 << 30 // unknown: assume kvdock's default
	}
	d.cfg.PromptsPerRound = promptsFor(o, sizing, d.lay.Bytes)

	mr := &ModeResult{Mode: mode, Endpoint: endpoint, ShmName: d.shmName, PoolBytes: pool, LookupChunks: 16}
	meter := cpuMeter{pid: o.ServerPID}
	rssPID := o.ServerPID
	rssOK := o.Host == "" || o.ServerPID > 0
	if rssOK {
		if o.Host == "" {
			// Give back what earlier phases freed, so their garbage is not
			// part of this mode's peak.
			debug.FreeOSMemory()
		}
		if err := resetHWM(rssPID); err != nil && o.Host == "" {
			return nil, 0, err
		}
	}
	// The segment reference: the same copy into the segment's own pages,
	// which the fresh in-process pool does not use yet (the transfers and
	// their clear between rounds leave them free again for the second sample).
	segRef := func(dur time.Duration) {
		if mode == "shm" && o.Host == "" && len(d.seg) > 0 {
			src := d.pat.chunk(0)
			n := min(int64(len(d.seg))/2/int64(len(src)), memcpyDests) * int64(len(src))
			mr.segSamples = append(mr.segSamples, round4(copyRate(d.seg[:n], src, dur)))
			// The retrieve's direction: out of the same pages into the
			// first worker's resident destination, the buffer its
			// retrieves copy each chunk into (no new memory in the peak).
			mr.segOutSamples = append(mr.segOutSamples, round4(copyOutRate(d.dests[0], d.seg[:n], dur)))
		}
	}
	segRef(o.RefDuration / 2)
	// Sampled between the rounds too (the pool is cleared there, so its
	// low pages are free again), so that a machine whose memory bandwidth
	// drifts during the run (a shared VM) moves the reference with the
	// transfers; the mean of the samples is kept.
	d.cfg.AfterRound = func() { segRef(o.RefDuration / 4) }
	cpu0, cpuErr := meter.seconds()
	tr := d.transfer(ctx)
	cpu1, cpuErr2 := meter.seconds()
	hwm, rssErr := int64(0), error(nil)
	if rssOK {
		hwm, rssErr = vmHWM(rssPID)
		mr.RSSNow = rssBreakdown(rssPID)
	}
	mr.Rounds, mr.Prompts = tr.rounds, tr.prompts
	mr.StoreBytes, mr.RetrieveByte = tr.storeBytes, tr.retrieveBytes
	mr.StoreGBps = round4(gbps(tr.storeBytes, tr.storeBusy))
	mr.RetrieveGBps = round4(gbps(tr.retrieveBytes, tr.retrieveBusy))
	mr.StoreWallGBps = round4(gbps(tr.storeBytes, tr.storeWall))
	if mode == "shm" && o.Workers == 1 {
		// One worker's copies over their own time; with more workers the
		// busy time is the slowest worker's and its copies are not all the
		// bytes, so no copy rate is given.
		mr.StoreCopyGBps = round4(gbps(tr.storeBytes, tr.storeCopy))
		mr.RetrieveCopyGBps = round4(gbps(tr.retrieveBytes, tr.retrieveCopy))
	}
	mr.RetrieveWallGBps = round4(gbps(tr.retrieveBytes, tr.retrieveWall))
	mr.StoreP50us, mr.StoreP99us = percentileUS(tr.storeLat, 50), percentileUS(tr.storeLat, 99)
	mr.RetrieveP50, mr.RetrieveP99 = percentileUS(tr.retrieveLat, 50), percentileUS(tr.retrieveLat, 99)
	mr.CachedStores, mr.MissChunks = tr.cachedStores, tr.missChunks

	moved := float64(tr.storeBytes+tr.retrieveBytes) / 1e9
	switch {
	case cpuErr != nil || cpuErr2 != nil:
		mr.CPUSecondsPerGB, mr.CPUMethod = -1, "not measured: "+errors.Join(cpuErr, cpuErr2).Error()
	case moved == 0:
		mr.CPUSecondsPerGB, mr.CPUMethod = -1, "not measured: nothing moved"
	case o.ServerPID > 0:
		mr.CPUSecondsPerGB, mr.CPUMethod = round4((cpu1-cpu0)/moved), fmt.Sprintf("server pid %d, /proc/%d/stat utime+stime over the store and retrieve phases", o.ServerPID, o.ServerPID)
	default:
		mr.CPUSecondsPerGB, mr.CPUMethod = round4((cpu1-cpu0)/moved), "getrusage(RUSAGE_SELF) over the store and retrieve phases: client and server together (in process)"
		if o.Host != "" {
			mr.CPUMethod = "getrusage of the bench only (no --server-pid): client CPU"
		}
	}

	switch {
	case !rssOK:
		mr.PeakRSSBeyondMiB, mr.RSSMethod = -1, "not measured: give --server-pid"
	case rssErr != nil:
		mr.PeakRSSBeyondMiB, mr.RSSMethod = -1, "not measured: "+rssErr.Error()
	case o.Host == "":
		mappings := int64(1)
		if mode == "shm" {
			mappings = 2
		}
		own := int64(len(d.pat.data)) + d.workerBuf
		mr.PeakRSSBeyondMiB = round4(float64(hwm-pool*mappings-own) / (1 << 20))
		mr.RSSMethod = fmt.Sprintf("VmHWM %d − pool %d × %d mappings − bench buffers %d", hwm, pool, mappings, own)
	case pool == 0:
		why := "its HTTP API is off (--http-port 0)"
		if tgt.statusErr != nil {
			why = fmt.Sprintf("its /status (%s) could not be used: %v", tgt.statusURL, tgt.statusErr)
		}
		mr.PeakRSSBeyondMiB, mr.RSSMethod = -1, fmt.Sprintf("not measured: the server's pool size is unknown (a pickle server advertises none, and %s); give --http-host/--http-port", why)
	default:
		resident, from := tgt.residentPool()
		mr.PeakRSSBeyondMiB = round4(float64(hwm-resident) / (1 << 20))
		mr.RSSMethod = fmt.Sprintf("server VmHWM %d − %s %d", hwm, from, resident)
	}

	d.cfg.AfterRound = nil
	segRef(o.RefDuration / 2)
	if len(mr.segSamples) > 0 {
		mr.MemcpyIntoSegmentGBps = round4(mean(mr.segSamples))
	}
	if len(mr.segOutSamples) > 0 {
		mr.MemcpyFromSegmentGBps = round4(mean(mr.segOutSamples))
	}
	o.progress.setPhase(mode+": small requests", "NOOP, LOOKUP+STATUS, in turns with the raw echo")
	small, look, typ, err := echoFrames(d.cfg.Model, d.chunkTok, prof)
	if err != nil {
		return nil, 0, err
	}
	sr, ech, err := d.smallOpsBesideEcho(ctx, o.SmallOps, small, look)
	if err != nil {
		tr.fail(fmt.Errorf("small requests: %w", err))
	}
	mr.NoopRTPS = round4(sr.noopRTPS)
	mr.LookupPairsPS = round4(sr.lookupPairsPS)
	mr.LookupRTPS = round4(2 * sr.lookupPairsPS)
	mr.EchoNoopRTPS, mr.EchoLookupRTPS = round4(ech.noop), round4(ech.lookup)
	tr.merge(&sr.counters)
	if mode == "pickle" {
		mr.LargestMessageBytes = d.largestMessage()
	}
	o.progress.setPhase(mode+": small requests under a store stream", "NOOP, LOOKUP+STATUS, in turns with the raw echo under a raw stream")
	uid, _ := protocol.Encode(int64(1) << 40)
	large := [][]byte{uid, typ(protocol.CommitStore), d.pat.chunk(1)}
	lr, lech, err := d.smallOpsUnderStoreBesideEcho(ctx, o.SmallOps, instanceBase+200, small, look, large)
	if err != nil {
		tr.fail(fmt.Errorf("small requests under a store stream: %w", err))
	} else {
		mr.NoopLoadedRTPS = round4(lr.noopRTPS)
		mr.LookupLoadedRTPS = round4(2 * lr.lookupPairsPS)
		mr.StreamGBps = round4(lr.streamGBps)
		mr.EchoNoopLoadedRTPS, mr.EchoLookupLoadedRTPS = round4(lech.noop), round4(lech.lookup)
		tr.merge(&lr.counters)
	}
	mr.Mismatches, mr.Timeouts, mr.Errors, mr.FirstError = tr.mismatches, tr.timeouts, tr.errors, tr.firstErr
	return mr, d.chunkTok, nil
}

func gbps(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds() / 1e9
}

// startEngine starts a kvdock engine on a free loopback port with a segment
// name of its own (SHM) or SHM off (pickle), and waits for the pool's
// prefault so the first stores do not pay for it. The adapters (none: nil)
// are its L2 tiers, with a write queue as large as the pool so that a
// measured write is never dropped for want of queue room.
func startEngine(ctx context.Context, o Options, mode string, pool int64, adapters []settings.Adapter) (*engine.Engine, string, error) {
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	cfg := settings.Default()
	cfg.Server.Host = "127.0.0.1"
	cfg.Server.Port = port
	cfg.Server.Protocol = o.Protocol
	cfg.L1.SizeGB = float64(pool) / (1 << 30)
	cfg.L1.Prefault = true
	lay, err := o.Model.chunkLayout(cfg.Server.ChunkSize)
	if err != nil {
		return nil, "", err
	}
	cfg.Server.MaxMessageBytes = max(cfg.Server.MaxMessageBytes, int64(o.Chunks)*lay.Bytes*2+(1<<20))
	name := ""
	if mode == "shm" {
		name = fmt.Sprintf("kvdock_bench_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	}
	cfg.Server.ShmName = &name
	cfg.L2.Adapters = adapters
	cfg.L2.QueueBytes = max(cfg.L2.QueueBytes, pool)
	if err := settings.Validate(cfg, nil); err != nil {
		return nil, "", fmt.Errorf("bench engine config: %w", err)
	}
	eng := engine.New(cfg, engine.Options{Logger: slog.New(slog.DiscardHandler), Version: "bench"})
	if err := eng.Start(ctx); err != nil {
		return nil, "", fmt.Errorf("start engine: %w", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		s := eng.Snapshot()
		if s.Pool.Prefaulted >= s.Pool.Size || time.Now().After(deadline) || ctx.Err() != nil {
			return eng, s.Endpoint, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// measureReferences runs memcpy and the raw ZMQ echoes (same sizes as the
// workload's messages, as many streams as workers).
func (r *Result) measureReferences(ctx context.Context, o Options, prof *protocol.Profile) error {
	chunk := r.Config.ChunkBytes
	pat := newPattern(int(chunk), 0xc0ffee)
	r.References.MemcpyGBps = round4(memcpyGBps(pat.chunk(0), o.RefDuration))
	small, look, typ, err := echoFrames(o.Model, r.Config.ChunkTokens, prof)
	if err != nil {
		return fmt.Errorf("references: %w", err)
	}
	uid, _ := protocol.Encode(int64(1) << 40)
	r.References.EchoStreams = o.Workers
	var errs []error
	e, err := echo(ctx, small, o.Workers, o.RefDuration)
	errs = append(errs, err)
	r.References.EchoNoopBytes, r.References.EchoNoopRTPS = size(small), round4(e.RoundTripsPS)
	e, err = echo(ctx, look, o.Workers, o.RefDuration)
	errs = append(errs, err)
	r.References.EchoLookupBytes, r.References.EchoLookupRTPS = size(look), round4(e.RoundTripsPS)
	large := [][]byte{uid, typ(protocol.CommitStore), pat.chunk(1)}
	e, err = echo(ctx, large, o.Workers, o.RefDuration)
	errs = append(errs, err)
	r.References.EchoLargeBytes, r.References.EchoLargeGBps = size(large), round4(e.GBps)
	if (r.SHM != nil && r.SHM.NoopLoadedRTPS > 0) || (r.Pickle != nil && r.Pickle.NoopLoadedRTPS > 0) {
		e, err = echoUnder(ctx, small, o.Workers, o.RefDuration, large)
		errs = append(errs, err)
		r.References.EchoNoopLoadedRTPS = round4(e.RoundTripsPS)
		e, err = echoUnder(ctx, look, o.Workers, o.RefDuration, large)
		errs = append(errs, err)
		r.References.EchoLookupLoadedRTPS = round4(e.RoundTripsPS)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("references: %w", err)
	}
	return nil
}

// echoFrames builds the raw echo's messages of the small requests: a NOOP
// and a LOOKUP of a 16-chunk prompt (frames as the workers send them, uid
// first), and returns how a request type is encoded.
func echoFrames(m Model, chunkTokens int, prof *protocol.Profile) (small, look [][]byte, typ func(string) []byte, err error) {
	uid, _ := protocol.Encode(int64(1) << 40)
	typ = func(name string) []byte {
		spec, ok := prof.ByName(name)
		if !ok {
			return []byte{0}
		}
		b, _ := protocol.Encode(spec.Number)
		return b
	}
	lw := &workload{chunkTokens: chunkTokens, chunks: 16}
	p := lw.prompt(1<<15, 0, 0)
	key, err := protocol.Encode(protocol.Key{ModelName: benchModel(m), WorldSize: 1, TokenIDs: p.tokens, End: len(p.tokens), RequestID: "bench-small-w0"})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("encode the LOOKUP key: %w", err)
	}
	one, _ := protocol.Encode(int64(1))
	return [][]byte{uid, typ(protocol.Noop)}, [][]byte{uid, typ(protocol.Lookup), key, one}, typ, nil
}

func mean(xs []float64) float64 {
	var t float64
	for _, x := range xs {
		t += x
	}
	return t / float64(len(xs))
}

func size(frames [][]byte) int {
	n := 0
	for _, f := range frames {
		n += len(f)
	}
	return n
}
