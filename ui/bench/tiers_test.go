package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvdock/core/testkit/redisserver"
)

// tierArgs is a tiny SHM run with 1 MiB chunks (4 layers × hidden 256,
// bfloat16), two prompts of four chunks, kept short for -race.
var tierArgs = []string{"--layers", "4", "--hidden", "256", "--dtype", "bfloat16", "--mode", "shm",
	"--rounds", "1", "--prompts", "2", "--repeat", "0", "--small-duration", "200ms",
	"--ref-duration", "100ms", "--pool-gb", "0.0625", "--timeout", "20s", "--json"}

// runTierBench runs the bench with the adapters and returns its result.
func runTierBench(t *testing.T, adapters ...string) Result {
	t.Helper()
	args := append([]string(nil), tierArgs...)
	for _, a := range adapters {
		args = append(args, "--l2-adapter", a)
	}
	var out, errb bytes.Buffer
	if code := run(args, &out, &errb, nil, false); code != 0 {
		t.Fatalf("exit %d, stderr:\n%s\nstdout:\n%s", code, errb.String(), out.String())
	}
	var res Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("JSON does not parse: %v\n%s", err, out.String())
	}
	return res
}

// checkTier asserts one tier's figures are present and sane (not the
// targets: the machine is shared) and that each has its target.
func checkTier(t *testing.T, res Result, i int, typ string) {
	t.Helper()
	if len(res.Tiers) <= i {
		t.Fatalf("%d tiers in the result, want tier %d", len(res.Tiers), i)
	}
	tr := res.Tiers[i]
	if tr.Type != typ || tr.Target == "" || tr.Reference == "" {
		t.Errorf("tier %d: type %q target %q reference %q", i, tr.Type, tr.Target, tr.Reference)
	}
	stored := int64(2 * 4 << 20) // two prompts of four 1 MiB chunks, no shared prefix
	if tr.WriteBytes < stored || tr.ReadBytes < stored || tr.DroppedWrites != 0 || tr.ReadMisses != 0 {
		t.Errorf("tier %d: wrote %d read %d bytes (want ≥ %d each), %d writes dropped, %d chunks missed",
			i, tr.WriteBytes, tr.ReadBytes, stored, tr.DroppedWrites, tr.ReadMisses)
	}
	if tr.Mismatches != 0 || tr.Errors != 0 {
		t.Errorf("tier %d: %d mismatches, %d errors (%s)", i, tr.Mismatches, tr.Errors, tr.FirstError)
	}
	for name, v := range map[string]float64{
		"write GB/s": tr.WriteGBps, "read GB/s": tr.ReadGBps, "reference write GB/s": tr.RefWriteGBps,
		"reference read GB/s": tr.RefReadGBps, "NOOP rt/s": tr.NoopRTPS, "NOOP rt/s without tier": tr.NoopNoTierRTPS,
		"LOOKUP rt/s": tr.LookupRTPS, "LOOKUP rt/s without tier": tr.LookupNoTierRTPS,
		"write ratio": tr.WriteRatio, "read ratio": tr.ReadRatio, "NOOP ratio": tr.NoopRatio, "LOOKUP ratio": tr.LookupRatio,
	} {
		if !(v > 0) || v > 1e9 {
			t.Errorf("tier %d: %s = %v, want a positive figure", i, name, v)
		}
	}
	// The prefetch-read stops when the status reports the chunks in L1;
	// the end-to-end rate adds the retrieves, so it is never faster.
	if !(tr.ReadRetrieveGBps > 0) || tr.ReadRetrieveGBps > tr.ReadGBps {
		t.Errorf("tier %d: prefetch-read %v GB/s, with the retrieves %v GB/s", i, tr.ReadGBps, tr.ReadRetrieveGBps)
	}
	if r := tr.WriteGBps / tr.RefWriteGBps; r < tr.WriteRatio*0.99 || r > tr.WriteRatio*1.01 {
		t.Errorf("tier %d: write ratio %v is not %v / %v", i, tr.WriteRatio, tr.WriteGBps, tr.RefWriteGBps)
	}
	prefix := fmt.Sprintf("tier%d.%s.", i, typ)
	var names []string
	for _, tg := range res.Targets {
		if strings.HasPrefix(tg.Name, prefix) {
			names = append(names, tg.Name)
			if tg.Value <= 0 {
				t.Errorf("target %s: value %v", tg.Name, tg.Value)
			}
		}
	}
	if len(names) != 4 {
		t.Errorf("tier %d: targets %v, want write, prefetch read, NOOP and LOOKUP", i, names)
	}
}

func TestTierFiguresFS(t *testing.T) {
	dir := t.TempDir()
	res := runTierBench(t, fmt.Sprintf(`{"type": "fs", "base_path": %q}`, dir))
	checkTier(t, res, 0, "fs")
	// The file reference cleaned up after itself; the tier's chunks stay.
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".kvdock-bench-ref-") {
			t.Errorf("reference file left behind: %s", filepath.Join(dir, e.Name()))
		}
	}
}

func TestTierFiguresRESP(t *testing.T) {
	srv := redisserver.Start(t, redisserver.Options{})
	res := runTierBench(t, fmt.Sprintf(`{"type": "resp", "host": "127.0.0.1", "port": %d}`, srv.Port))
	checkTier(t, res, 0, "resp")
	// The reference's keys are gone again.
	if n, err := srv.Do(t.Context(), "EVAL", "return #redis.call('KEYS', 'kvdock-bench-ref:*')", "0"); err != nil || n != "0" {
		t.Errorf("reference keys left on the server: %q, %v", n, err)
	}
}

func TestTierFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--l2-adapter", `{"type": "fs", "base_pat": "/tmp/x"}`}, "base_pat"},
		{[]string{"--l2-adapter", `{"type": "nvme"}`}, "nvme"},
		{[]string{"--l2-adapter", `not json`}, "--l2-adapter"},
		{[]string{"--host", "127.0.0.1", "--port", "5555", "--l2-adapter", `{"type": "fs", "base_path": "/tmp/x"}`}, "only for the in-process engine"},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb, nil, false); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
