package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"kvdock/assets"
	"kvdock/core/protocol"
)

// tinyArgs is a tiny model, 2 workers, both modes, kept short for -race.
var tinyArgs = []string{"--layers", "2", "--hidden", "64", "--dtype", "float16", "--workers", "2",
	"--mode", "both", "--rounds", "2", "--prompts", "3", "--small-duration", "200ms",
	"--ref-duration", "200ms", "--pool-gb", "0.0625", "--timeout", "20s", "--json"}

func TestShortRunJSON(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Run(tinyArgs, &out, &errb); code != 0 {
		t.Fatalf("exit %d, stderr:\n%s\nstdout:\n%s", code, errb.String(), out.String())
	}
	if errb.Len() != 0 {
		t.Errorf("--json wrote to stderr (progress must be silent): %q", errb.String())
	}
	var res Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("JSON does not parse: %v\n%s", err, out.String())
	}
	// The generic form too: scripts read it without our types.
	var generic map[string]any
	if err := json.Unmarshal(out.Bytes(), &generic); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"config", "references", "shm", "pickle", "targets", "notes"} {
		if _, ok := generic[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	if res.SHM == nil || res.Pickle == nil {
		t.Fatalf("modes missing: shm %v pickle %v", res.SHM != nil, res.Pickle != nil)
	}
	chunk := res.Config.ChunkBytes
	if want := int64(2 * 2 * 256 * 64 * 2); chunk != want {
		t.Fatalf("chunk bytes %d, want %d", chunk, want)
	}
	for _, m := range []*ModeResult{res.SHM, res.Pickle} {
		if m.Mismatches != 0 || m.Timeouts != 0 || m.Errors != 0 {
			t.Errorf("%s: mismatches %d timeouts %d errors %d (%s)", m.Mode, m.Mismatches, m.Timeouts, m.Errors, m.FirstError)
		}
		if m.Rounds != 2 || m.Prompts != 2*2*3 {
			t.Errorf("%s: rounds %d prompts %d", m.Mode, m.Rounds, m.Prompts)
		}
		if m.RetrieveByte == 0 || m.RetrieveByte%chunk != 0 || m.StoreBytes == 0 || m.StoreBytes%chunk != 0 {
			t.Errorf("%s: stored %d retrieved %d bytes, not whole chunks of %d", m.Mode, m.StoreBytes, m.RetrieveByte, chunk)
		}
		// Every chunk of every prompt comes back: the pool holds the round.
		if want := int64(m.Prompts * 4); m.RetrieveByte/chunk != want || m.MissChunks != 0 {
			t.Errorf("%s: retrieved %d chunks, %d missed; want %d", m.Mode, m.RetrieveByte/chunk, m.MissChunks, want)
		}
		for name, v := range map[string]float64{"store": m.StoreRatio, "retrieve": m.RetrieveRatio, "noop": m.NoopRatio, "lookup": m.LookupRatio,
			"noop under store": m.NoopLoadedRatio, "lookup under store": m.LookupLoadedRatio, "store stream": m.StreamGBps} {
			if !(v > 0) {
				t.Errorf("%s: %s ratio %v", m.Mode, name, v)
			}
		}
	}
	// Pickle stores send every chunk; SHM skips chunks already cached.
	if res.Pickle.StoreBytes != int64(res.Pickle.Prompts*4)*chunk {
		t.Errorf("pickle stored %d bytes for %d prompts", res.Pickle.StoreBytes, res.Pickle.Prompts)
	}
	if res.SHM.StoreBytes > res.Pickle.StoreBytes {
		t.Errorf("SHM stored more (%d) than pickle (%d)", res.SHM.StoreBytes, res.Pickle.StoreBytes)
	}
	names := map[string]Target{}
	for _, tg := range res.Targets {
		names[tg.Name] = tg
	}
	for _, n := range []string{"shm.store_vs_memcpy_segment", "shm.retrieve_vs_memcpy_segment", "pickle.store_vs_echo",
		"pickle.retrieve_vs_echo", "shm.noop_vs_echo", "pickle.lookup_status_vs_echo", "checksum_mismatches", "timeouts",
		"shm.noop_under_store_vs_echo_under_stream", "pickle.lookup_status_under_store_vs_echo_under_stream"} {
		if _, ok := names[n]; !ok {
			t.Errorf("target %q missing from %v", n, res.Targets)
		}
	}
	if !names["checksum_mismatches"].Met || !names["timeouts"].Met {
		t.Errorf("correctness targets not met: %+v %+v", names["checksum_mismatches"], names["timeouts"])
	}
	r := res.References
	if r.MemcpyGBps <= 0 || r.EchoNoopRTPS <= 0 || r.EchoLookupRTPS <= 0 || r.EchoLargeGBps <= 0 || r.EchoLargeBytes < int(chunk) {
		t.Errorf("references: %+v", r)
	}
	// The SHM reference is memcpy into the segment's own pages, every
	// sample kept, and the SHM ratios are against it; the private-memory
	// ratios are reported beside them.
	// Sampled before the transfers, after each round and at the end: the
	// mean is the reference.
	if r.MemcpySegmentGBps <= 0 || len(r.MemcpySegmentSamplesGBps) != 2+res.SHM.Rounds || r.MemcpySegmentGBps != round4(mean(r.MemcpySegmentSamplesGBps)) ||
		!strings.Contains(r.MemcpySegmentMethod, res.SHM.ShmName) {
		t.Errorf("segment reference: %v GB/s, samples %v, method %q", r.MemcpySegmentGBps, r.MemcpySegmentSamplesGBps, r.MemcpySegmentMethod)
	}
	if _, ok := generic["references"].(map[string]any)["memcpy_segment_gbps"]; !ok {
		t.Errorf("JSON references lack memcpy_segment_gbps")
	}
	if s := res.SHM; s.ReferenceName != "memcpy_segment" || s.StoreRatio != ratio(s.StoreGBps, r.MemcpySegmentGBps) ||
		s.StoreVsPrivate != ratio(s.StoreGBps, r.MemcpyGBps) || s.RetrieveVsPrivate <= 0 {
		t.Errorf("SHM ratios: %+v against %+v", s, r)
	}
	// The retrieve's direction (out of the segment's pages) is measured in
	// the same run and reported beside the target.
	if s := res.SHM; s.MemcpyFromSegmentGBps <= 0 || s.RetrieveVsFromSegment != ratio(s.RetrieveGBps, s.MemcpyFromSegmentGBps) {
		t.Errorf("copy out of the segment: %v GB/s, retrieve ratio %v", s.MemcpyFromSegmentGBps, s.RetrieveVsFromSegment)
	}
	// The copies' own rate is given for one worker only (with more, the
	// slowest worker's copy time is not all the bytes'); pickle has none.
	if s := res.SHM; res.Config.Workers > 1 && (s.StoreCopyGBps != 0 || s.RetrieveCopyGBps != 0) {
		t.Errorf("SHM copy rates with %d workers: store %v, retrieve %v, want none", res.Config.Workers, s.StoreCopyGBps, s.RetrieveCopyGBps)
	}
	if p := res.Pickle; p.StoreCopyGBps != 0 || p.RetrieveCopyGBps != 0 {
		t.Errorf("pickle copy rates %v / %v, want none", p.StoreCopyGBps, p.RetrieveCopyGBps)
	}
	if _, ok := generic["shm"].(map[string]any)["retrieve_vs_memcpy_from_segment"]; !ok {
		t.Errorf("JSON shm lacks retrieve_vs_memcpy_from_segment")
	}
	// The small requests are judged against the echo measured in turns
	// with them, in each mode.
	for _, m := range []*ModeResult{res.SHM, res.Pickle} {
		if m.EchoNoopRTPS <= 0 || m.EchoLookupRTPS <= 0 || m.NoopRatio != ratio(m.NoopRTPS, m.EchoNoopRTPS) || m.LookupRatio != ratio(m.LookupRTPS, m.EchoLookupRTPS) {
			t.Errorf("%s: NOOP %v (×%v) against echo in turns %v, LOOKUP+STATUS %v (×%v) against %v", m.Mode, m.NoopRTPS, m.NoopRatio, m.EchoNoopRTPS, m.LookupRTPS, m.LookupRatio, m.EchoLookupRTPS)
		}
		if m.EchoNoopLoadedRTPS <= 0 || m.EchoLookupLoadedRTPS <= 0 || m.NoopLoadedRatio != ratio(m.NoopLoadedRTPS, m.EchoNoopLoadedRTPS) ||
			m.LookupLoadedRatio != ratio(m.LookupLoadedRTPS, m.EchoLookupLoadedRTPS) {
			t.Errorf("%s under a store stream: NOOP %v (×%v) against echo under a raw stream in turns %v, LOOKUP+STATUS %v (×%v) against %v", m.Mode,
				m.NoopLoadedRTPS, m.NoopLoadedRatio, m.EchoNoopLoadedRTPS, m.LookupLoadedRTPS, m.LookupLoadedRatio, m.EchoLookupLoadedRTPS)
		}
	}
}

// copyOutRate reads every part of its source in turn: each part's bytes
// end up in the destination, the last copied last.
func TestCopyOutRateCopiesEveryPart(t *testing.T) {
	src := make([]byte, 3*4096)
	for i := range src {
		src[i] = byte(i / 4096)
	}
	dst := make([]byte, 4096)
	if r := copyOutRate(dst, src, 0); !(r > 0) {
		t.Fatalf("rate %v", r)
	}
	// With dur 0 one copy runs after the warm-up: part 0.
	if dst[0] != 0 || dst[4095] != 0 {
		t.Errorf("dst holds part %d, want 0", dst[0])
	}
	if r := copyOutRate(make([]byte, len(src)+1), src, 0); r != 0 {
		t.Errorf("a destination larger than the source: rate %v, want 0", r)
	}
}

// A pickle-only run has no segment of its own: the reference is a tmpfs
// mapping of the pool's size.
func TestPickleOnlyRunHasATmpfsSegmentReference(t *testing.T) {
	args := slices.Clone(tinyArgs)
	args[slices.Index(args, "both")] = "pickle"
	var out, errb bytes.Buffer
	if code := Run(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	var res Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	r := res.References
	if r.MemcpySegmentGBps <= 0 || len(r.MemcpySegmentSamplesGBps) != 2 || !strings.Contains(r.MemcpySegmentMethod, "/dev/shm") {
		t.Errorf("segment reference: %v GB/s, samples %v, method %q", r.MemcpySegmentGBps, r.MemcpySegmentSamplesGBps, r.MemcpySegmentMethod)
	}
}

func TestFlagErrorsExit2(t *testing.T) {
	cases := map[string][]string{
		"mode":        {"--mode", "rdma"},
		"model":       {"--model", "gpt-9"},
		"dtype":       {"--dtype", "float128"},
		"workers":     {"--workers", "0"},
		"repeat":      {"--repeat", "1.5"},
		"chunks":      {"--chunks", "0"},
		"duration":    {"--duration", "-1s"},
		"host alone":  {"--host", "127.0.0.1"},
		"pid alone":   {"--server-pid", "1"},
		"protocol":    {"--protocol", "nope"},
		"unknown":     {"--frobnicate"},
		"positional":  {"extra"},
		"layers zero": {"--layers", "-3"},
		"http alone":  {"--http-port", "9000"},
		"http port":   {"--host", "127.0.0.1", "--port", "5555", "--http-port", "70000"},
		"child both":  {"--server-process"},
		"child host":  {"--server-process", "--mode", "pickle", "--host", "127.0.0.1", "--port", "5555"},
	}
	for name, args := range cases {
		var out, errb bytes.Buffer
		if code := Run(args, &out, &errb); code != 2 {
			t.Errorf("%s: exit %d, want 2 (stderr %q)", name, code, errb.String())
		}
		if errb.Len() == 0 {
			t.Errorf("%s: nothing on stderr", name)
		}
		if out.Len() != 0 {
			t.Errorf("%s: stdout %q", name, out.String())
		}
	}
}

// TestHTTPAddressFromTheSettingsLayers: the target's HTTP API address is
// read as kvdock serve reads it (file < KVDOCK_* < flags), the host
// defaulting to the target's; a bad value in a layer is a usage error
// naming it, a bad key bench does not read is not.
func TestHTTPAddressFromTheSettingsLayers(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kvdock.yaml")
	if err := os.WriteFile(file, []byte("http:\n  port: 9200\nl1:\n  size_gb: -1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	target := []string{"--host", "10.1.2.3", "--port", "5555"}
	for _, tc := range []struct {
		env        []string
		args       []string
		host       string
		port       int
		wantStderr string
	}{
		{nil, nil, "10.1.2.3", 8080, ""},
		{[]string{"KVDOCK_HTTP_PORT=9100"}, nil, "10.1.2.3", 9100, ""},
		{[]string{"KVDOCK_HTTP_PORT=9100", "KVDOCK_HTTP_HOST=10.9.9.9"}, []string{"--http-port", "9101"}, "10.9.9.9", 9101, ""},
		{[]string{"KVDOCK_CONFIG=" + file}, nil, "10.1.2.3", 9200, ""},
		{nil, []string{"--config", file, "--http-host", "h"}, "h", 9200, ""},
		{[]string{"KVDOCK_HTTP_PORT=abc"}, nil, "", 0, "KVDOCK_HTTP_PORT"},
	} {
		var errb bytes.Buffer
		o, code := parseFlags(append(append([]string(nil), target...), tc.args...), &errb, tc.env)
		if tc.wantStderr != "" {
			if code != 2 || !strings.Contains(errb.String(), tc.wantStderr) {
				t.Errorf("%q %q: exit %d, stderr %q", tc.env, tc.args, code, errb.String())
			}
			continue
		}
		if code >= 0 || o.HTTPHost != tc.host || o.HTTPPort != tc.port {
			t.Errorf("%q %q: exit %d, HTTP %s:%d, want %s:%d (stderr %q)", tc.env, tc.args, code, o.HTTPHost, o.HTTPPort, tc.host, tc.port, errb.String())
		}
	}
}

func TestTableNamesEveryFigure(t *testing.T) {
	res := &Result{Config: RunConfig{Model: Model{Name: "x"}, Workers: 16}, References: References{MemcpyGBps: 10, EchoLargeGBps: 4, EchoNoopRTPS: 1000, EchoLookupRTPS: 800},
		SHM:    &ModeResult{Mode: "shm", StoreGBps: 9.5, RetrieveGBps: 8, NoopRTPS: 900, LookupRTPS: 500, PeakRSSBeyondMiB: 70},
		Pickle: &ModeResult{Mode: "pickle", StoreGBps: 3, RetrieveGBps: 2, NoopRTPS: 900, LookupRTPS: 700, PeakRSSBeyondMiB: -1, Timeouts: 1}}
	got := map[string]Target{}
	finish := func() {
		res.finish()
		got = map[string]Target{}
		for _, tg := range res.Targets {
			got[tg.Name] = tg
		}
	}
	finish()
	check := func(name string, met bool) {
		t.Helper()
		tg, ok := got[name]
		if !ok || tg.Met != met {
			t.Errorf("target %s: %+v (present %v), want met=%v", name, tg, ok, met)
		}
	}
	check("shm.store_vs_memcpy", true)      // 0.95 (no segment reference: private memcpy)
	check("shm.retrieve_vs_memcpy", false)  // 0.8
	check("pickle.store_vs_echo", true)     // 0.75
	check("pickle.retrieve_vs_echo", false) // 0.5
	check("shm.lookup_status_vs_echo", false)
	check("pickle.lookup_status_vs_echo", true)
	// An echo measured in turns with a mode's requests is that mode's
	// reference: 900 against 1200 misses where 900 against 1000 met.
	res.Pickle.EchoNoopRTPS = 1200
	finish()
	check("pickle.noop_vs_echo", false)
	if res.Pickle.NoopRatio != 0.75 {
		t.Errorf("pickle NOOP against the echo in turns: ratio %v, want 0.75", res.Pickle.NoopRatio)
	}
	res.Pickle.EchoNoopRTPS = 0
	finish()
	check("pickle.noop_vs_echo", true)
	check("shm.peak_rss_beyond_pool_mib (16 workers; target set for 16)", false)
	check("timeouts", false)
	check("checksum_mismatches", true)
	// With the segment reference measured, SHM is judged against it.
	res.References.MemcpySegmentGBps = 9
	finish()
	check("shm.store_vs_memcpy_segment", true)     // 9.5/9
	check("shm.retrieve_vs_memcpy_segment", false) // 8/9 = 0.889
	// The copy out of the pages (the retrieve's direction) is reported
	// beside the target, which stays against the copy into them.
	res.SHM.MemcpyFromSegmentGBps = 8.5
	finish()
	check("shm.retrieve_vs_memcpy_segment", false) // 8/9
	if _, ok := got["shm.retrieve_vs_memcpy_from_segment"]; ok || res.SHM.RetrieveVsFromSegment != round4(8/8.5) {
		t.Errorf("the copy out judged as a target, or its ratio lost: %v", res.SHM.RetrieveVsFromSegment)
	}
	if res.SHM.StoreVsPrivate != 0.95 || res.SHM.RetrieveVsPrivate != 0.8 {
		t.Errorf("private ratios %v %v", res.SHM.StoreVsPrivate, res.SHM.RetrieveVsPrivate)
	}
	var b bytes.Buffer
	if err := res.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"store GB/s", "retrieve GB/s", "p50/p99", "NOOP round trips/s", "LOOKUP+STATUS", "CPU s per GB", "peak RSS beyond pool", "checksum mismatches", "MISSED", "n/a", "memcpy segment 9.00", "memcpy private 10.00", "×0.95 / ×0.80"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// BenchmarkEndToEndSHM and BenchmarkEndToEndPickle run the same driver on a
// small model: one op is one 4-chunk prompt stored, looked up and retrieved.
func BenchmarkEndToEndSHM(b *testing.B)    { benchEndToEnd(b, "shm") }
func BenchmarkEndToEndPickle(b *testing.B) { benchEndToEnd(b, "pickle") }

func benchEndToEnd(b *testing.B, mode string) {
	o := Options{Model: Model{Name: "bench-small", Layers: 4, Hidden: 256, Dtype: "bfloat16"}, Mode: mode,
		Chunks: 4, Workers: 1, Repeat: 0, Protocol: "nongpu-v1", Timeout: 20 * time.Second, PoolBytes: 64 << 20}
	raw, err := assets.Protocol(o.Protocol)
	if err != nil {
		b.Fatal(err)
	}
	prof, err := protocol.Parse(raw)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	eng, ep, err := startEngine(ctx, o, mode, o.PoolBytes, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = eng.Stop(ctx) }()
	d, err := newDriver(ctx, driverConfig{Endpoint: ep, Profile: prof, Mode: mode, Model: o.Model, Chunks: o.Chunks,
		Workers: 1, Timeout: o.Timeout, Rounds: 1, PromptsPerRound: 1, ClearBetweenRounds: true, InstanceBase: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer d.close(ctx)
	b.SetBytes(2 * int64(o.Chunks) * d.lay.Bytes) // stored and retrieved
	var total counters
	for b.Loop() {
		tr := d.transfer(ctx)
		total.merge(&tr.counters)
	}
	b.StopTimer()
	if total.mismatches != 0 || total.timeouts != 0 || total.errors != 0 {
		b.Fatalf("mismatches %d timeouts %d errors %d: %s", total.mismatches, total.timeouts, total.errors, total.firstErr)
	}
}
