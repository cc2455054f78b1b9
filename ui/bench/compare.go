package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// maxSavedBytes caps a saved --json run read by --compare / --from: a real
// one is a few KiB (tens with many tiers), so anything larger is not one.
const maxSavedBytes = 4 << 20

// exitRegression is the exit status of --fail-drop when a ratio dropped
// more than allowed (1 and 2 are taken: failed run, bad flags).
const exitRegression = 3

// Comparison is this run's figures against a saved --json run.
type Comparison struct {
	Baseline        string    `json:"baseline"`
	BaselineStarted time.Time `json:"baseline_started"`
	BaselineCommand string    `json:"baseline_command"`
	// ConfigDiffers names what the two runs were asked to do differently
	// ("workers 1 → 16"): their figures are then not like for like.
	ConfigDiffers []string       `json:"config_differs,omitempty"`
	Figures       []FigureChange `json:"figures"`
	// FailDropPercent is --fail-drop (0: no check); Regressions are the
	// ratios that dropped more than that, or are missing from this run.
	FailDropPercent float64  `json:"fail_drop_percent,omitempty"`
	Regressions     []string `json:"regressions,omitempty"`
}

// FigureChange is one figure in both runs. A side that lacks the figure
// has no value (null) and Missing says which.
type FigureChange struct {
	Name     string   `json:"name"`
	Kind     string   `json:"kind"` // "ratio" or "throughput" (higher is better for both)
	Baseline *float64 `json:"baseline"`
	Current  *float64 `json:"current"`
	// ChangePercent is (current − baseline) / baseline × 100; null when a
	// side is missing or the baseline is 0.
	ChangePercent *float64 `json:"change_percent"`
	Missing       string   `json:"missing,omitempty"` // "baseline", "this run", or ""
}

// figure is one comparable value of a run.
type figure struct {
	name, kind string
	value      float64
}

// figures lists a run's ratios and key throughputs by stable names. A
// figure that was not measured (a mode not run, a reference that could not
// be taken) is left out, so it shows as missing on that side.
func (r *Result) figures() []figure {
	var fs []figure
	add := func(name, kind string, v float64, ok bool) {
		if ok && !math.IsNaN(v) && !math.IsInf(v, 0) {
			fs = append(fs, figure{name, kind, v})
		}
	}
	ref := r.References
	add("references.memcpy_private_gbps", "throughput", ref.MemcpyGBps, ref.MemcpyGBps > 0)
	add("references.memcpy_segment_gbps", "throughput", ref.MemcpySegmentGBps, ref.MemcpySegmentGBps > 0)
	add("references.echo_noop_round_trips_per_s", "throughput", ref.EchoNoopRTPS, ref.EchoNoopRTPS > 0)
	add("references.echo_lookup_round_trips_per_s", "throughput", ref.EchoLookupRTPS, ref.EchoLookupRTPS > 0)
	add("references.echo_large_gbps", "throughput", ref.EchoLargeGBps, ref.EchoLargeGBps > 0)
	for _, m := range []*ModeResult{r.SHM, r.Pickle} {
		if m == nil {
			continue
		}
		refName := m.ReferenceName
		if refName == "" {
			refName = "reference"
		}
		p := m.Mode + "."
		// A mode that ran has its ratios even when they are 0 (nothing
		// moved): that is a drop, not a missing figure.
		add(p+"store_vs_"+refName, "ratio", m.StoreRatio, true)
		add(p+"retrieve_vs_"+refName, "ratio", m.RetrieveRatio, true)
		if m.Mode == "shm" && refName != "memcpy" {
			add(p+"store_vs_memcpy_private", "ratio", m.StoreVsPrivate, m.StoreVsPrivate > 0)
			add(p+"retrieve_vs_memcpy_private", "ratio", m.RetrieveVsPrivate, m.RetrieveVsPrivate > 0)
			add(p+"retrieve_vs_memcpy_from_segment", "ratio", m.RetrieveVsFromSegment, m.RetrieveVsFromSegment > 0)
		}
		add(p+"noop_vs_echo", "ratio", m.NoopRatio, true)
		add(p+"lookup_status_vs_echo", "ratio", m.LookupRatio, true)
		add(p+"store_gbps", "throughput", m.StoreGBps, true)
		add(p+"retrieve_gbps", "throughput", m.RetrieveGBps, true)
		add(p+"noop_round_trips_per_s", "throughput", m.NoopRTPS, true)
		add(p+"lookup_status_round_trips_per_s", "throughput", m.LookupRTPS, true)
		loaded := m.NoopLoadedRTPS > 0
		add(p+"noop_under_store_vs_echo_under_stream", "ratio", m.NoopLoadedRatio, loaded)
		add(p+"lookup_status_under_store_vs_echo_under_stream", "ratio", m.LookupLoadedRatio, loaded)
		add(p+"noop_under_store_round_trips_per_s", "throughput", m.NoopLoadedRTPS, loaded)
		add(p+"lookup_status_under_store_round_trips_per_s", "throughput", m.LookupLoadedRTPS, loaded)
	}
	for i, t := range r.Tiers {
		if t == nil {
			continue
		}
		p := fmt.Sprintf("tier%d.%s.", i, t.Type)
		add(p+"write_vs_reference", "ratio", t.WriteRatio, true)
		add(p+"prefetch_read_vs_reference", "ratio", t.ReadRatio, true)
		add(p+"noop_saturated_vs_no_tier", "ratio", t.NoopRatio, true)
		add(p+"lookup_status_saturated_vs_no_tier", "ratio", t.LookupRatio, true)
		add(p+"write_gbps", "throughput", t.WriteGBps, true)
		add(p+"prefetch_read_gbps", "throughput", t.ReadGBps, true)
	}
	return fs
}

// compareRuns compares cur with base (read from path). failDrop > 0 marks
// every ratio that dropped by more than failDrop percent, or that base has
// and cur lacks, as a regression.
func compareRuns(cur, base *Result, path string, failDrop float64) *Comparison {
	c := &Comparison{Baseline: path, BaselineStarted: base.Started, BaselineCommand: base.Command, FailDropPercent: failDrop}
	c.ConfigDiffers = configDiffers(base, cur)
	curFigs := map[string]figure{}
	for _, f := range cur.figures() {
		curFigs[f.name] = f
	}
	seen := map[string]bool{}
	for _, b := range base.figures() {
		seen[b.name] = true
		fc := FigureChange{Name: b.name, Kind: b.kind, Baseline: ptr(b.value)}
		f, ok := curFigs[b.name]
		switch {
		case !ok:
			fc.Missing = "this run"
		default:
			fc.Current = ptr(f.value)
			if b.value != 0 {
				fc.ChangePercent = ptr(round4((f.value - b.value) / b.value * 100))
			}
		}
		if failDrop > 0 && b.kind == "ratio" {
			dropped := fc.ChangePercent != nil && *fc.ChangePercent < -failDrop
			if dropped || fc.Missing != "" {
				c.Regressions = append(c.Regressions, b.name)
			}
		}
		c.Figures = append(c.Figures, fc)
	}
	for _, f := range cur.figures() {
		if !seen[f.name] {
			c.Figures = append(c.Figures, FigureChange{Name: f.name, Kind: f.kind, Current: ptr(f.value), Missing: "baseline"})
		}
	}
	return c
}

func ptr(v float64) *float64 { return &v }

// configDiffers lists what the runs were asked to do differently.
func configDiffers(base, cur *Result) []string {
	var d []string
	diff := func(name string, a, b any) {
		if fmt.Sprint(a) != fmt.Sprint(b) {
			d = append(d, fmt.Sprintf("%s %v → %v", name, a, b))
		}
	}
	bc, cc := base.Config, cur.Config
	diff("model", bc.Model, cc.Model)
	diff("chunk bytes", bc.ChunkBytes, cc.ChunkBytes)
	diff("chunks per prompt", bc.Chunks, cc.Chunks)
	diff("workers", bc.Workers, cc.Workers)
	diff("in process", bc.InProcess, cc.InProcess)
	diff("CPUs", bc.CPUs, cc.CPUs)
	modes := func(r *Result) string {
		var m []string
		if r.SHM != nil {
			m = append(m, "shm")
		}
		if r.Pickle != nil {
			m = append(m, "pickle")
		}
		return strings.Join(m, "+")
	}
	diff("modes", modes(base), modes(cur))
	diff("tiers", len(base.Tiers), len(cur.Tiers))
	return d
}

// loadSaved reads a saved `kvdock bench --json` result: one JSON object of
// schema 1, at most maxSavedBytes.
func loadSaved(path string) (*Result, error) {
	// Only a regular file: a FIFO or device would block or never end.
	if st, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("read saved run: %w", err)
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("saved run %s: not a regular file", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read saved run: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSavedBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read saved run %s: %w", path, err)
	}
	if len(data) > maxSavedBytes {
		return nil, fmt.Errorf("saved run %s: larger than %d MiB, not a kvdock bench --json result", path, maxSavedBytes>>20)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var r Result
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("saved run %s: not a kvdock bench --json result: %w", path, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("saved run %s: not a kvdock bench --json result: data after the JSON object", path)
	}
	if r.Schema != 1 {
		return nil, fmt.Errorf("saved run %s: schema %d, want 1 (not a kvdock bench --json result, or from another version)", path, r.Schema)
	}
	if r.SHM == nil && r.Pickle == nil && len(r.Tiers) == 0 {
		return nil, fmt.Errorf("saved run %s: no SHM, pickle or tier figures to compare", path)
	}
	return &r, nil
}

// signedPercent formats a change with an explicit + or − sign.
func signedPercent(p float64) string {
	if p < 0 {
		return fmt.Sprintf("−%.1f %%", -p)
	}
	return fmt.Sprintf("+%.1f %%", p)
}

// WriteTable writes the comparison for people.
func (c *Comparison) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "compared with %s (run %s: %s)\n", c.Baseline, c.BaselineStarted.Format(time.RFC3339), c.BaselineCommand)
	for _, d := range c.ConfigDiffers {
		fmt.Fprintf(&b, "config differs: %s (figures are not like for like)\n", d)
	}
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tbaseline\tthis run\tchange")
	val := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return strconv.FormatFloat(*v, 'f', -1, 64)
	}
	for _, f := range c.Figures {
		change := "n/a (baseline 0)"
		switch {
		case f.Missing != "":
			change = "missing in " + f.Missing
		case f.ChangePercent != nil:
			change = signedPercent(*f.ChangePercent)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Name, val(f.Baseline), val(f.Current), change)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if c.FailDropPercent > 0 {
		if len(c.Regressions) == 0 {
			fmt.Fprintf(&b, "check: no ratio dropped more than %g %%\n", c.FailDropPercent)
		} else {
			fmt.Fprintf(&b, "check FAILED: %d ratios dropped more than %g %% or are missing: %s\n", len(c.Regressions), c.FailDropPercent, strings.Join(c.Regressions, ", "))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
