package bench

// --restart: the gap a kvdock restart leaves and the hit ratio around it.
// A server process keeps its pool (--l1-keep-on-exit); the workers fill a
// working set, then look it up and retrieve it without pause while the
// server restarts by SIGUSR2 (re-executing itself) and by SIGTERM followed
// by the same command line. Nobody registers again. With --restart-objects
// each size gets a server process of its own whose pool the workers fill
// with that many objects first, so the gap is measured per table size.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/ui/httpapi"
)

// restartWindow is how long before a restart and after the first answer
// the hit ratios cover.
const restartWindow = time.Second

// RestartResult is what --restart measured.
type RestartResult struct {
	Command    string    `json:"command"`
	Started    time.Time `json:"started"`
	Model      Model     `json:"model"`
	Mode       string    `json:"mode"`
	ChunkBytes int64     `json:"chunk_bytes"`
	Chunks     int       `json:"chunks"`
	Workers    int       `json:"workers"`
	WorkingSet int       `json:"working_set_prompts"`
	PoolBytes  int64     `json:"pool_bytes"`
	// Sizes are the --restart-objects asked for (empty: one working set
	// of --prompts per worker).
	Sizes       []int        `json:"sizes,omitempty"`
	Restarts    []RestartRun `json:"restarts"`
	Definitions []string     `json:"definitions"`
}

// RestartRun is one restart seen from the workers.
type RestartRun struct {
	Way string `json:"way"`
	// Size is the objects the pool was filled with (--restart-objects; 0:
	// the working set alone), Stored the objects the server held before
	// the signal, WorkingSet the prompts the workers stored and read.
	Size       int   `json:"size,omitempty"`
	Stored     int64 `json:"stored_objects"`
	WorkingSet int   `json:"working_set_prompts"`
	// GapMs is the longest time without an answer after the signal to a
	// NOOP probe sent 1 ms after each answer on a DEALER of its own; WorkersGapMs the longest time no worker's lookup was
	// answered (longer when their requests in flight were lost: they wait
	// for their timeout);
	// ServerGapMs is the gap the new process reports in /status.
	GapMs        float64 `json:"gap_ms"`
	WorkersGapMs float64 `json:"workers_gap_ms"`
	ServerGapMs  float64 `json:"server_gap_ms"`
	Adopted      bool    `json:"adopted"`
	Objects      int64   `json:"adopted_objects"`
	Reason       string  `json:"reason,omitempty"`
	// Before is the second before the signal, After the second from the
	// answer that ended the workers' gap.
	Before RestartWindow `json:"before"`
	After  RestartWindow `json:"after"`
	// Failed are lookups or retrieves that timed out or failed (a request
	// in flight at the signal that is never answered times out); Mismatches
	// chunks whose bytes differ.
	Failed int64 `json:"failed"`
	// Lost are the workers' requests never answered (timed out); the
	// server's handover figures say what the old process parked and
	// answered, and what reached it after its last answer.
	Lost           int64  `json:"lost_requests"`
	HandoverParked int64  `json:"handover_parked"`
	HandoverLost   int64  `json:"handover_lost"`
	Mismatches     int64  `json:"mismatches"`
	FirstError     string `json:"first_error,omitempty"`
}

// RestartWindow is the lookups completed in one second.
type RestartWindow struct {
	Lookups   int64   `json:"lookups"`
	Requested int64   `json:"requested_chunks"`
	Hit       int64   `json:"hit_chunks"`
	HitRatio  float64 `json:"hit_ratio"`
}

// restartSample is one lookup (and retrieve of its hits) done.
type restartSample struct {
	sent, done     time.Time
	requested, hit int
	failed, lost   bool
	mismatches     int64
	err            string
}

// executeRestart runs --restart: per size (one when --restart-objects is
// not given) a server process, a working set, and one measured restart per
// way.
func executeRestart(ctx context.Context, o Options) (*RestartResult, error) {
	_, lay, err := o.profileAndLayout()
	if err != nil {
		return nil, err
	}
	res := &RestartResult{
		Command: "kvdock bench " + strings.Join(o.Args, " "), Started: time.Now().UTC(), Model: o.Model,
		Mode: o.Mode, ChunkBytes: lay.Bytes, Chunks: o.Chunks, Workers: o.Workers, Sizes: o.RestartObjects,
		Definitions: []string{
			"gap: the longest time without an answer after the signal to a NOOP probe sent 1 ms after each answer on a DEALER of its own (waiting for each answer, as a worker does); workers' gap: the longest time no worker's lookup was answered, which includes waiting out a request lost at the signal",
			"before: lookups completed in the second before the signal; after: in the second from the answer that ended the workers' gap",
			"hit ratio: hit chunks / requested chunks of those lookups; the working set was stored once, before the first restart",
			"lost: the workers' requests never answered (each waited out --timeout); failed: lookups or retrieves that timed out or failed",
			"objects: the pool filled with that many objects (one server process per size), stored: the objects it held at the signal",
		},
	}
	sizes := o.RestartObjects
	if len(sizes) == 0 {
		sizes = []int{0}
	}
	for _, size := range sizes {
		runs, err := restartSize(ctx, o, lay.Bytes, size, res)
		res.Restarts = append(res.Restarts, runs...)
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// restartSize starts a server process, fills its pool with size objects
// (0: one working set of --prompts per worker) and restarts it once per
// way under the workers' lookups.
func restartSize(ctx context.Context, o Options, chunkBytes int64, size int, res *RestartResult) ([]RestartRun, error) {
	prof, _, err := o.profileAndLayout()
	if err != nil {
		return nil, err
	}
	pool := poolFor(o, chunkBytes)
	repeat, prompts := o.Repeat, 0
	if size > 0 {
		// Distinct prompts only, so that the pool holds size objects.
		per := o.Workers * o.Chunks
		prompts, repeat = (size+per-1)/per, 0
		need := int64(float64(int64(prompts*per)*alignedChunk(chunkBytes))/0.7) + 1<<20
		pool = max(pool, need&^(1<<20-1))
	}
	res.PoolBytes = max(res.PoolBytes, pool)
	what := "restart"
	if size > 0 {
		what = fmt.Sprintf("restart at %d objects", size)
	}
	o.progress.setPhase(what+": starting the server process", "")
	c, err := startChild(ctx, o, o.Mode, pool, "--l1-keep-on-exit")
	if err != nil {
		return nil, err
	}
	defer c.stopKept()
	d, err := newDriver(ctx, driverConfig{
		Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", c.port), Profile: prof, Mode: o.Mode, Model: o.Model,
		Chunks: o.Chunks, Workers: o.Workers, Repeat: repeat, Timeout: o.Timeout,
		InstanceBase: int64(os.Getpid()) * 1000, PickleOnSHM: true, Progress: o.progress,
	})
	if err != nil {
		return nil, err
	}
	defer d.close(context.Background())
	d.cfg.PromptsPerRound = promptsFor(o, pool, d.lay.Bytes)
	if size > 0 {
		d.cfg.PromptsPerRound = prompts
	}
	res.WorkingSet = max(res.WorkingSet, o.Workers*d.cfg.PromptsPerRound)
	o.progress.setPhase(what+": storing the working set", "")
	var st counters
	d.phase(ctx, &st, 0, d.storeWorker)
	if n := st.timeouts + st.errors + st.mismatches; n > 0 {
		return nil, fmt.Errorf("storing the working set: %d failures, first: %s", n, st.firstErr)
	}
	ways := []struct {
		name    string
		restart func() error
	}{
		{"SIGUSR2", func() error { return c.cmd.Process.Signal(syscall.SIGUSR2) }},
		{"SIGTERM + the same command line", c.restartTerm},
	}
	var runs []RestartRun
	for _, way := range ways {
		o.progress.setPhase(what+": "+way.name, "")
		run, err := d.measureRestart(ctx, c, way.name, way.restart)
		if run != nil {
			run.Size, run.WorkingSet = size, o.Workers*d.cfg.PromptsPerRound
			runs = append(runs, *run)
		}
		if err != nil {
			return runs, err
		}
	}
	return runs, nil
}

// measureRestart keeps every worker looking up and retrieving the working
// set while restart runs, and returns what they saw.
func (d *driver) measureRestart(ctx context.Context, c *childServer, way string, restart func() error) (*RestartRun, error) {
	before, err := c.restartStatus()
	if err != nil {
		return nil, err
	}
	// The probe waits for each answer as a worker does: one that gave up
	// early and sent again would keep the old process's handover from
	// going quiet, and its park phase would last its bound.
	probe, err := client.Dial(d.cfg.Endpoint, d.cfg.Profile, client.Options{Timeout: d.cfg.Timeout})
	if err != nil {
		return nil, err
	}
	defer probe.Close()
	stop := make(chan struct{})
	samples := make([][]restartSample, d.cfg.Workers)
	var probes []restartSample
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			sent := time.Now()
			_, err := probe.Call(ctx, protocol.Noop)
			probes = append(probes, restartSample{sent: sent, done: time.Now(), failed: err != nil})
		}
	})
	for w := range d.cfg.Workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				samples[w] = append(samples[w], d.lookupAndRetrieve(ctx, w, d.wl.prompt(w, 0, i%d.cfg.PromptsPerRound)))
			}
		})
	}
	finish := func() []restartSample {
		close(stop)
		wg.Wait()
		all := slices.Concat(samples...)
		sortSamples(all)
		return all
	}
	time.Sleep(restartWindow + restartWindow/2)
	signalled := time.Now()
	if err := restart(); err != nil {
		finish()
		return nil, fmt.Errorf("%s: %w", way, err)
	}
	after, err := c.waitRestarted(ctx, before.StartedAt, 60*time.Second)
	if err != nil {
		finish()
		return nil, fmt.Errorf("%s: %w", way, err)
	}
	// Long enough for workers whose request was lost to time out and
	// come back.
	time.Sleep(max(restartWindow+restartWindow/2, time.Until(signalled.Add(d.cfg.Timeout+restartWindow))))
	run := summarize(finish(), signalled)
	run.Way, run.WorkersGapMs = way, run.GapMs
	run.GapMs, _ = longestHole(probes, signalled)
	run.ServerGapMs, run.Adopted, run.Objects, run.Reason = float64(after.Restart.GapMS), after.Restart.Adopted, int64(after.Restart.AdoptedObjects), after.Restart.Reason
	run.HandoverParked, run.HandoverLost, run.Stored = after.Restart.HandoverParked, after.Restart.HandoverLost, int64(before.Pool.Objects)
	return run, nil
}

// lookupAndRetrieve is one prompt as a running worker reads it: LOOKUP,
// PREPARE/COMMIT_RETRIEVE of the hits with every chunk verified,
// END_SESSION.
func (d *driver) lookupAndRetrieve(ctx context.Context, w int, p prompt) restartSample {
	var st counters
	sent := time.Now()
	hits, err := d.lookup(ctx, w, &st, p)
	if err == nil && hits > 0 {
		d.retrieveOne(ctx, w, &st, p, min(hits, len(p.ids)))
	}
	_, _ = d.call(ctx, d.clients[w], &st, protocol.EndSession, p.requestID)
	return restartSample{sent: sent, done: time.Now(), requested: len(p.ids), hit: hits,
		failed: st.timeouts+st.errors > 0, lost: st.timeouts > 0, mismatches: st.mismatches, err: st.firstErr}
}

func sortSamples(all []restartSample) {
	slices.SortFunc(all, func(a, b restartSample) int { return a.done.Compare(b.done) })
}

// summarize finds the workers' gap (the longest time no lookup was
// answered, after the signal) and the windows around it.
func summarize(all []restartSample, signalled time.Time) *RestartRun {
	run := &RestartRun{}
	for _, s := range all {
		if s.lost {
			run.Lost++
		}
		if s.failed {
			run.Failed++
			if run.FirstError == "" {
				run.FirstError = s.err
			}
		}
		run.Mismatches += s.mismatches
	}
	gap, resume := longestHole(all, signalled)
	if resume.IsZero() {
		return run // nothing answered after the signal
	}
	run.GapMs = gap
	for _, s := range all {
		switch {
		case s.failed:
		case !s.done.Before(signalled.Add(-restartWindow)) && s.done.Before(signalled):
			run.Before.add(s)
		case !s.done.Before(resume) && s.done.Before(resume.Add(restartWindow)):
			run.After.add(s)
		}
	}
	return run
}

// longestHole is the longest time between two answers (in order of
// arrival) where the later came after the signal, in ms, and when that
// later answer came.
func longestHole(all []restartSample, signalled time.Time) (float64, time.Time) {
	var prev, end time.Time
	var hole time.Duration
	for _, s := range all {
		if s.failed {
			continue
		}
		if !prev.IsZero() && s.done.After(signalled) && s.done.Sub(prev) > hole {
			hole, end = s.done.Sub(prev), s.done
		}
		prev = s.done
	}
	return float64(hole.Microseconds()) / 1e3, end
}

func (w *RestartWindow) add(s restartSample) {
	w.Lookups++
	w.Requested += int64(s.requested)
	w.Hit += int64(max(0, s.hit))
	if w.Requested > 0 {
		w.HitRatio = float64(w.Hit) / float64(w.Requested)
	}
}

// restartStatus reads the server process's /status: what a restart
// changes (started_at, the restart's figures, the pool's objects).
func (c *childServer) restartStatus() (httpapi.Status, error) {
	var st httpapi.Status
	hc := http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/status", c.http))
	if err != nil {
		return st, fmt.Errorf("server process /status: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("server process /status: %w", err)
	}
	if st.StartedAt == nil {
		return st, errors.New("server process /status: no started_at")
	}
	return st, nil
}

// waitRestarted polls /status until a process started after was answers.
func (c *childServer) waitRestarted(ctx context.Context, was *time.Time, limit time.Duration) (httpapi.Status, error) {
	deadline := time.Now().Add(limit)
	for {
		if st, err := c.restartStatus(); err == nil && !st.StartedAt.Equal(*was) {
			return st, nil
		}
		if time.Now().After(deadline) {
			return httpapi.Status{}, fmt.Errorf("no new server process within %v: %s", limit, c.logTail())
		}
		select {
		case <-ctx.Done():
			return httpapi.Status{}, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// restartTerm stops the server with SIGTERM (it keeps its pool) and starts
// the same command line again.
func (c *childServer) restartTerm() error {
	if err := c.terminate(); err != nil {
		return err
	}
	cmd := exec.Command(c.cmd.Path, c.cmd.Args[1:]...)
	cmd.Env = c.cmd.Env
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the server process again: %w", err)
	}
	go func() { _ = cmd.Wait() }() // reaped when it ends
	c.cmd = cmd
	return nil
}

// terminate sends SIGTERM and waits (10 s) until the process is gone.
func (c *childServer) terminate() error {
	p := c.cmd.Process
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("SIGTERM the server process: %w", err)
	}
	for range 1000 {
		if p.Signal(syscall.Signal(0)) != nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("server process still running 10 s after SIGTERM: %s", c.logTail())
}

// stopKept stops a server that keeps its pool at exit and removes the
// pool's segment too.
func (c *childServer) stopKept() {
	st, err := c.restartStatus()
	c.stop()
	if err == nil && st.ShmName != "" {
		_ = os.Remove(filepath.Join(shmDir, st.ShmName))
	}
}

func (c *childServer) logTail() string {
	log, _ := os.ReadFile(filepath.Join(c.dir, "kvdock.log"))
	return tail(string(log), 2000)
}

// WriteJSON writes r as one indented JSON object.
func (r *RestartResult) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes r for a terminal.
func (r *RestartResult) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "restart: %s mode, %d workers, prompts of %d chunks (%d B each), pool %d MiB\n\n",
		r.Mode, r.Workers, r.Chunks, r.ChunkBytes, r.PoolBytes>>20)
	fmt.Fprintln(tw, "objects\tway\tgap ms\tworkers' gap ms\tserver gap ms\tadopted objects\thit ratio before\tafter (first second)\tlost\tfailed\tmismatches")
	for _, x := range r.Restarts {
		adopted := fmt.Sprint(x.Objects)
		if !x.Adopted {
			adopted = "none: " + x.Reason
		}
		fmt.Fprintf(tw, "%d\t%s\t%.1f\t%.1f\t%.1f\t%s\t%.3f (%d lookups)\t%.3f (%d lookups)\t%d\t%d\t%d\n", x.Stored, x.Way, x.GapMs, x.WorkersGapMs, x.ServerGapMs, adopted,
			x.Before.HitRatio, x.Before.Lookups, x.After.HitRatio, x.After.Lookups, x.Lost, x.Failed, x.Mismatches)
	}
	fmt.Fprintln(tw)
	for _, d := range r.Definitions {
		fmt.Fprintln(tw, d)
	}
	return tw.Flush()
}

// runRestart is `kvdock bench --restart`: exit 1 when it could not run or
// a request failed or a chunk differed.
func runRestart(ctx context.Context, o Options, stdout, stderr io.Writer) int {
	res, err := executeRestart(ctx, o)
	o.progress.close()
	if res != nil {
		write := res.WriteTable
		if o.JSON {
			write = res.WriteJSON
		}
		err = errors.Join(write(stdout), err)
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvdock bench: %v\n", err)
		return 1
	}
	for _, r := range res.Restarts {
		if r.Failed > 0 || r.Mismatches > 0 {
			fmt.Fprintf(stderr, "kvdock bench: %d objects, %s: %d failed requests, %d mismatched chunks (first: %s)\n", r.Stored, r.Way, r.Failed, r.Mismatches, r.FirstError)
			return 1
		}
	}
	return 0
}
