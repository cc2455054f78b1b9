package bench

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"
)

// The gap is the longest time without an answer after the signal; the
// windows are the second before the signal and the second after the
// answer that ended the gap; failures and mismatches count whenever.
func TestRestartSummary(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sig := t0.Add(2 * time.Second)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var all []restartSample
	// Every 10 ms until 20 ms after the signal: all 4 chunks hit.
	for ms := 0; ms <= 2020; ms += 10 {
		all = append(all, restartSample{done: at(ms), requested: 4, hit: 4})
	}
	// A 350 ms hole, then answers every 10 ms: 3 of 4 chunks hit.
	for ms := 2370; ms <= 4000; ms += 10 {
		all = append(all, restartSample{done: at(ms), requested: 4, hit: 3})
	}
	all = append(all, restartSample{done: at(3500), requested: 4, failed: true, err: "no reply"},
		restartSample{done: at(3600), requested: 4, hit: 4, mismatches: 2})
	sortSamples(all)
	r := summarize(all, sig)
	if r.GapMs != 350 {
		t.Fatalf("gap %.1f ms, want 350", r.GapMs)
	}
	if r.Before.Lookups != 100 || r.Before.HitRatio != 1 {
		t.Fatalf("before %+v: want 100 lookups, ratio 1", r.Before)
	}
	if r.After.Lookups != 100 || r.After.HitRatio != 0.75 {
		t.Fatalf("after %+v: want 100 lookups (2370..3360 ms), ratio 0.75", r.After)
	}
	if r.Failed != 1 || r.Mismatches != 2 || r.FirstError != "no reply" {
		t.Fatalf("failed %d mismatches %d first %q", r.Failed, r.Mismatches, r.FirstError)
	}
	var out bytes.Buffer
	res := &RestartResult{Mode: "shm", Restarts: []RestartRun{*r}}
	if err := res.WriteTable(&out); err != nil || !strings.Contains(out.String(), "350.0") {
		t.Fatalf("table %v:\n%s", err, out.String())
	}
}

func TestRestartFlags(t *testing.T) {
	o, code := parseFlags([]string{"--restart"}, io.Discard, nil)
	if code != -1 || !o.Restart || o.Mode != "shm" {
		t.Fatalf("--restart: code %d, restart %v, mode %q", code, o.Restart, o.Mode)
	}
	for name, args := range map[string][]string{
		"both":  {"--restart", "--mode", "both"},
		"host":  {"--restart", "--host", "127.0.0.1", "--port", "5555"},
		"child": {"--restart", "--server-process"},
	} {
		var errb bytes.Buffer
		if _, code := parseFlags(args, &errb, nil); code != 2 || !strings.Contains(errb.String(), "--restart") {
			t.Errorf("%s: exit %d, stderr %q", name, code, errb.String())
		}
	}
}
