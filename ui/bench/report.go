package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"kvdock/settings"
)

// Result is everything one `kvdock bench` run measured. Its JSON form is
// stable for scripts: fields are only ever added.
type Result struct {
	Schema     int         `json:"schema"`
	Command    string      `json:"command"`
	Started    time.Time   `json:"started"`
	Config     RunConfig   `json:"config"`
	References References  `json:"references"`
	SHM        *ModeResult `json:"shm,omitempty"`
	Pickle     *ModeResult `json:"pickle,omitempty"`
	// Skipped are the requested modes the target server cannot serve.
	Skipped []Skip `json:"skipped,omitempty"`
	// Tiers are the --l2-adapter figures, in the order given.
	Tiers   []*TierResult `json:"tiers,omitempty"`
	Targets []Target      `json:"targets"`
	Notes   []string      `json:"notes"`
	// Comparison is --compare's: this run against a saved one.
	Comparison *Comparison `json:"comparison,omitempty"`
}

// Skip is a requested mode that was not run, and why, in user words.
type Skip struct {
	Mode   string `json:"mode"`
	Reason string `json:"reason"`
}

// RunConfig is what the run was asked to do.
type RunConfig struct {
	Model           Model   `json:"model"`
	ChunkTokens     int     `json:"chunk_tokens"`
	ChunkBytes      int64   `json:"chunk_bytes"`
	Chunks          int     `json:"chunks_per_prompt"`
	Workers         int     `json:"workers"`
	Repeat          float64 `json:"repeat"`
	DurationSeconds float64 `json:"duration_seconds"`
	InProcess       bool    `json:"in_process"`
	Endpoint        string  `json:"endpoint,omitempty"`
	ServerPID       int     `json:"server_pid,omitempty"`
	ServerProcess   bool    `json:"server_process,omitempty"`
	PoolBytes       int64   `json:"pool_bytes"`
	CPUs            int     `json:"cpus"`
}

// References are measured in the same run, on the same machine.
type References struct {
	MemcpyGBps float64 `json:"memcpy_gbps"`
	// MemcpySamplesGBps: before the modes and after them; MemcpyGBps is the larger.
	MemcpySamplesGBps []float64 `json:"memcpy_samples_gbps"`
	// MemcpySegmentGBps is the same copy into shared-memory pages like the
	// workers' (the segment's own, or a tmpfs mapping of the same size where
	// the bench must not write into the segment): the SHM targets' reference.
	// 0: not measured (MemcpySegmentMethod says why).
	MemcpySegmentGBps        float64   `json:"memcpy_segment_gbps"`
	MemcpySegmentSamplesGBps []float64 `json:"memcpy_segment_samples_gbps,omitempty"`
	MemcpySegmentMethod      string    `json:"memcpy_segment_method"`
	EchoStreams              int       `json:"echo_streams"`
	EchoNoopBytes            int       `json:"echo_noop_bytes"`
	EchoNoopRTPS             float64   `json:"echo_noop_round_trips_per_s"`
	EchoLookupBytes          int       `json:"echo_lookup_bytes"`
	EchoLookupRTPS           float64   `json:"echo_lookup_round_trips_per_s"`
	// The same echoes while one more stream sends chunk-sized messages that
	// are answered with a few bytes (the raw-ZMQ store stream).
	EchoNoopLoadedRTPS   float64 `json:"echo_noop_under_stream_round_trips_per_s"`
	EchoLookupLoadedRTPS float64 `json:"echo_lookup_under_stream_round_trips_per_s"`
	EchoLargeBytes       int     `json:"echo_large_bytes"`
	EchoLargeGBps        float64 `json:"echo_large_gbps"`
}

// ModeResult is one transfer mode's figures.
type ModeResult struct {
	Mode         string  `json:"mode"`
	Endpoint     string  `json:"endpoint"`
	ShmName      string  `json:"shm_name"`
	PoolBytes    int64   `json:"pool_bytes"`
	Rounds       int     `json:"rounds"`
	Prompts      int     `json:"prompts"`
	StoreBytes   int64   `json:"store_bytes"`
	StoreGBps    float64 `json:"store_gbps"`
	StoreP50us   float64 `json:"store_chunk_p50_us"`
	StoreP99us   float64 `json:"store_chunk_p99_us"`
	RetrieveByte int64   `json:"retrieve_bytes"`
	RetrieveGBps float64 `json:"retrieve_gbps"`
	RetrieveP50  float64 `json:"retrieve_chunk_p50_us"`
	RetrieveP99  float64 `json:"retrieve_chunk_p99_us"`
	// Wall-clock rates of the phases: they include lookups, session ends
	// and the bench's own checksums, which the rates above leave out.
	StoreWallGBps float64 `json:"store_phase_wall_gbps"`
	// MemcpyIntoSegmentGBps (SHM, in process) is the memcpy reference's copy
	// into the segment's pages instead of private memory, the mean of
	// samples taken before the transfers, between their rounds and after
	// them (references.memcpy_segment_gbps when set).
	MemcpyIntoSegmentGBps float64 `json:"memcpy_into_segment_gbps,omitempty"`
	segSamples            []float64
	// MemcpyFromSegmentGBps (SHM, in process) is the retrieve's direction
	// of the same copy: out of the segment's pages into one prefaulted
	// private buffer, sampled with it, the mean kept; reported beside the
	// retrieve target, which is against the copy into the pages.
	MemcpyFromSegmentGBps float64 `json:"memcpy_from_segment_gbps,omitempty"`
	segOutSamples         []float64
	RetrieveWallGBps      float64 `json:"retrieve_phase_wall_gbps"`
	// StoreCopyGBps, RetrieveCopyGBps: the same bytes over the copies'
	// time alone (SHM, one worker), without PREPARE_* and COMMIT_* round
	// trips: what the copies reach against the references.
	StoreCopyGBps    float64 `json:"store_copy_gbps,omitempty"`
	RetrieveCopyGBps float64 `json:"retrieve_copy_gbps,omitempty"`
	CachedStores     int64   `json:"stores_all_cached"`
	MissChunks       int64   `json:"retrieve_miss_chunks"`

	NoopRTPS      float64 `json:"noop_round_trips_per_s"`
	LookupPairsPS float64 `json:"lookup_status_pairs_per_s"`
	LookupRTPS    float64 `json:"lookup_status_round_trips_per_s"`
	LookupChunks  int     `json:"lookup_prompt_chunks"`
	// EchoNoopRTPS, EchoLookupRTPS: the raw echo of the same NOOP and
	// LOOKUP messages measured in turns with the two rates above (4 turns
	// each way): the reference of noop_vs_echo and lookup_status_vs_echo.
	// references.echo_* (measured once, after the modes) stands in when
	// these are missing.
	EchoNoopRTPS   float64 `json:"echo_noop_round_trips_per_s,omitempty"`
	EchoLookupRTPS float64 `json:"echo_lookup_round_trips_per_s,omitempty"`
	// EchoNoopLoadedRTPS, EchoLookupLoadedRTPS: the raw echo beside a raw
	// stream of chunk-sized messages, measured in turns with the figures
	// under the store stream: the reference of *_under_store_vs_echo_under_stream
	// (references.echo_*_under_stream stands in when these are missing).
	EchoNoopLoadedRTPS   float64 `json:"echo_noop_under_stream_round_trips_per_s,omitempty"`
	EchoLookupLoadedRTPS float64 `json:"echo_lookup_under_stream_round_trips_per_s,omitempty"`
	// The same small requests while one more worker stores one-chunk
	// prompts without pause (the store stream; its GB/s beside them).
	NoopLoadedRTPS   float64 `json:"noop_under_store_round_trips_per_s"`
	LookupLoadedRTPS float64 `json:"lookup_status_under_store_round_trips_per_s"`
	StreamGBps       float64 `json:"store_stream_gbps"`
	// LargestMessageBytes is the largest message of the mode (a pickle
	// commit or retrieve reply: every chunk of a prompt), the unit of the
	// pickle RSS target.
	LargestMessageBytes int64   `json:"largest_message_bytes,omitempty"`
	CPUSecondsPerGB     float64 `json:"cpu_seconds_per_gb"`
	CPUMethod           string  `json:"cpu_method"`
	PeakRSSBeyondMiB    float64 `json:"peak_rss_beyond_pool_mib"`
	RSSMethod           string  `json:"rss_method"`
	// RSSNow is /proc/<pid>/status's RssAnon, RssFile and RssShmem in MiB
	// at the end of the store/retrieve phases.
	RSSNow map[string]float64 `json:"rss_at_end_mib,omitempty"`

	Mismatches int64  `json:"checksum_mismatches"`
	Timeouts   int64  `json:"timeouts"`
	Errors     int64  `json:"errors"`
	FirstError string `json:"first_error,omitempty"`

	// Ratios against the same run's references.
	StoreRatio    float64 `json:"store_vs_reference"`
	RetrieveRatio float64 `json:"retrieve_vs_reference"`
	ReferenceName string  `json:"reference"`
	// SHM: the same rates against memcpy into private memory (the
	// reference before segment pages were measured), for comparison.
	StoreVsPrivate    float64 `json:"store_vs_memcpy_private,omitempty"`
	RetrieveVsPrivate float64 `json:"retrieve_vs_memcpy_private,omitempty"`
	// RetrieveVsFromSegment is the retrieve rate against the copy out of
	// the segment's pages (SHM in process only).
	RetrieveVsFromSegment float64 `json:"retrieve_vs_memcpy_from_segment,omitempty"`
	NoopRatio             float64 `json:"noop_vs_echo"`
	LookupRatio           float64 `json:"lookup_status_vs_echo"`
	// Under the store stream: against the echo under its raw-ZMQ
	// counterpart (a stream of chunk-sized messages answered with a few
	// bytes), and against the echo alone.
	NoopLoadedRatio         float64 `json:"noop_under_store_vs_echo_under_stream"`
	LookupLoadedRatio       float64 `json:"lookup_status_under_store_vs_echo_under_stream"`
	NoopLoadedVsEchoAlone   float64 `json:"noop_under_store_vs_echo"`
	LookupLoadedVsEchoAlone float64 `json:"lookup_status_under_store_vs_echo"`
}

// Target is one goal checked against this run's figures.
type Target struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Op     string  `json:"op"` // ">=" or "<="
	Target float64 `json:"target"`
	Met    bool    `json:"met"`
}

func newTarget(name string, value float64, op string, target float64) Target {
	met := value >= target
	if op == "<=" {
		met = value <= target
	}
	if math.IsNaN(value) || math.IsInf(value, 0) {
		met = false
		value = -1
	}
	return Target{Name: name, Value: round4(value), Op: op, Target: target, Met: met}
}

func round4(v float64) float64 { return math.Round(v*1e4) / 1e4 }

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return round4(a / b)
}

// percentileUS is the p-th percentile (nearest rank) in microseconds.
func percentileUS(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	i = max(0, min(i, len(s)-1))
	return round4(float64(s[i]) / float64(time.Microsecond))
}

// finish computes the ratios and the targets list.
func (r *Result) finish() {
	ref := r.References
	var ts []Target
	var mism, tout float64
	for _, m := range []*ModeResult{r.SHM, r.Pickle} {
		if m == nil {
			continue
		}
		m.NoopRatio = ratio(m.NoopRTPS, cmp.Or(m.EchoNoopRTPS, ref.EchoNoopRTPS))
		m.LookupRatio = ratio(m.LookupRTPS, cmp.Or(m.EchoLookupRTPS, ref.EchoLookupRTPS))
		m.NoopLoadedRatio = ratio(m.NoopLoadedRTPS, cmp.Or(m.EchoNoopLoadedRTPS, ref.EchoNoopLoadedRTPS))
		m.LookupLoadedRatio = ratio(m.LookupLoadedRTPS, cmp.Or(m.EchoLookupLoadedRTPS, ref.EchoLookupLoadedRTPS))
		m.NoopLoadedVsEchoAlone = ratio(m.NoopLoadedRTPS, cmp.Or(m.EchoNoopRTPS, ref.EchoNoopRTPS))
		m.LookupLoadedVsEchoAlone = ratio(m.LookupLoadedRTPS, cmp.Or(m.EchoLookupRTPS, ref.EchoLookupRTPS))
		if m.Mode == "shm" {
			// Judged against the copy into shared-memory pages, which the
			// workers write into; private memory only where those could
			// not be measured (the target's name says which).
			m.StoreVsPrivate = ratio(m.StoreGBps, ref.MemcpyGBps)
			m.RetrieveVsPrivate = ratio(m.RetrieveGBps, ref.MemcpyGBps)
			m.RetrieveVsFromSegment = ratio(m.RetrieveGBps, m.MemcpyFromSegmentGBps)
			m.ReferenceName, m.StoreRatio, m.RetrieveRatio = "memcpy", m.StoreVsPrivate, m.RetrieveVsPrivate
			if ref.MemcpySegmentGBps > 0 {
				m.ReferenceName = "memcpy_segment"
				m.StoreRatio = ratio(m.StoreGBps, ref.MemcpySegmentGBps)
				m.RetrieveRatio = ratio(m.RetrieveGBps, ref.MemcpySegmentGBps)
			}
			// Both directions are judged against the copy into the
			// segment's pages (the target's reference); the copy out
			// of them (the retrieve's own direction) is reported beside it
			// (retrieve_vs_memcpy_from_segment).
			ts = append(ts,
				newTarget("shm.store_vs_"+m.ReferenceName, m.StoreRatio, ">=", 0.9),
				newTarget("shm.retrieve_vs_"+m.ReferenceName, m.RetrieveRatio, ">=", 0.9))
		} else {
			m.ReferenceName = "zmq_echo_large"
			m.StoreRatio = ratio(m.StoreGBps, ref.EchoLargeGBps)
			m.RetrieveRatio = ratio(m.RetrieveGBps, ref.EchoLargeGBps)
			ts = append(ts,
				newTarget("pickle.store_vs_echo", m.StoreRatio, ">=", 0.75),
				newTarget("pickle.retrieve_vs_echo", m.RetrieveRatio, ">=", 0.75))
		}
		ts = append(ts,
			newTarget(m.Mode+".noop_vs_echo", m.NoopRatio, ">=", 0.8),
			newTarget(m.Mode+".lookup_status_vs_echo", m.LookupRatio, ">=", 0.8))
		if m.NoopLoadedRTPS > 0 {
			ts = append(ts,
				newTarget(m.Mode+".noop_under_store_vs_echo_under_stream", m.NoopLoadedRatio, ">=", 0.8),
				newTarget(m.Mode+".lookup_status_under_store_vs_echo_under_stream", m.LookupLoadedRatio, ">=", 0.8))
		}
		switch {
		case m.PeakRSSBeyondMiB < 0:
		case m.Mode == "pickle" && m.LargestMessageBytes > 0:
			// Pickle holds whole messages: 2 x the largest + 64 MiB.
			want := round4(float64(2*m.LargestMessageBytes+64<<20) / (1 << 20))
			name := fmt.Sprintf("pickle.peak_rss_beyond_pool_mib (%d workers; 2 x largest message + 64 MiB)", r.Config.Workers)
			if r.Config.InProcess {
				name = fmt.Sprintf("pickle.peak_rss_beyond_pool_mib (%d workers, in process: clients included; 2 x largest message + 64 MiB)", r.Config.Workers)
			}
			ts = append(ts, newTarget(name, m.PeakRSSBeyondMiB, "<=", want))
		default:
			ts = append(ts, newTarget(fmt.Sprintf("%s.peak_rss_beyond_pool_mib (%d workers; target set for 16)", m.Mode, r.Config.Workers), m.PeakRSSBeyondMiB, "<=", 64))
		}
		mism += float64(m.Mismatches)
		tout += float64(m.Timeouts)
	}
	for i, t := range r.Tiers {
		name := fmt.Sprintf("tier%d.%s.", i, t.Type)
		refName := "file"
		want := 0.8
		if t.Type == "resp" {
			refName, want = "valkey_go", 0.7
		}
		t.NoopRatio = ratio(t.NoopRTPS, t.NoopNoTierRTPS)
		t.LookupRatio = ratio(t.LookupRTPS, t.LookupNoTierRTPS)
		ts = append(ts,
			newTarget(name+"write_vs_"+refName, t.WriteRatio, ">=", want),
			newTarget(name+"prefetch_read_vs_"+refName, t.ReadRatio, ">=", want),
			newTarget(name+"noop_saturated_vs_no_tier", t.NoopRatio, ">=", 0.9),
			newTarget(name+"lookup_status_saturated_vs_no_tier", t.LookupRatio, ">=", 0.9))
		mism += float64(t.Mismatches)
	}
	ts = append(ts, newTarget("checksum_mismatches", mism, "<=", 0), newTarget("timeouts", tout, "<=", 0))
	r.Targets = ts
}

// WriteJSON writes the result as one indented JSON object.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}

// WriteTable writes the result for people.
func (r *Result) WriteTable(w io.Writer) error {
	c := r.Config
	var b strings.Builder
	fmt.Fprintf(&b, "kvdock bench: model %s (%d layers, hidden %d, %s, mla=%v), chunk %d tokens = %s, %d chunks/prompt, %d workers, repeat %.2f\n",
		c.Model.Name, c.Model.Layers, c.Model.Hidden, c.Model.Dtype, c.Model.MLA, c.ChunkTokens, settings.BytesText(c.ChunkBytes), c.Chunks, c.Workers, c.Repeat)
	where := "in-process engine, ZMQ over loopback"
	if !c.InProcess {
		where = "server " + c.Endpoint
	}
	pool := settings.BytesText(c.PoolBytes)
	if c.PoolBytes == 0 {
		pool = "unknown"
	}
	fmt.Fprintf(&b, "%s, pool %s, %d CPUs\n", where, pool, c.CPUs)
	for _, sk := range r.Skipped {
		fmt.Fprintf(&b, "%s mode skipped: %s\n", sk.Mode, sk.Reason)
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tSHM\tpickle\treference")
	get := func(f func(m *ModeResult) string) (string, string) {
		s, p := "-", "-"
		if r.SHM != nil {
			s = f(r.SHM)
		}
		if r.Pickle != nil {
			p = f(r.Pickle)
		}
		return s, p
	}
	row := func(name, ref string, f func(m *ModeResult) string) {
		s, p := get(f)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name, s, p, ref)
	}
	ref := r.References
	segRef := "memcpy segment n/a"
	if ref.MemcpySegmentGBps > 0 {
		segRef = fmt.Sprintf("memcpy segment %.2f", ref.MemcpySegmentGBps)
	}
	row("store GB/s", fmt.Sprintf("%s / echo %.2f", segRef, ref.EchoLargeGBps), func(m *ModeResult) string {
		return fmt.Sprintf("%.2f (×%.2f)", m.StoreGBps, m.StoreRatio)
	})
	row("retrieve GB/s", fmt.Sprintf("memcpy private %.2f", ref.MemcpyGBps), func(m *ModeResult) string {
		if m.RetrieveVsFromSegment > 0 {
			return fmt.Sprintf("%.2f (×%.2f of the copy out of the segment %.2f; ×%.2f)", m.RetrieveGBps, m.RetrieveVsFromSegment, m.MemcpyFromSegmentGBps, m.RetrieveRatio)
		}
		return fmt.Sprintf("%.2f (×%.2f)", m.RetrieveGBps, m.RetrieveRatio)
	})
	row("SHM vs memcpy private store/retrieve", "", func(m *ModeResult) string {
		if m.Mode != "shm" {
			return "-"
		}
		return fmt.Sprintf("×%.2f / ×%.2f", m.StoreVsPrivate, m.RetrieveVsPrivate)
	})
	row("store per chunk p50/p99 µs", "", func(m *ModeResult) string { return fmt.Sprintf("%.0f / %.0f", m.StoreP50us, m.StoreP99us) })
	row("retrieve per chunk p50/p99 µs", "", func(m *ModeResult) string { return fmt.Sprintf("%.0f / %.0f", m.RetrieveP50, m.RetrieveP99) })
	inTurns := func(echo float64) string {
		if echo > 0 {
			return fmt.Sprintf(" of echo %.0f in turns", echo)
		}
		return ""
	}
	row("NOOP round trips/s", fmt.Sprintf("echo %.0f", ref.EchoNoopRTPS), func(m *ModeResult) string {
		return fmt.Sprintf("%.0f (×%.2f%s)", m.NoopRTPS, m.NoopRatio, inTurns(m.EchoNoopRTPS))
	})
	row("LOOKUP+STATUS round trips/s", fmt.Sprintf("echo %.0f", ref.EchoLookupRTPS), func(m *ModeResult) string {
		return fmt.Sprintf("%.0f (×%.2f%s)", m.LookupRTPS, m.LookupRatio, inTurns(m.EchoLookupRTPS))
	})
	row("NOOP rt/s under store stream", fmt.Sprintf("echo %.0f", ref.EchoNoopLoadedRTPS), func(m *ModeResult) string {
		return fmt.Sprintf("%.0f (×%.2f; ×%.2f of echo alone)", m.NoopLoadedRTPS, m.NoopLoadedRatio, m.NoopLoadedVsEchoAlone)
	})
	row("LOOKUP+STATUS rt/s under store stream", fmt.Sprintf("echo %.0f", ref.EchoLookupLoadedRTPS), func(m *ModeResult) string {
		return fmt.Sprintf("%.0f (×%.2f; ×%.2f of echo alone)", m.LookupLoadedRTPS, m.LookupLoadedRatio, m.LookupLoadedVsEchoAlone)
	})
	row("store stream GB/s", "", func(m *ModeResult) string { return fmt.Sprintf("%.3f", m.StreamGBps) })
	row("CPU s per GB", "", func(m *ModeResult) string { return fmt.Sprintf("%.3f", m.CPUSecondsPerGB) })
	row("peak RSS beyond pool MiB", "", func(m *ModeResult) string {
		if m.PeakRSSBeyondMiB < 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.1f", m.PeakRSSBeyondMiB)
	})
	row("bytes stored / retrieved", "", func(m *ModeResult) string {
		return settings.BytesText(m.StoreBytes) + " / " + settings.BytesText(m.RetrieveByte)
	})
	row("rounds / prompts", "", func(m *ModeResult) string { return fmt.Sprintf("%d / %d", m.Rounds, m.Prompts) })
	row("missed chunks", "", func(m *ModeResult) string { return fmt.Sprint(m.MissChunks) })
	row("checksum mismatches", "", func(m *ModeResult) string { return fmt.Sprint(m.Mismatches) })
	row("timeouts / errors", "", func(m *ModeResult) string { return fmt.Sprintf("%d / %d", m.Timeouts, m.Errors) })
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Tiers) > 0 {
		b.WriteString("\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "tier\twrite GB/s\tprefetch-read GB/s\tNOOP rt/s saturated\tLOOKUP+STATUS rt/s saturated")
		for i, t := range r.Tiers {
			fmt.Fprintf(tw, "%d %s %s\t%.2f (×%.2f of %.2f)\t%.2f (×%.2f of %.2f)\t%.0f (×%.2f of %.0f)\t%.0f (×%.2f of %.0f)\n", i, t.Type, t.Target,
				t.WriteGBps, t.WriteRatio, t.RefWriteGBps, t.ReadGBps, t.ReadRatio, t.RefReadGBps,
				t.NoopRTPS, t.NoopRatio, t.NoopNoTierRTPS, t.LookupRTPS, t.LookupRatio, t.LookupNoTierRTPS)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for i, t := range r.Tiers {
			fmt.Fprintf(&b, "tier %d reference: %s; %s written (%d writes dropped), %s read back (%d chunks missed; %.2f GB/s with the retrieves); %d writes dropped while saturated; %d mismatches, %d errors\n",
				i, t.Reference, settings.BytesText(t.WriteBytes), t.DroppedWrites, settings.BytesText(t.ReadBytes), t.ReadMisses, t.ReadRetrieveGBps, t.SaturatedDropped, t.Mismatches, t.Errors)
			if t.FirstError != "" {
				fmt.Fprintf(&b, "tier %d first error: %s\n", i, t.FirstError)
			}
		}
	}
	b.WriteString("\ntargets\n")
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, t := range r.Targets {
		met := "MISSED"
		if t.Met {
			met = "met"
		}
		fmt.Fprintf(tw, "%s\t%g\t%s %g\t%s\n", t.Name, t.Value, t.Op, t.Target, met)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, m := range []*ModeResult{r.SHM, r.Pickle} {
		if m != nil && m.FirstError != "" {
			fmt.Fprintf(&b, "\n%s first error: %s\n", m.Mode, m.FirstError)
		}
	}
	fmt.Fprintf(&b, "\nSHM reference: %s\n", ref.MemcpySegmentMethod)
	if len(r.Notes) > 0 {
		b.WriteString("\nnotes\n")
		for _, n := range r.Notes {
			b.WriteString("- " + n + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
