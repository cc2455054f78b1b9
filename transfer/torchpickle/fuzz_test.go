package torchpickle

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"slices"
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
	seeds["bomb_container_refs"] = pb{}.op(opPROTO, 4, opEMPTY_LIST).stackGlobal("torch.storage", "_load_from_bytes").
		bytes(cpuBombContainer(40, 100)).op(opTUPLE1, opREDUCE, opPOP, opSTOP)
	for name, b := range memoryBombs(8 << 10) {
		seeds["bomb_"+strings.ReplaceAll(name, " ", "_")] = b
	}
	seeds["bomb_unit_dims"] = sharedTensors(2, 64, []int64{32, 1, 1, 1, 1, 1, 1}, []int64{2, 1, 1, 1, 1, 1, 1})
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

// Bounds FuzzDecode holds every decode to, written out here rather than taken
// from the package so that a change of the defaults has to change them too.
// allocPerByte covers boxing a value per opcode (up to 24 bytes for 2 input
// bytes), the retained items (16 bytes per 16 input bytes, plus their maps'
// growth) and copies (2 bytes per input byte); the constants cover
// itemsBase (16384 slots) and the decoder's fixed state.
const (
	fuzzWorkPerByte  = 8
	fuzzWorkBase     = 65536
	fuzzAllocPerByte = 16
	fuzzAllocBase    = 1 << 20
	// A second decode runs with small constants (tightLimits), so the
	// proportional part of the bound is exercised on small inputs too.
	fuzzTightAllocBase = 32 << 10
)

func tightLimits(n int) Limits {
	return Limits{MaxWork: fuzzWorkPerByte*int64(n) + 1024, MaxItems: int64(n)/16 + 256}
}

// decodeMeasured decodes and reports the bytes the decode allocated.
func decodeMeasured(data []byte, lim Limits) ([]Tensor, usage, uint64, error) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	ts, u, err := decode(data, lim)
	runtime.ReadMemStats(&after)
	return ts, u, after.TotalAlloc - before.TotalAlloc, err
}

// checkCost fails when a decode of data took more work, retained more items
// or allocated more bytes than its bounds allow.
func checkCost(t *testing.T, data []byte, u usage, alloc, allocBase uint64) {
	t.Helper()
	n := int64(len(data))
	if u.work > u.maxWork || u.work > fuzzWorkPerByte*n+fuzzWorkBase {
		t.Fatalf("%d input bytes: %d steps of work (budget %d)", n, u.work, u.maxWork)
	}
	if u.items > u.maxItems || u.items > n/16+16384 {
		t.Fatalf("%d input bytes: %d items retained (budget %d)", n, u.items, u.maxItems)
	}
	if limit := fuzzAllocPerByte*uint64(n) + allocBase; alloc > limit {
		t.Fatalf("%d input bytes: %d bytes allocated, bound %d", n, alloc, limit)
	}
}

// FuzzDecode: Decode never panics, stays within its work, item and
// allocation bounds, and what it accepts is well formed and survives an
// encode/decode round trip unchanged.
func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		_, u, alloc, _ := decodeMeasured(data, tightLimits(len(data)))
		checkCost(t, data, u, alloc, fuzzTightAllocBase)
		ts, u, alloc, err := decodeMeasured(data, Limits{})
		checkCost(t, data, u, alloc, fuzzAllocBase)
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
			if back[i].Dtype != ts[i].Dtype || !slices.Equal(back[i].Shape, ts[i].Shape) || !bytes.Equal(back[i].Data, ts[i].Data) {
				t.Fatalf("round trip changed tensor %d", i)
			}
		}
	})
}
