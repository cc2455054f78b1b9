package torchpickle

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

var updateCorpus = flag.Bool("update-corpus", false, "rewrite testdata/fuzz/FuzzDecode seeds from the fixtures and hostile samples")

const corpusDir = "testdata/fuzz/FuzzDecode"

// seedInputs are the committed seeds: every fixture pickle and every hostile sample.
func seedInputs(t testing.TB) map[string][]byte {
	seeds := map[string][]byte{}
	fs, err := filepath.Glob(filepath.Join("testdata", "fixtures", "*.pkl"))
	if err != nil || len(fs) == 0 {
		t.Fatalf("no fixtures (%v)", err)
	}
	for _, f := range fs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		seeds["fixture_"+strings.TrimSuffix(filepath.Base(f), ".pkl")] = b
	}
	for i, p := range payloads("/nonexistent/kvdock-fuzz-marker") {
		seeds["hostile_"+strconv.Itoa(i)] = p.data
	}
	data := make([]byte, 64)
	seeds["hostile_huge_numel"] = tensorPickle(container("FloatStorage", 1<<60, 1<<60, data), 0, []int64{4}, []int64{1})
	seeds["hostile_expand"] = tensorPickle(container("FloatStorage", 16, 16, data), 0, []int64{1 << 40}, []int64{0})
	seeds["strided_view"] = tensorPickle(container("FloatStorage", 16, 16, data), 1, []int64{3, 2}, []int64{2, 5})
	return seeds
}

func corpusFile(b []byte) []byte {
	return []byte("go test fuzz v1\n[]byte(" + strconv.Quote(string(b)) + ")\n")
}

// TestFuzzSeedCorpus keeps the committed corpus in step with the fixtures.
func TestFuzzSeedCorpus(t *testing.T) {
	seeds := seedInputs(t)
	names := make([]string, 0, len(seeds))
	for n := range seeds {
		names = append(names, n)
	}
	sort.Strings(names)
	if *updateCorpus {
		if err := os.MkdirAll(corpusDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			writeFile(t, filepath.Join(corpusDir, n), corpusFile(seeds[n]))
		}
	}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(corpusDir, n))
		if err != nil {
			t.Errorf("seed %s missing (run go test -run TestFuzzSeedCorpus -update-corpus): %v", n, err)
			continue
		}
		if !bytes.Equal(b, corpusFile(seeds[n])) {
			t.Errorf("seed %s out of date (run go test -run TestFuzzSeedCorpus -update-corpus)", n)
		}
	}
}

// FuzzDecode: Decode never panics; what it accepts is well formed and
// survives an encode/decode round trip unchanged.
func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		ts, err := Decode(data, Limits{})
		if err != nil {
			return
		}
		for i, x := range ts {
			es, err := ElementSize(x.Dtype)
			if err != nil {
				t.Fatalf("tensor %d: decoded unknown dtype %q", i, x.Dtype)
			}
			n := es
			for _, d := range x.Shape {
				if d < 0 {
					t.Fatalf("tensor %d: negative dim in %v", i, x.Shape)
				}
				n *= d
			}
			if n != len(x.Data) {
				t.Fatalf("tensor %d: %d bytes for shape %v of %s", i, len(x.Data), x.Shape, x.Dtype)
			}
		}
		enc, err := AppendEncode(nil, ts)
		if err != nil {
			t.Fatalf("re-encoding decoded tensors: %v", err)
		}
		back, err := Decode(enc, Limits{})
		if err != nil {
			t.Fatalf("decoding re-encoded tensors: %v", err)
		}
		if len(back) != len(ts) {
			t.Fatalf("round trip: %d tensors, want %d", len(back), len(ts))
		}
		for i := range ts {
			if back[i].Dtype != ts[i].Dtype || !equalShape(back[i].Shape, ts[i].Shape) || !bytes.Equal(back[i].Data, ts[i].Data) {
				t.Fatalf("round trip changed tensor %d", i)
			}
		}
	})
}
