package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// savedRun writes a hand-made --json result: SHM (and pickle when given)
// with the references the ratios are taken against.
func savedRun(t *testing.T, dir, name string, shmStore, noop float64, pickle bool) string {
	t.Helper()
	r := &Result{Schema: 1, Command: "kvdock bench " + name, Config: RunConfig{Model: Model{Name: "m"}, Workers: 1, InProcess: true, CPUs: 2},
		References: References{MemcpyGBps: 10, MemcpySegmentGBps: 8, EchoNoopRTPS: 1000, EchoLookupRTPS: 1000, EchoLargeGBps: 1},
		SHM:        &ModeResult{Mode: "shm", StoreGBps: shmStore, RetrieveGBps: 6, NoopRTPS: noop, LookupRTPS: 900}}
	if pickle {
		r.Pickle = &ModeResult{Mode: "pickle", StoreGBps: 0.5, RetrieveGBps: 0.5, NoopRTPS: 800, LookupRTPS: 800}
	}
	r.finish()
	var b bytes.Buffer
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name+".json")
	if err := os.WriteFile(p, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func compareJSON(t *testing.T, args ...string) (*Comparison, int, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(append(args, "--json"), &out, &errb, nil, false)
	if code == 2 || code == 1 {
		return nil, code, errb.String()
	}
	var c Comparison
	if err := json.Unmarshal(out.Bytes(), &c); err != nil {
		t.Fatalf("comparison JSON: %v\n%s", err, out.String())
	}
	return &c, code, errb.String()
}

func TestCompareComputesChangesAndMissingFigures(t *testing.T) {
	dir := t.TempDir()
	base := savedRun(t, dir, "base", 6, 900, true) // SHM store 6/8 = ×0.75
	cur := savedRun(t, dir, "cur", 7, 810, false)  // ×0.875 (+16.7 %), NOOP −10 %, no pickle
	c, code, stderr := compareJSON(t, "--from", cur, "--compare", base)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	got := map[string]FigureChange{}
	for _, f := range c.Figures {
		got[f.Name] = f
	}
	want := map[string]float64{
		"shm.store_vs_memcpy_segment":         16.6667, // 0.75 → 0.875
		"shm.store_gbps":                      16.6667,
		"shm.noop_vs_echo":                    -10,
		"shm.noop_round_trips_per_s":          -10,
		"shm.retrieve_vs_memcpy_segment":      0,
		"references.memcpy_segment_gbps":      0,
		"shm.store_vs_memcpy_private":         16.6667, // 0.6 → 0.7
		"references.memcpy_private_gbps":      0,
		"shm.lookup_status_vs_echo":           0,
		"references.echo_large_gbps":          0,
		"shm.retrieve_vs_memcpy_private":      0,
		"shm.lookup_status_round_trips_per_s": 0,
	}
	for name, pct := range want {
		f, ok := got[name]
		if !ok || f.ChangePercent == nil || *f.ChangePercent < pct-0.01 || *f.ChangePercent > pct+0.01 || f.Missing != "" {
			t.Errorf("%s: %+v, want change %.4f %%", name, f, pct)
		}
	}
	for _, name := range []string{"pickle.store_vs_zmq_echo_large", "pickle.noop_vs_echo", "pickle.store_gbps"} {
		if f := got[name]; f.Missing != "this run" || f.Current != nil || f.Baseline == nil || f.ChangePercent != nil {
			t.Errorf("%s: %+v, want missing in this run", name, f)
		}
	}
	if len(c.Regressions) != 0 {
		t.Errorf("regressions without --fail-drop: %v", c.Regressions)
	}
	if len(c.ConfigDiffers) != 1 || !strings.Contains(c.ConfigDiffers[0], "modes shm+pickle → shm") {
		t.Errorf("config differs: %q", c.ConfigDiffers)
	}
	// The other way round the pickle figures are missing in the baseline.
	c, _, _ = compareJSON(t, "--from", base, "--compare", cur)
	for _, f := range c.Figures {
		if strings.HasPrefix(f.Name, "pickle.") && (f.Missing != "baseline" || f.Baseline != nil || f.Current == nil) {
			t.Errorf("%s: %+v, want missing in baseline", f.Name, f)
		}
	}
	// The table says the same, with signed percentages.
	var out, errb bytes.Buffer
	if code := run([]string{"--from", cur, "--compare", base}, &out, &errb, nil, false); code != 0 {
		t.Fatalf("table: exit %d %q", code, errb.String())
	}
	for _, w := range []string{"+16.7 %", "−10.0 %", "missing in this run", "compared with " + base} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, out.String())
		}
	}
}

func TestCompareFailDropDetectsARatioDrop(t *testing.T) {
	dir := t.TempDir()
	base := savedRun(t, dir, "base", 6, 900, false)
	drop := savedRun(t, dir, "drop", 6, 750, false) // NOOP ×0.9 → ×0.75: −16.7 %
	ok := savedRun(t, dir, "ok", 6, 780, false)     // −13.3 %: within 15 %
	c, code, stderr := compareJSON(t, "--from", drop, "--compare", base, "--fail-drop", "15")
	if code != exitRegression || len(c.Regressions) != 1 || c.Regressions[0] != "shm.noop_vs_echo" || !strings.Contains(stderr, "shm.noop_vs_echo") {
		t.Errorf("drop: exit %d, regressions %v, stderr %q", code, c.Regressions, stderr)
	}
	// A throughput drop alone (the NOOP rate) is reported, not checked.
	for _, f := range c.Figures {
		if f.Name == "shm.noop_round_trips_per_s" && (f.ChangePercent == nil || *f.ChangePercent > -16) {
			t.Errorf("throughput change: %+v", f)
		}
	}
	if c, code, stderr := compareJSON(t, "--from", ok, "--compare", base, "--fail-drop", "15"); code != 0 || len(c.Regressions) != 0 {
		t.Errorf("within 15 %%: exit %d, regressions %v, stderr %q", code, c.Regressions, stderr)
	}
	// A ratio the baseline has and this run lacks fails the check too.
	withPickle := savedRun(t, dir, "pickle", 6, 900, true)
	if c, code, _ := compareJSON(t, "--from", base, "--compare", withPickle, "--fail-drop", "15"); code != exitRegression || len(c.Regressions) != 4 {
		t.Errorf("missing ratios: exit %d, regressions %v", code, c.Regressions)
	}
}

func TestCompareRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	good := savedRun(t, dir, "good", 6, 900, false)
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	huge := make([]byte, maxSavedBytes+10)
	copy(huge, `{"schema": 1, "notes": ["`)
	for i := 26; i < len(huge)-3; i++ {
		huge[i] = 'a'
	}
	copy(huge[len(huge)-3:], `"]}`)
	goodBytes, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		path string
		want string
	}{
		"malformed":     {write("bad.json", []byte(`{"schema": 1, "shm": {`)), "not a kvdock bench --json result"},
		"wrong type":    {write("type.json", []byte(`{"schema": "one"}`)), "not a kvdock bench --json result"},
		"not an object": {write("arr.json", []byte(`[1, 2]`)), "not a kvdock bench --json result"},
		"trailing":      {write("two.json", append(append([]byte{}, goodBytes...), goodBytes...)), "data after the JSON object"},
		"schema":        {write("schema.json", []byte(`{"schema": 7, "shm": {"mode": "shm"}}`)), "schema 7, want 1"},
		"empty run":     {write("empty.json", []byte(`{"schema": 1}`)), "no SHM, pickle or tier figures"},
		"huge":          {write("huge.json", huge), "larger than 4 MiB"},
		"absent":        {filepath.Join(dir, "nope.json"), "no such file"},
		"directory":     {dir, "not a regular file"},
		"device":        {os.DevNull, "not a regular file"},
		"fifo":          {fifo(t, dir), "not a regular file"},
	}
	for name, tc := range cases {
		for _, args := range [][]string{{"--compare", tc.path}, {"--compare", good, "--from", tc.path}} {
			var out, errb bytes.Buffer
			code := run(args, &out, &errb, nil, false)
			if code != 2 || !strings.Contains(errb.String(), tc.want) || out.Len() != 0 {
				t.Errorf("%s %q: exit %d, stderr %q, want 2 and %q", name, args, code, errb.String(), tc.want)
			}
		}
	}
	for _, args := range [][]string{{"--from", good}, {"--fail-drop", "15"}, {"--compare", good, "--fail-drop", "-1"}, {"--compare", good, "--fail-drop", "NaN"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb, nil, false); code != 2 {
			t.Errorf("%q: exit %d, stderr %q", args, code, errb.String())
		}
	}
}

// fifo makes a named pipe nobody writes to: reading it would block forever.
func fifo(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "pipe.json")
	if err := unix.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCompareUnderStoreFigures: the small-request ratios under a store
// stream are compared when this run has them; a baseline without them (taken
// before they existed) lists them as missing there, not as a regression.
func TestCompareUnderStoreFigures(t *testing.T) {
	cur := &Result{SHM: &ModeResult{Mode: "shm", ReferenceName: "memcpy_segment", NoopLoadedRTPS: 900, NoopLoadedRatio: 0.9,
		LookupLoadedRTPS: 400, LookupLoadedRatio: 0.7}}
	base := &Result{SHM: &ModeResult{Mode: "shm", ReferenceName: "memcpy_segment"}}
	c := compareRuns(cur, base, "base.json", 15)
	got := map[string]FigureChange{}
	for _, f := range c.Figures {
		got[f.Name] = f
	}
	for _, n := range []string{"shm.noop_under_store_vs_echo_under_stream", "shm.lookup_status_under_store_vs_echo_under_stream"} {
		if f, ok := got[n]; !ok || f.Missing != "baseline" {
			t.Errorf("%s: %+v (present %v), want missing in baseline", n, f, ok)
		}
	}
	if len(c.Regressions) != 0 {
		t.Errorf("figures new in this run counted as regressions: %v", c.Regressions)
	}
	// The other way round (dropped from this run) they are regressions.
	c = compareRuns(base, cur, "base.json", 15)
	if len(c.Regressions) != 2 {
		t.Errorf("regressions %v, want the two under-store ratios", c.Regressions)
	}
}
