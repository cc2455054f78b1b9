package bench

import (
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// The workers' gap is the longest time without an answer after the
// signal; the windows are the second before the signal and the second from
// the answer that ended the gap; a lookup lost at the signal is a failure.
func TestRestartSummary(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sig := t0.Add(2 * time.Second)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var all []restartSample
	// Every 10 ms before the signal: all 4 chunks hit.
	for ms := 0; ms < 2000; ms += 10 {
		all = append(all, restartSample{sent: at(ms - 5), done: at(ms), requested: 4, hit: 4})
	}
	all = append(all,
		restartSample{sent: at(1995), done: at(4000), requested: 4, failed: true, err: "no reply"},
		restartSample{sent: at(1998), done: at(2000), requested: 4, hit: 4},
		restartSample{sent: at(2005), done: at(2350), requested: 4, hit: 3})
	// Then every 10 ms: 3 of 4 chunks hit, one with 2 chunks wrong.
	for ms := 2360; ms <= 4000; ms += 10 {
		all = append(all, restartSample{sent: at(ms - 5), done: at(ms), requested: 4, hit: 3, mismatches: int64(btoi(ms == 3600) * 2)})
	}
	sortSamples(all)
	r := summarize(all, sig)
	if r.GapMs != 350 {
		t.Fatalf("gap %.1f ms, want 350", r.GapMs)
	}
	if r.Before.Lookups != 100 || r.Before.HitRatio != 1 {
		t.Fatalf("before %+v: want 100 lookups, ratio 1", r.Before)
	}
	if r.After.Lookups != 100 || r.After.HitRatio != 0.75 {
		t.Fatalf("after %+v: want 100 lookups (2350..3340 ms), ratio 0.75", r.After)
	}
	if r.Failed != 1 || r.Mismatches != 2 || r.FirstError != "no reply" {
		t.Fatalf("failed %d mismatches %d first %q", r.Failed, r.Mismatches, r.FirstError)
	}
	var out bytes.Buffer
	res := &RestartResult{Mode: "shm", Restarts: []RestartRun{*r}}
	if err := res.WriteTable(&out); err != nil || !strings.Contains(out.String(), "350.0") {
		t.Fatalf("table %v:\n%s", err, out.String())
	}
	// The probe's hole: answers every ms until 3 ms after the signal,
	// timeouts, then answers again from 2290 ms.
	var probes []restartSample
	for ms := 1000; ms < 2400; ms++ {
		down := ms > 2003 && ms < 2290
		probes = append(probes, restartSample{sent: at(ms), done: at(ms), failed: down})
	}
	if h, end := longestHole(probes, sig); h != 287 || !end.Equal(at(2290)) {
		t.Fatalf("probe hole %.1f ms, want 287", h)
	}
	if r := summarize(all[:201], sig); r.GapMs != 0 || r.After.Lookups != 0 {
		t.Fatalf("nothing after the signal: %+v", r)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestRestartFlags(t *testing.T) {
	o, code := parseFlags([]string{"--restart"}, io.Discard, nil)
	if code != -1 || !o.Restart || o.Mode != "shm" || o.Timeout != 2*time.Second {
		t.Fatalf("--restart: code %d, restart %v, mode %q, timeout %v", code, o.Restart, o.Mode, o.Timeout)
	}
	if o, code := parseFlags([]string{"--restart", "--restart-objects", "1000,16000,64000"}, io.Discard, nil); code != -1 || !slices.Equal(o.RestartObjects, []int{1000, 16000, 64000}) {
		t.Fatalf("--restart-objects: code %d, sizes %v", code, o.RestartObjects)
	}
	for name, args := range map[string][]string{
		"objects without restart": {"--restart-objects", "1000"},
		"objects with prompts":    {"--restart", "--restart-objects", "1000", "--prompts", "4"},
		"objects zero":            {"--restart", "--restart-objects", "0"},
		"both":                    {"--restart", "--mode", "both"},
		"host":                    {"--restart", "--host", "127.0.0.1", "--port", "5555"},
		"child":                   {"--restart", "--server-process"},
	} {
		var errb bytes.Buffer
		if _, code := parseFlags(args, &errb, nil); code != 2 || !strings.Contains(errb.String(), "--restart") {
			t.Errorf("%s: exit %d, stderr %q", name, code, errb.String())
		}
	}
}
